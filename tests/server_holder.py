"""Holds the session's PostgreSQL server until the run is stopped: tests/test_servers.py runs it in a
child pytest and ends that run with SIGTERM. Not part of the suite (no ``test_`` file name).

Environment: ``DDBLOADER_HOLD_OUT``, a file to write the server's directory and postmaster pid to
once it runs; ``DDBLOADER_HOLD_WHEN``: ``running`` (held by a test until the SIGTERM comes from
outside) or ``starting`` (this process sends itself SIGTERM the moment the postmaster is up,
inside ``pgserver.start()``, before the fixture holds the server).
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pgserver
import pytest

OUT = Path(os.environ["DDBLOADER_HOLD_OUT"])


def _record(root: Path) -> None:
    pid = int((root / "data" / "postmaster.pid").read_text().split()[0])
    partial = OUT.with_suffix(".partial")
    partial.write_text(json.dumps({"root": str(root), "pid": pid}))
    partial.replace(OUT)  # whole or absent for the reader


if os.environ.get("DDBLOADER_HOLD_WHEN") == "starting":
    _start_server = pgserver._start_server

    def _terminated_once_up(bindir: Path, root: Path, port: int) -> None:
        _start_server(bindir, root, port)
        _record(root)
        os.kill(os.getpid(), signal.SIGTERM)

    pgserver._start_server = _terminated_once_up


@pytest.mark.timeout(300)
def test_holds_the_server_until_the_run_is_stopped(pg_server: pgserver.PostgresServer) -> None:
    _record(pg_server.root)
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        time.sleep(0.1)
    pytest.fail("nobody stopped this run")
