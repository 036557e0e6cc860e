"""README.md's promises: its example runs exactly as written, and its test command is CI's."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import duckdb

from ddbloader import DDBDataLoader

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")


def fenced(language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```$", README, flags=re.MULTILINE | re.DOTALL)


def test_the_first_python_block_runs_as_pasted(tmp_path: Path) -> None:
    """Run in a fresh interpreter in an empty folder, as a user pasting it would."""
    example = fenced("python")[0]
    assert "from_arrow" in example  # the self-contained one: it makes its own table
    command = [sys.executable, "-c", example]
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    losses = [float(v) for v in re.findall(r"last loss (\S+)", done.stdout)]
    assert len(losses) == 3, done.stdout
    assert losses[-1] < 0.05, "the model learns the linear target"


def test_readme_starts_with_the_two_commands_and_ci_runs_the_second_verbatim() -> None:
    first_block = README.split("```bash\n", 1)[1].split("```", 1)[0].splitlines()
    assert README.startswith("# ddbloader\n\n```bash\n")
    assert len(first_block) == 2
    demo, tests = first_block
    assert demo.endswith("python3 -m ddbloader demo")
    assert "pytest" in tests
    ci_lines = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    assert tests in ci_lines
    for command in first_block:
        assert "torch==" not in command, "README's commands keep the torch a user already has"


def test_the_constructors_are_on_the_first_screen() -> None:
    first_screen = "\n".join(README.splitlines()[:100])
    for constructor in ("from_pandas", "from_arrow", "from_parquet"):
        assert constructor in first_screen


def test_the_resuming_section_names_everything_the_state_records() -> None:
    section = README.split("\n## Resuming\n", 1)[1].split("\n## ", 1)[0]
    with duckdb.connect() as con:
        con.execute("CREATE TABLE t AS SELECT i * 1.0 AS y FROM range(4) r(i)")
        with DDBDataLoader(con, "SELECT y, y AS f FROM t", "y", exclude_col="y") as loader:
            state = loader.state_dict()
    for key in state:
        assert (f"`{key}`" if key != "version" else "a version") in section, key


def test_the_elastic_resume_example_runs_as_pasted(tmp_path: Path) -> None:
    """The Resuming section's example: two ranks stop, three resume, every sample once."""
    (example,) = [block for block in fenced("python") if "ranks(3)" in block]
    command = [sys.executable, "-c", example]
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    left = [int(v) for v in re.findall(r"rank \d: (\d+) batches left", done.stdout)]
    assert len(left) == 3 and len(set(left)) == 1, done.stdout
