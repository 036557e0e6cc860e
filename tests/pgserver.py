"""A throwaway PostgreSQL cluster for tests: 127.0.0.1, a free port, a temporary directory.

``start()`` runs initdb and the server as the ``postgres`` OS user when the tests run as root
(initdb refuses root), with fsync off since the data is thrown away, password authentication over
TCP (so URIs carry credentials that redaction can be tested against) and trust on the private
Unix socket used to create the test database. ``PostgresServer.stop()`` stops it and removes
the directory (also registered with atexit before the server starts, as a backstop, so that a
SIGTERM while it starts stops it too); ``halt()`` and ``resume()`` stop and start it again on
the same port, for restart tests.

Missing server binaries skip the tests outside CI and fail them in CI (env ``CI`` set), so a CI
run can never pass by skipping PostgreSQL.
"""

from __future__ import annotations

import atexit
import contextlib
import glob
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import servers

__all__ = ["PASSWORD", "USER", "PostgresServer", "find_bindir", "start", "unavailable"]

USER = "postgres"
PASSWORD = "s3cr3t-pw"
DATABASE = "ddbtest"


def find_bindir() -> Path | None:
    """The directory holding initdb, pg_ctl and postgres, or None when they are not installed."""
    candidates: list[str] = []
    if os.environ.get("DDBLOADER_PG_BINDIR"):
        candidates.append(os.environ["DDBLOADER_PG_BINDIR"])
    if shutil.which("pg_config"):
        with contextlib.suppress(subprocess.CalledProcessError, OSError):
            candidates.append(
                subprocess.run(
                    ["pg_config", "--bindir"], capture_output=True, text=True, check=True
                ).stdout.strip()
            )
    candidates += sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=_version, reverse=True)
    if shutil.which("initdb"):
        candidates.append(str(Path(shutil.which("initdb") or "").parent))
    for candidate in candidates:
        path = Path(candidate)
        if all((path / tool).is_file() for tool in ("initdb", "pg_ctl", "postgres")):
            return path
    return None


def _version(path: str) -> int:
    name = Path(path).parent.name
    return int(name) if name.isdigit() else 0


def unavailable(reason: str) -> None:
    """Skip outside CI; fail in CI, where PostgreSQL must be tested."""
    servers.unavailable(reason, "PostgreSQL", ".ci/prepare-postgres.sh")


@dataclass
class PostgresServer:
    """A running cluster. ``uri`` carries the password; never print it outside tests."""

    bindir: Path
    root: Path
    port: int

    @property
    def uri(self) -> str:
        return f"postgresql://{USER}:{PASSWORD}@127.0.0.1:{self.port}/{DATABASE}"

    def halt(self) -> None:
        """Stop the server (fast shutdown: connections are closed) but keep its data and port."""
        _as_postgres([str(self.bindir / "pg_ctl"), "stop", "-D", str(self.root / "data"), "-m", "fast", "-w"])

    def resume(self) -> None:
        """Start a server stopped by :meth:`halt` again, on the same port, with the same data."""
        _start_server(self.bindir, self.root, self.port)

    def stop(self) -> None:
        """Stop the server (immediate: the data is discarded) and remove its directory; idempotent.
        A call interrupted while it stops the server (a second SIGTERM) keeps the directory, so
        that the next call (atexit's) can stop the server still."""
        if not self.root.exists():
            return
        try:
            if (self.root / "data" / "postmaster.pid").exists():
                _as_postgres(
                    [
                        str(self.bindir / "pg_ctl"),
                        "stop",
                        "-D",
                        str(self.root / "data"),
                        "-m",
                        "immediate",
                        "-w",
                    ]
                )
        except Exception:
            shutil.rmtree(self.root, ignore_errors=True)
            raise
        shutil.rmtree(self.root, ignore_errors=True)


def _start_server(bindir: Path, root: Path, port: int) -> None:
    options = (
        f"-c listen_addresses=127.0.0.1 -p {port} -k {root} "
        "-c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=100"
    )
    _as_postgres(
        [
            str(bindir / "pg_ctl"),
            "start",
            "-w",
            "-t",
            "30",
            "-D",
            str(root / "data"),
            "-l",
            str(root / "server.log"),
            "-o",
            options,
        ]
    )


def _as_postgres(command: list[str]) -> subprocess.CompletedProcess[str]:
    if os.geteuid() == 0:
        command = ["runuser", "-u", USER, "--", *command]
    result = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    if result.returncode != 0:
        raise RuntimeError(
            f"{' '.join(command)} failed ({result.returncode}): {result.stderr or result.stdout}"
        )
    return result


def start() -> PostgresServer:
    """Start a cluster with an empty ``ddbtest`` database; skip or fail when PostgreSQL is missing."""
    bindir = find_bindir()
    if bindir is None:
        unavailable("PostgreSQL server binaries (initdb, pg_ctl, postgres) are not installed")
        raise AssertionError("unreachable")  # pytest.skip/fail raise
    if os.geteuid() == 0:
        try:
            import pwd

            pwd.getpwnam(USER)
        except KeyError:
            unavailable(f"running as root needs an OS user {USER!r} to run PostgreSQL")
    root = Path(tempfile.mkdtemp(prefix="ddbloader-pg-"))
    server = PostgresServer(bindir, root, 0)
    # Registered before the server starts: a SIGTERM (an interrupt, see tests/conftest.py) that
    # arrives while it starts still stops it, here or at exit.
    atexit.register(server.stop)
    try:
        if os.geteuid() == 0:
            shutil.chown(root, user=USER)
        (root / "pw").write_text(PASSWORD + "\n")
        _as_postgres(
            [
                str(bindir / "initdb"),
                "-D",
                str(root / "data"),
                "-U",
                USER,
                "--pwfile",
                str(root / "pw"),
                "--auth-local=trust",
                "--auth-host=scram-sha-256",
                "--encoding=UTF8",
                "--locale=C",
                "--no-sync",
            ]
        )
        # A port taken between probing and binding fails the start; the next free one is tried.
        for attempt in range(3):
            server.port = servers.free_port()
            try:
                _start_server(bindir, root, server.port)
                break
            except RuntimeError:
                if attempt == 2:
                    raise
        _as_postgres(
            [str(bindir / "createdb"), "-h", str(root), "-p", str(server.port), "-U", USER, DATABASE]
        )
        return server
    except BaseException:
        server.stop()
        raise
