"""The throwaway servers of a test run stop when the run is stopped with SIGTERM (as ``timeout``,
CI runners and IDEs stop it): a child pytest holding a PostgreSQL server (tests/server_holder.py)
is sent SIGTERM while a test holds the server, or receives it while the server is starting, and
no postmaster outlives it, nor its directory.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pgserver
import pytest

HERE = Path(__file__).resolve().parent


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's (postgres's) process
        return True
    return True


@pytest.mark.server
@pytest.mark.multiprocess
@pytest.mark.timeout(120)
@pytest.mark.parametrize("when", ["running", "starting"])
def test_a_sigterm_of_pytest_leaves_no_postgres_server(tmp_path: Path, when: str) -> None:
    if pgserver.find_bindir() is None:
        pgserver.unavailable("PostgreSQL server binaries (initdb, pg_ctl, postgres) are not installed")
    out = tmp_path / "held.json"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(HERE.parent), os.environ.get("PYTHONPATH", "")]),
        "DDBLOADER_HOLD_OUT": str(out),
        "DDBLOADER_HOLD_WHEN": when,
    }
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(HERE / "server_holder.py")]
    child = subprocess.Popen(
        command, cwd=HERE.parent, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    held: dict[str, object] = {}
    try:
        deadline = time.monotonic() + 60
        while not out.exists() or not out.read_text():
            assert child.poll() is None, child.communicate()[0][-3000:]
            assert time.monotonic() < deadline, "the child pytest did not start its server in time"
            time.sleep(0.1)
        held = json.loads(out.read_text())
        if when == "running":
            child.send_signal(signal.SIGTERM)
        output = child.communicate(timeout=60)[0]
        pid, root = int(str(held["pid"])), Path(str(held["root"]))
        deadline = time.monotonic() + 10
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(pid), f"postmaster {pid} outlived the stopped run:\n{output[-3000:]}"
        assert not root.exists(), f"{root} outlived the stopped run"
        assert child.returncode == pytest.ExitCode.INTERRUPTED, output[-3000:]
    finally:
        if child.poll() is None:
            child.kill()
            child.communicate()
        if held:  # a server the failed run left behind: stop it here
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(int(str(held["pid"])), signal.SIGQUIT)
            shutil.rmtree(str(held["root"]), ignore_errors=True)
