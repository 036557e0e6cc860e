"""Does an epoch cost what its rows cost, however many groups, however big one, on every engine?

Usage::

    python benchmarks/scale.py                              # every section, 3 rounds
    python benchmarks/scale.py --sections groups --engines duckdb,postgresql
    python benchmarks/scale.py --smoke

Sections (each measurement in its own interpreter, interleaved; peak RSS is the whole process's):

* ``groups``: the same 400,000 rows (8 float64 factors and a target, random order, no index) as
  10 groups of 40,000 and as 4,000 groups of 100; window 20, batch 256, shuffled; on each of
  ``--engines`` (DuckDB, PostgreSQL from ``tests/pgserver.py``, DataFusion, chDB, Flight SQL
  served by Sail): plan seconds, a warm epoch's windows/s and CPU seconds, queries per epoch.
* ``planning``: 10,000 groups x 50 rows, the group values discovered or all listed in
  ``group_scheme``; seconds from the constructor to the plan and on to the first batch, DuckDB
  and PostgreSQL.
* ``big-group``: 2,000,000 rows x 32 float32 as one group, without and with a 20-value
  repartition column, streamed (default ``fetch_bytes``) and fetched whole (``fetch_bytes=0``).
* ``memory``: ``harness.SERIES`` at 5 and 20 days (the loader opening the DuckDB file): peak RSS
  should not follow the table.
"""

from __future__ import annotations

import argparse
import contextlib
import tempfile
import time
import warnings
from collections.abc import Iterator
from typing import Any

import harness

ENGINES = ("duckdb", "postgresql", "datafusion", "chdb", "flightsql")
SECTIONS = ("groups", "planning", "big-group", "memory")


def _groups_loader(source: Any, **options: Any) -> Any:
    from ddbloader import DDBDataLoader

    factors = [f"f{i}" for i in range(8)]
    return DDBDataLoader(
        source,
        # pos is selected: an engine that keeps a result's order only under an ORDER BY of it
        # (PostgreSQL) is split by result columns, and the loader refuses to order by others
        f"SELECT g, pos, {', '.join(factors)}, target FROM t ORDER BY pos",
        "target",
        batch_size=256,
        shuffle=True,
        window_size=20,
        input_col=factors,
        group_col="g",
        seed=0,
        **options,
    )


@contextlib.contextmanager
def _in_child(engine: str, p: dict[str, Any]) -> Iterator[Any]:
    """The loader's source for ``engine`` holding table ``t`` in this process (DuckDB,
    DataFusion, Flight SQL) or the URI the parent made (PostgreSQL, chDB)."""
    if engine in ("postgresql", "chdb"):
        yield p["uri"]
        return
    path = harness.groups_db(p["groups"], p["rows"])
    if engine == "duckdb":
        yield str(path)
        return
    import duckdb

    with duckdb.connect(str(path), read_only=True) as con:
        data = con.sql("SELECT * FROM t").to_arrow_table()
    if engine == "datafusion":
        from datafusion import SessionContext

        ctx = SessionContext()
        ctx.register_record_batches("t", [data.to_batches()])
        yield ctx
        return
    import pyarrow.parquet as pq
    from adbc_driver_flightsql import dbapi
    from pysail.flight import FlightSqlServer

    from ddbloader.backends import FlightSQLBackend

    server = FlightSqlServer("127.0.0.1", 0)
    server.start(background=True)
    host, port = server.listening_address
    with tempfile.TemporaryDirectory(prefix="ddbloader-sail-") as directory:
        pq.write_table(data, f"{directory}/part-0.parquet")
        uri = f"grpc://{host}:{port}"
        with dbapi.connect(uri, autocommit=True) as admin, admin.cursor() as cursor:
            cursor.execute(f"CREATE TABLE t USING parquet LOCATION '{directory}'")
            cursor.fetch_arrow_table()
        yield FlightSQLBackend(uri, dialect="spark")


def groups(p: dict[str, Any]) -> dict[str, Any]:
    import ddbloader  # noqa: F401 -- before the clock: plan seconds are planning, not torch's import

    warnings.simplefilter("ignore")
    with _in_child(p["engine"], p) as source:
        row = harness.passes(
            lambda: _groups_loader(source), p["epochs"], lambda made: {"queries": made.stats().queries}
        )
    if row["samples"] != p["groups"] * (p["rows"] - 20):
        raise AssertionError(f"{row['samples']} windows, not {p['groups'] * (p['rows'] - 20)}")
    return row


def planning(p: dict[str, Any]) -> dict[str, Any]:
    import ddbloader  # noqa: F401 -- before the clock, as a training script has it

    source = p.get("uri") or str(harness.groups_db(p["groups"], p["rows"]))
    options: dict[str, Any] = (
        {"group_scheme": list(range(p["groups"]))} if p["label"].endswith("listed") else {}
    )
    cpu0, started = harness.cpu_s(), time.perf_counter()
    with _groups_loader(source, **options) as loader:
        plan_s = time.perf_counter() - started
        x, _ = next(iter(loader))
        total = time.perf_counter() - started
        if len(loader.plan.groups) != p["groups"] or x.shape[0] != 256:
            raise AssertionError(f"{len(loader.plan.groups)} groups, a batch of {x.shape[0]}")
    return {
        "plan_s": plan_s,
        "first_batch_s": total - plan_s,
        "total_s": total,
        "cpu_s": harness.cpu_s() - cpu0,
    }


def big_group(p: dict[str, Any]) -> dict[str, Any]:
    from ddbloader import DDBDataLoader

    columns = ", ".join(f"random()::FLOAT AS c{i}" for i in range(32))
    path = harness.duckdb_file(
        f"big_group_{p['rows']}x32",
        f"CREATE TABLE t AS SELECT range AS pos, (range * 20 // {p['rows']})::INTEGER AS part, {columns} "
        f"FROM range({p['rows']})",
    )
    options: dict[str, Any] = {"repartition_col": "part"} if "repartitioned" in p["label"] else {}
    options |= {"fetch_bytes": 0} if "whole" in p["label"] else {}
    row = harness.passes(
        lambda: DDBDataLoader(
            str(path),
            "SELECT * FROM t ORDER BY pos",
            "c0",
            batch_size=256,
            shuffle=True,
            exclude_col=["pos", "part"],
            seed=0,
            **options,
        ),
        p["epochs"],
    )
    if row["samples"] != p["rows"]:
        raise AssertionError(f"{row['samples']} rows, not {p['rows']}")
    return row


def memory(p: dict[str, Any]) -> dict[str, Any]:
    from ddbloader import DDBDataLoader

    shape = harness.Series(*p["shape"])
    path = str(harness.series_db(shape))
    return harness.passes(lambda: DDBDataLoader(path, **shape.loader_args(p["window"])), p["epochs"])


@contextlib.contextmanager
def _parent_source(engine: str, groups_: int, rows: int) -> Iterator[str | None]:
    """For PostgreSQL and chDB, a URI holding the groups table ``t`` (None: not installed)."""
    if engine not in ("postgresql", "chdb"):
        yield ""
        return
    import duckdb

    with duckdb.connect(str(harness.groups_db(groups_, rows)), read_only=True) as con:
        data = con.sql("SELECT * FROM t").to_arrow_table()
    with harness.loaded(engine, "t", data) as uri:
        yield uri


def arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--sections", default=",".join(SECTIONS), help="comma-separated, of " + ", ".join(SECTIONS)
    )
    parser.add_argument(
        "--engines", default=",".join(ENGINES), help="comma-separated, of " + ", ".join(ENGINES)
    )
    parser.add_argument("--epochs", type=int, default=4, help="epochs per contender (the first is cold)")


def run(args: argparse.Namespace) -> dict[str, Any]:
    smoke, sections, rows, ratios, skipped = args.smoke, args.sections.split(","), [], {}, []
    epochs = 2 if smoke else args.epochs
    script, rounds = args.script, args.rounds

    def section(name: str, todo: list[tuple[str, dict[str, Any]]]) -> list[dict[str, Any]]:
        results = harness.interleaved(script, todo, rounds)
        for r in results:
            r["contender"] = f"{name}: {r['contender'].split(' ', 1)[1]}"  # the label, not the function
        rows.extend(results)
        return results

    if "groups" in sections:
        total = 4_000 if smoke else 400_000
        for engine in args.engines.split(","):
            done = []
            for g, r in ((10, total // 10), (total // 100, 100)):
                with _parent_source(engine, g, r) as uri:
                    if uri is None:
                        skipped.append(f"groups on {engine}")
                        break
                    p = {"engine": engine, "groups": g, "rows": r, "epochs": epochs, "uri": uri}
                    done += section("groups", [("groups", {**p, "label": f"{engine} {g:,} x {r:,}"})])
            if len(done) == 2:
                ratios[f"groups on {engine}: windows/s, many small / few big"] = (
                    done[1]["samples_per_s"] / done[0]["samples_per_s"]
                )
    if "planning" in sections:
        g, r = (200, 30) if smoke else (10_000, 50)
        for engine in ("duckdb", "postgresql"):
            with _parent_source(engine, g, r) as uri:
                if uri is None:
                    skipped.append(f"planning on {engine}")
                    continue
                p = {"groups": g, "rows": r, "uri": uri}
                section(
                    "planning",
                    [("planning", {**p, "label": f"{engine} {how}"}) for how in ("discovered", "listed")],
                )
    if "big-group" in sections:
        p = {"rows": 20_000 if smoke else 2_000_000, "epochs": epochs}
        labels = ("streamed", "streamed repartitioned", "whole", "whole repartitioned")
        section("big-group", [("big_group", {**p, "label": label}) for label in labels])
    if "memory" in sections:
        shape = harness.SERIES_SMOKE if smoke else harness.SERIES
        todo = []
        for k in (1, 4):
            scaled = [shape.symbols, shape.days * k, shape.rows, shape.factors]
            harness.series_db(harness.Series(*scaled))
            todo.append(
                (
                    "memory",
                    {"shape": scaled, "window": 8 if smoke else 50, "epochs": epochs, "label": f"{k}x days"},
                )
            )
        one, four = section("memory", todo)
        ratios["memory: peak RSS, 4x days / 1x"] = four["peak_rss_mb"] / one["peak_rss_mb"]
    return {
        "params": {"sections": sections, "engines": args.engines, "epochs": epochs},
        "rows": rows,
        "ratios": ratios,
        "skipped": skipped,
    }


if __name__ == "__main__":
    harness.main(
        __doc__,
        {"groups": groups, "planning": planning, "big_group": big_group, "memory": memory},
        run,
        arguments,
    )
