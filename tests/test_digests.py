"""The golden batch digests: every configuration of ``benchmarks/digests.py`` against ``digests.txt``.

Each configuration (shuffle on and off, windows, repartitions, pools, streamed and per-partition
fetches, the cache, DDP ranks, workers, ``drop_last``, ``key_col``, resumes) hashes every batch of two
epochs; ``benchmarks/digests.txt`` holds the digests of the current code. A digest that moves means the
batches a user trains on moved: a refactoring must leave them all as they were, and a change that alters
batches by design regenerates the file and says in its commit message which configurations changed and
why. The configurations live in the script alone (it is loaded by path, so both read one list).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import duckdb
import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "digests.py"
GOLDEN_FILE = ROOT / "benchmarks" / "digests.txt"
REGENERATE = (
    "If the batches changed by design, regenerate the file with\n"
    "    PYTHONPATH=$PWD python3 benchmarks/digests.py > benchmarks/digests.txt\n"
    "and say in the commit message which configurations changed and why; otherwise the change "
    "altered the batches a user trains on and is a bug."
)


def _load(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location("benchmark_digests", path)
    assert spec is not None and spec.loader is not None, f"cannot load {path}"
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


digests = _load(SCRIPT)
GOLDEN: dict[str, str] = dict(line.split() for line in GOLDEN_FILE.read_text().splitlines() if line.strip())


@pytest.fixture(scope="module")
def digest_table() -> Iterator[duckdb.DuckDBPyConnection]:
    """The script's table, made once for all configurations (the digests only read it)."""
    con = duckdb.connect()
    digests.make_table(con)
    yield con
    con.close()


def test_every_configuration_has_one_golden_digest() -> None:
    assert list(GOLDEN) == list(digests.CONFIGS), (
        f"{GOLDEN_FILE.name} must list the configurations of {SCRIPT.name}, in its order.\n{REGENERATE}"
    )
    assert len(GOLDEN) >= 74


@pytest.mark.parametrize("name", list(digests.CONFIGS))
def test_batches_match_the_golden_digest(digest_table: duckdb.DuckDBPyConnection, name: str) -> None:
    got = digests.digest(digest_table, name)
    assert got == GOLDEN.get(name), (
        f"the batches of configuration {name!r} changed: digest {got}, {GOLDEN_FILE.name} holds "
        f"{GOLDEN.get(name)}.\n{REGENERATE}"
    )
