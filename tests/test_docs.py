"""Every ```python block of README.md and of the site (docs/**/*.md) runs as pasted, page by page.

The blocks of one page run in order, each in a fresh interpreter, in one folder of the page's own,
so a page's first block can make the file its later blocks read. A block whose first line is
``# NAME.py — ...`` is written to ``NAME.py`` and run by name; ``# NAME.py — run with: torchrun
--nproc_per_node=N NAME.py`` runs under torchrun. A block whose first line is ``# needs SERVER``
gets that server from the test fixtures: the harness loads the table the page reads into it and
puts the server's address where the block names its example address (``SERVERS``). A block not
meant to run is fenced as another language (```text).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import duckdb
import pyarrow as pa
import pytest

from ddbloader import DDBDataLoader

pytestmark = pytest.mark.timeout(600)

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```$", flags=re.MULTILINE | re.DOTALL)
SCRIPT = re.compile(r"^# (\w+\.py) — run with: torchrun --nproc_per_node=(\d+) \1$")
NAMED = re.compile(r"^# (\w+\.py) — ")


def python_blocks(page: Path) -> list[str]:
    text = page.read_text(encoding="utf-8")
    return [body for language, body in FENCE.findall(text) if language == "python"]


BLOCKS = [(page, index) for page in PAGES for index in range(len(python_blocks(page)))]


def name(page: Path) -> str:
    return page.relative_to(ROOT).as_posix()


def ticks() -> pa.Table:
    """The table server recipes read: 4 symbols × 3 days × 200 one-second rows of float32."""
    with duckdb.connect() as con:
        return con.sql(
            """
            SELECT 'S' || s AS symbol,
                   TIMESTAMP '2024-01-01 09:30:00' + INTERVAL (d) DAY + INTERVAL (r) SECOND AS ts,
                   sin(s + d * 200 + r)::REAL AS f0, cos(s + d * 200 + r)::REAL AS f1,
                   (0.8 * sin(s + d * 200 + r) - 0.5 * cos(s + d * 200 + r))::REAL AS target
            FROM range(4) a(s), range(3) b(d), range(200) c(r) ORDER BY symbol, ts
            """
        ).to_arrow_table()


def postgresql(request: pytest.FixtureRequest) -> dict[str, str]:
    server = request.getfixturevalue("pg_server")
    from adbc_driver_postgresql import dbapi

    with dbapi.connect(server.uri) as con, con.cursor() as cursor:
        cursor.execute("DROP TABLE IF EXISTS ticks")
        cursor.adbc_ingest("ticks", ticks(), mode="create")
        con.commit()
    return {"postgresql://trainer:secret@db.example.com:5432/market": server.uri}


def spark(request: pytest.FixtureRequest) -> dict[str, str]:
    server = request.getfixturevalue("spark_server")
    from pyspark.sql import SparkSession

    session = SparkSession.builder.remote(server.uri).create()
    try:
        session.sql("DROP TABLE IF EXISTS ticks").collect()
        session.createDataFrame(ticks()).write.saveAsTable("ticks")
    finally:
        session.stop()
    return {"sc://spark-driver:15002": server.uri}


def dolphindb(request: pytest.FixtureRequest) -> dict[str, str]:
    uri = os.environ.get("DDBLOADER_DOLPHINDB_URI")
    if not uri:
        pytest.skip("DDBLOADER_DOLPHINDB_URI is not set: no DolphinDB server to run the recipe against")
    parts = urlsplit(uri)
    connect = f'session.connect("{parts.hostname}", {parts.port}, "{parts.username}", "{parts.password}")'
    return {'session.connect("localhost", 8848, "admin", "123456")': connect}


#: ``# needs SERVER``: what provides it, returning {the block's example text: the test server's}
SERVERS: dict[str, Callable[[pytest.FixtureRequest], dict[str, str]]] = {
    "PostgreSQL": postgresql,
    "Spark": spark,
    "DolphinDB": dolphindb,
}


def needs(block: str) -> str | None:
    first = block.splitlines()[0]
    if not first.startswith("# needs "):
        return None
    server = next((server for server in SERVERS if server in first), None)
    assert server, f"{first!r} names no server the harness provides ({', '.join(SERVERS)})"
    return server


class Folder:
    """An empty folder in which one page's blocks run in order, each once."""

    def __init__(self, page: Path, path: Path, request: pytest.FixtureRequest) -> None:
        self.blocks = python_blocks(page)
        self.path = path
        self.request = request
        self.outputs: dict[int, str] = {}

    def output(self, index: int) -> str:
        """Block ``index``'s stdout, after running it and every block before it (once each)."""
        for earlier in range(index):
            if earlier not in self.outputs:
                try:
                    self.outputs[earlier] = self.run(self.blocks[earlier])
                except pytest.skip.Exception:  # its server is missing: its own test says so
                    self.outputs[earlier] = ""
        if index not in self.outputs:
            self.outputs[index] = self.run(self.blocks[index])
        return self.outputs[index]

    def run(self, block: str) -> str:
        first = block.splitlines()[0]
        if server := needs(block):
            for example, actual in SERVERS[server](self.request).items():
                assert example in block, f"{first!r}: the block must use {example!r}"
                block = block.replace(example, actual)
        command = [sys.executable, "-c", block]
        if named := NAMED.match(first):
            (self.path / named[1]).write_text(block, encoding="utf-8")
            command = [sys.executable, named[1]]
        if launched := SCRIPT.match(first):
            command = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={launched[2]}"]
            command.append(launched[1])
        env = {**os.environ, "PYTHONWARNINGS": "ignore", "PYTHONPATH": str(ROOT)}
        done = subprocess.run(
            command, cwd=self.path, env=env, capture_output=True, text=True, timeout=300, check=False
        )
        assert done.returncode == 0, f"{first}\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
        return done.stdout


FOLDERS: dict[Path, Folder] = {}


@pytest.fixture
def page_folder(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    def get(page: Path) -> Folder:
        if page not in FOLDERS:
            FOLDERS[page] = Folder(page, tmp_path_factory.mktemp(page.stem), request)
        FOLDERS[page].request = request
        return FOLDERS[page]

    return get


@pytest.mark.parametrize(("page", "index"), BLOCKS, ids=[f"{name(p)}:{i}" for p, i in BLOCKS])
def test_every_python_block_runs_as_pasted(page_folder: Any, page: Path, index: int) -> None:
    page_folder(page).output(index)


def block_of(page: str, test: Callable[[str], bool]) -> tuple[Path, int]:
    path = ROOT / page
    return path, next(i for i, block in enumerate(python_blocks(path)) if test(block))


def test_readme_starts_with_the_two_commands_and_stays_short() -> None:
    """README's first block is the demo and CI's test command, verbatim; the rest is on the site."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert readme.startswith("# ddbloader\n\n```bash\n")
    demo, tests = readme.split("```bash\n", 1)[1].split("```", 1)[0].splitlines()
    assert demo == "python3 -m pip install -e . && python3 -m ddbloader demo"
    assert tests in (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    assert "torch==" not in demo + tests, "README's commands keep the torch a user already has"
    assert len(readme.splitlines()) <= 250


def test_the_readme_example_learns(page_folder: Any) -> None:
    page, index = block_of("README.md", lambda block: "DDBDataLoader(" in block)
    losses = [float(v) for v in re.findall(r"last loss (\S+)", page_folder(page).output(index))]
    assert len(losses) == 3
    assert losses[-1] < 0.05, "the model learns the linear target"


def test_the_ddp_recipe_trains_every_epoch_on_two_ranks(page_folder: Any) -> None:
    page, index = block_of("docs/training/ddp.md", lambda block: bool(SCRIPT.match(block.splitlines()[0])))
    output = page_folder(page).output(index)
    per_rank = [int(n) for n in re.findall(r"epoch \d: (\d+) batches a rank", output)]
    assert len(per_rank) == 3, output
    _, single = block_of("docs/training/ddp.md", lambda block: "print(len(loader))" in block)
    batches = int(page_folder(page).output(single).strip().splitlines()[-1])
    assert abs(2 * per_rank[0] - batches) <= 1, "each of the 2 ranks takes half the batches"


def test_the_resume_script_goes_on_from_its_checkpoint(page_folder: Any) -> None:
    page, index = block_of("docs/resume.md", lambda block: block.startswith("# resume.py"))
    folder = page_folder(page)
    assert "resuming" not in folder.output(index), "the first run starts afresh"
    assert (folder.path / "checkpoint.pt").exists()
    assert re.search(r"resuming epoch 2 after batch \d+", folder.run(folder.blocks[index]))


def test_the_resume_page_names_everything_the_state_records() -> None:
    page = (ROOT / "docs" / "resume.md").read_text(encoding="utf-8")
    with duckdb.connect() as con:
        con.execute("CREATE TABLE t AS SELECT i * 1.0 AS y, i * 1.0 AS f FROM range(4) r(i)")
        with DDBDataLoader(con, "SELECT y, f FROM t", "y", input_col="f") as loader:
            state = loader.state_dict()
    for key in state:
        assert (f"`{key}`" if key != "version" else "a version") in page, key


def test_the_elastic_resume_recipe_splits_the_rest_among_three_ranks(page_folder: Any) -> None:
    page, index = block_of("docs/resume.md", lambda block: "ranks(3)" in block)
    left = [int(v) for v in re.findall(r"rank \d: (\d+) batches left", page_folder(page).output(index))]
    assert len(left) == 3 and len(set(left)) == 1


def test_the_stateful_dataloader_recipe_serves_the_rest_of_the_epoch(page_folder: Any) -> None:
    page, index = block_of("docs/training/stateful.md", lambda block: "StatefulDataLoader(" in block)
    output = page_folder(page).output(index)
    left, total = map(int, re.findall(r"resumed: (\d+) of (\d+) batches left after 10", output)[0])
    assert left == total - 10


def test_every_page_is_in_the_site_nav() -> None:
    """A page written but left out of mkdocs.yml's nav is a page nobody finds."""
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    for page in (ROOT / "docs").rglob("*.md"):
        relative = page.relative_to(ROOT / "docs").as_posix()
        assert f" {relative}\n" in nav, relative
