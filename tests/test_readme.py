"""README.md's promises: every Python block runs as pasted, in order, and its test command is CI's."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

from ddbloader import DDBDataLoader

pytestmark = pytest.mark.timeout(300)

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")


def fenced(language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```$", README, flags=re.MULTILINE | re.DOTALL)


#: README's Python blocks, in order: each runs in a fresh interpreter in one folder shared in order
BLOCKS = fenced("python")
#: a first line naming its launcher: ``# train.py — run with: torchrun --nproc_per_node=2 train.py``
SCRIPT = re.compile(r"^# (\w+\.py) — run with: torchrun --nproc_per_node=(\d+) \1$")
NAMED = re.compile(r"^# (\w+\.py) — ")


class Folder:
    """An empty folder (after README's first command) in which README's blocks run in order."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.outputs: dict[int, str] = {}

    def output(self, index: int) -> str:
        """Block ``index``'s stdout, after running it and every block before it (once each)."""
        for earlier in range(index + 1):
            if earlier not in self.outputs:
                self.outputs[earlier] = self.run(BLOCKS[earlier])
        return self.outputs[index]

    def run(self, block: str) -> str:
        first = block.splitlines()[0]
        if first.startswith("# needs "):
            return ""  # a block that needs an outside server (its test skips, naming it)
        command = [sys.executable, "-c", block]
        if named := NAMED.match(first):
            (self.path / named[1]).write_text(block, encoding="utf-8")
            command = [sys.executable, named[1]]
        if launched := SCRIPT.match(first):
            command = [
                sys.executable,
                "-m",
                "torch.distributed.run",
                f"--nproc_per_node={launched[2]}",
                launched[1],
            ]
        env = {**os.environ, "PYTHONWARNINGS": "ignore"}
        done = subprocess.run(
            command, cwd=self.path, env=env, capture_output=True, text=True, timeout=240, check=False
        )
        assert done.returncode == 0, f"{first}\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
        return done.stdout


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Folder:
    return Folder(tmp_path_factory.mktemp("readme"))


@pytest.mark.parametrize("index", range(len(BLOCKS)), ids=[f"block{i}" for i in range(len(BLOCKS))])
def test_every_python_block_runs_as_pasted(folder: Folder, index: int) -> None:
    """Blocks needing an outside server say so in their first line (``# needs ...``), and only they skip."""
    first = BLOCKS[index].splitlines()[0]
    if first.startswith("# needs "):
        assert any(server in first for server in ("Spark", "PostgreSQL", "DolphinDB")), first
        pytest.skip(first[2:])
    folder.output(index)


def test_the_blocks_cover_every_launch_and_a_duckdb_file_made_first() -> None:
    firsts = [block.splitlines()[0] for block in BLOCKS]
    assert sum(bool(SCRIPT.match(line)) for line in firsts) == 1, "the DDP block runs under torchrun"
    assert "--nproc_per_node=2" in next(line for line in firsts if SCRIPT.match(line))
    makes = next(i for i, block in enumerate(BLOCKS) if 'duckdb.connect("market.duckdb")' in block)
    assert all('"market.duckdb"' not in block for block in BLOCKS[:makes])
    assert sum(line.startswith("# needs ") for line in firsts) == 1, "only the Spark block needs a server"


def test_the_example_learns(folder: Folder) -> None:
    example = BLOCKS[0]
    assert "from_arrow" in example  # the self-contained one: it makes its own table
    losses = [float(v) for v in re.findall(r"last loss (\S+)", folder.output(0))]
    assert len(losses) == 3, folder.output(0)
    assert losses[-1] < 0.05, "the model learns the linear target"


def test_the_ddp_block_trains_every_epoch_on_two_ranks(folder: Folder) -> None:
    index = next(i for i, block in enumerate(BLOCKS) if SCRIPT.match(block.splitlines()[0]))
    output = folder.output(index)
    assert re.findall(r"epoch (\d): (\d+) batches a rank", output)[-1][0] == "2", output
    single = next(i for i, block in enumerate(BLOCKS) if "print(len(loader))" in block)
    batches = int(folder.output(single).strip().splitlines()[-1])
    per_rank = int(re.findall(r"epoch \d: (\d+) batches a rank", output)[0])
    assert abs(2 * per_rank - batches) <= 1, "each of the 2 ranks takes half the batches"


def test_the_resume_script_goes_on_from_its_checkpoint(folder: Folder) -> None:
    index = next(i for i, block in enumerate(BLOCKS) if block.startswith("# resume.py"))
    first = folder.output(index)
    assert "resuming" not in first, "the first run starts afresh"
    assert (folder.path / "checkpoint.pt").exists()
    again = folder.run(BLOCKS[index])
    assert re.search(r"resuming epoch 2 after batch \d+", again), again


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


def test_the_stateful_dataloader_block_serves_the_rest_of_the_epoch(folder: Folder) -> None:
    index = next(i for i, block in enumerate(BLOCKS) if "StatefulDataLoader(" in block)
    left, total = map(
        int, re.findall(r"resumed: (\d+) of (\d+) batches left after 10", folder.output(index))[0]
    )
    assert left == total - 10


def test_the_elastic_resume_block_splits_the_rest_among_three_ranks(folder: Folder) -> None:
    """The Resuming section's example: two ranks stop, three resume, every sample once."""
    index = next(i for i, block in enumerate(BLOCKS) if "ranks(3)" in block)
    left = [int(v) for v in re.findall(r"rank \d: (\d+) batches left", folder.output(index))]
    assert len(left) == 3 and len(set(left)) == 1, folder.output(index)
