"""Every benchmark runs: its ``--smoke`` mode in a subprocess, its results rendered, its imports.

A benchmark that no longer runs against the current code fails here, in the suite CI runs, not
weeks later on a quiet machine. PostgreSQL and Spark come from the suite's session servers
(``BENCH_POSTGRESQL_URI`` / ``BENCH_SPARK_URI``), so a missing server skips as the suite's own
server tests do.
"""

from __future__ import annotations

import ast
import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BENCHMARKS = REPO / "benchmarks"
#: the shared modules and the scripts that are no benchmark of a question (digests: a test of
#: their own; gpu_check: needs a GPU)
NOT_BENCHMARKS = {"harness", "render", "digests", "gpu_check"}
SCRIPTS = sorted(p.stem for p in BENCHMARKS.glob("*.py") if p.stem not in NOT_BENCHMARKS)
SERVERS = {"fingerprint": ["pg_server"], "scale": ["pg_server"], "spark": ["spark_server"]}

# A test waits up to 300 s for its benchmark's subprocess: the suite's 120 s would cut it short
# on a loaded machine, where a run against a commit takes longer than 120 s.
pytestmark = pytest.mark.timeout(330)

sys.path.insert(0, str(BENCHMARKS))
import harness  # noqa: E402
import render  # noqa: E402


def _section(page: str, name: str) -> str:
    """The body of the page's section whose heading names ``name.py``."""
    for part in page.split("\n## ")[1:]:
        heading, _, body = part.partition("\n")
        if heading.endswith(f"(`{name}.py`)"):
            return body
    raise AssertionError(f"no section for {name}.py")


def _env(request: pytest.FixtureRequest, name: str) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    for fixture in SERVERS.get(name, []):
        uri = request.getfixturevalue(fixture).uri
        env["BENCH_POSTGRESQL_URI" if fixture == "pg_server" else "BENCH_SPARK_URI"] = uri
    return env


@pytest.mark.parametrize("name", SCRIPTS)
def test_smoke_run_writes_results_that_render(
    name: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    command = [sys.executable, str(BENCHMARKS / f"{name}.py"), "--smoke", "--out", str(tmp_path)]
    done = subprocess.run(
        command, env=_env(request, name), capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr[-4000:]
    document = json.loads((tmp_path / f"{name}.json").read_text())
    assert document["smoke"] is True and document["benchmark"] == name
    assert document.get("skipped", []) == [], f"{name} skipped {document['skipped']} though the servers run"
    rows = document["rows"]
    assert rows and all(isinstance(row["contender"], str) for row in rows)
    for row in rows:  # medians of real runs: every figure a number that is not negative
        numbers = {k: v for k, v in row.items() if k != "contender" and v is not None}
        assert all(
            isinstance(v, int | float) and v >= 0 for k, v in numbers.items() if not k.endswith("rho")
        ), row
    with open(tmp_path / f"{name}.csv", newline="") as f:
        assert [r["contender"] for r in csv.DictReader(f)] == [r["contender"] for r in rows]
    page = render.render(tmp_path, BENCHMARKS / "LOG.md", smoke=True)
    section = _section(page, name)
    assert "A smoke run" in section and f"| {rows[0]['contender']} |" in section


def test_a_contender_runs_in_a_fresh_interpreter() -> None:
    shape = harness.SERIES_SMOKE
    params = {"shape": [shape.symbols, shape.days, shape.rows, shape.factors], "window": 8, "epochs": 1}
    result = harness.child(str(BENCHMARKS / "throughput.py"), "floor", params)
    assert result["samples"] == shape.windows(8)
    assert result["peak_rss_mb"] > 0


def test_without_results_the_page_shows_the_log_labelled(tmp_path: Path) -> None:
    page = render.render(tmp_path, BENCHMARKS / "LOG.md")
    for name in render.ORDER:
        section = _section(page, name)
        recorded = "**Last recorded figures, 20" in section and "`benchmarks/LOG.md`" in section
        assert recorded or f"No figures yet: run `python benchmarks/{name}.py`" in section, name


def test_every_benchmark_is_rendered_and_documented() -> None:
    assert sorted(render.ORDER) == SCRIPTS
    readme = (BENCHMARKS / "README.md").read_text()
    assert all(f"`{name}.py`" in readme for name in SCRIPTS)


@pytest.mark.parametrize("name", [*SCRIPTS, "harness", "render"])
def test_imports_only_the_harness_and_public_ddbloader(name: str) -> None:
    tree = ast.parse((BENCHMARKS / f"{name}.py").read_text())
    modules = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    modules += [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    others = {p.stem for p in BENCHMARKS.glob("*.py")} - {"harness"}
    assert not [m for m in modules if m.split(".")[0] in others], "a benchmark imports another"
    private = [
        m for m in modules if m.startswith("ddbloader") and any(p.startswith("_") for p in m.split("."))
    ]
    assert not private, f"private ddbloader modules: {private}"


def test_the_gil_profile_sums_samples_per_batch_by_thread_and_innermost_ddbloader_frame(
    tmp_path: Path,
) -> None:
    import loop

    raw = tmp_path / "raw.txt"
    raw.write_text(
        "thread (1): MainThread;<module> (loop.py:9);_step (loop.py:50) 300\n"
        "thread (1): MainThread;feed (loop.py:9);EpochIterator.__next__ (ddbloader/_pipeline/epoch.py:3) 20\n"
        "thread (7): ddbloader-assemble;run (ddbloader/_pipeline/epoch.py:1);"
        "gather (ddbloader/_pipeline/batch.py:5);copyto (numpy/core.py:2) 40\n"
        "thread (8): ddbloader-fetch-2;fetch (ddbloader/_io/fetch.py:4);Queue.get (queue.py:3) 10\n"
        "thread (7): ddbloader-assemble;run (ddbloader/_pipeline/epoch.py:1);"
        "gather (ddbloader/_pipeline/batch.py:9) 20\n"
    )
    # the step held the GIL 0.3 s in 300 samples: 1000 a second; over 100 batches one sample is
    # 0.01 ms of a batch
    page = loop.profile_table(str(raw), batches=100, held_s=0.3)
    assert "| MainThread | 3.200 | 320 |" in page
    assert "| ddbloader-assemble | 0.600 | 60 |" in page
    assert "| ddbloader-fetch | 0.100 | 10 |" in page  # a pool's threads are one row
    assert "| ddbloader-assemble | `gather (ddbloader/_pipeline/batch.py)` | 0.600 | 60 |" in page
    assert "| MainThread | `EpochIterator.__next__ (ddbloader/_pipeline/epoch.py)` | 0.200 | 20 |" in page
    assert "_step" not in page.split("Innermost")[1]  # the loop's own step is no loader frame
    assert "| ddbloader-assemble | `copyto (numpy/core.py)` | 0.400 | 40 |" in page
    # a sampler that took half its samples: the same milliseconds
    raw.write_text(raw.read_text().replace(" 300\n", " 150\n").replace(" 40\n", " 20\n"))
    page = loop.profile_table(str(raw), batches=100, held_s=0.3)
    assert "| ddbloader-assemble | `copyto (numpy/core.py)` | 0.400 | 20 |" in page


def test_the_loop_benchmark_profiles_the_loaders_threads(tmp_path: Path) -> None:
    import shutil

    if shutil.which("py-spy") is None:
        pytest.skip("py-spy is not installed (pip install py-spy)")
    out = tmp_path / "profile.md"
    command = [sys.executable, str(BENCHMARKS / "loop.py"), "--smoke", "--out", str(tmp_path)]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [*command, "--profile", str(out)], env=env, capture_output=True, text=True, timeout=300, check=False
    )
    if done.returncode and "py-spy wrote no profile" in done.stderr and "ermission" in done.stderr:
        pytest.skip("py-spy may not attach to a process here (ptrace is not permitted)")
    assert done.returncode == 0, done.stderr[-4000:]
    page = out.read_text()
    assert "### GIL per batch" in page
    assert "| ddbloader-assemble |" in page


def test_against_a_commit_runs_each_contender_on_both_labelled(tmp_path: Path) -> None:
    script = str(BENCHMARKS / "throughput.py")
    command = [sys.executable, script, "--smoke", "--against", "HEAD", "--against-only", "floor"]
    done = subprocess.run(
        [*command, "--out", str(tmp_path)],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    document = json.loads((tmp_path / "throughput.json").read_text())
    rev = document["against"]
    floors = [r for r in document["rows"] if r["contender"].startswith("floor @")]
    here = [r for r in floors if r["contender"] != f"floor @{rev}"]
    there = [r for r in floors if r["contender"] == f"floor @{rev}"]
    assert len(here) == 1 and len(there) == 1, [r["contender"] for r in document["rows"]]
    assert here[0]["samples"] == there[0]["samples"] > 0
    assert f"floor @{rev} / {here[0]['contender']}: warm_s" in document["ratios"]
    assert (BENCHMARKS / "_work" / f"rev-{rev}" / "ddbloader").is_dir()


def test_a_child_imports_the_ddbloader_of_its_root(tmp_path: Path) -> None:
    (tmp_path / "ddbloader").mkdir()
    (tmp_path / "ddbloader" / "__init__.py").write_text("raise ImportError('the root given')\n")
    shape = harness.SERIES_SMOKE
    params = {"shape": [shape.symbols, shape.days, shape.rows, shape.factors], "window": 8, "epochs": 1}
    with pytest.raises(RuntimeError, match="the root given"):
        harness.child(str(BENCHMARKS / "throughput.py"), "floor", params, root=tmp_path)
