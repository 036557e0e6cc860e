"""A throwaway Spark Connect server for tests: 127.0.0.1, a free port, a temporary directory.

``start()`` runs the Connect server that the pyspark wheel ships (``spark-submit --class
org.apache.spark.sql.connect.service.SparkConnectServer``, ``local[2]``) with its driver, gRPC
service and block manager bound to 127.0.0.1, no web UI, an in-memory catalog and its warehouse
and scratch space in a temporary directory, then waits until the gRPC port answers. Tables
written through one session are visible to every other session of the server (ranks, loaders).
Two shuffle partitions instead of Spark's 200 fit the tests' tiny tables.

``SparkServer.stop()`` stops it and removes the directory (also registered with atexit, as a
backstop). Missing pyspark (with its Connect client) or Java skips the tests outside CI and
fails them in CI (env ``CI`` set), so a CI run can never pass by skipping Spark.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib.util
import os
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import servers

__all__ = ["START_TIMEOUT_SECONDS", "SparkServer", "start"]

#: How long the server may take to answer (10-20 s on a 2-core machine, more on a busy CI).
START_TIMEOUT_SECONDS = 180.0

_CONNECT_CLIENT = ("pyspark", "grpc", "grpc_status", "google.rpc", "pandas", "zstandard")


@dataclass
class SparkServer:
    """A running Spark Connect server; ``uri`` is what the loader takes as ``source``."""

    process: subprocess.Popen[bytes]
    root: Path
    port: int

    @property
    def uri(self) -> str:
        return f"sc://127.0.0.1:{self.port}"

    def log_tail(self, characters: int = 4000) -> str:
        with contextlib.suppress(OSError):
            return (self.root / "server.log").read_text(errors="replace")[-characters:]
        return ""

    def stop(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL after 30 s) and remove its directory; idempotent."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=30)
        shutil.rmtree(self.root, ignore_errors=True)


def _spark_home() -> Path | None:
    """The pyspark package directory (the wheel is a Spark distribution), or None without pyspark."""
    for module in _CONNECT_CLIENT:
        try:
            if importlib.util.find_spec(module) is None:
                return None
        except ModuleNotFoundError:  # a parent package (google) is missing
            return None
    spec = importlib.util.find_spec("pyspark")
    if spec is None or spec.origin is None:
        return None
    home = Path(spec.origin).parent
    if not (home / "bin" / "spark-submit").is_file() or not list(home.glob("jars/spark-connect_*.jar")):
        return None
    return home


def _java() -> str | None:
    java_home = os.environ.get("JAVA_HOME")
    if java_home and (Path(java_home) / "bin" / "java").is_file():
        return str(Path(java_home) / "bin" / "java")
    return shutil.which("java")


def _answers(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
        return True
    return False


def _launch(home: Path, root: Path, port: int) -> SparkServer:
    settings = {
        "spark.connect.grpc.binding.address": "127.0.0.1",
        "spark.connect.grpc.binding.port": str(port),
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.ui.enabled": "false",
        "spark.sql.catalogImplementation": "in-memory",
        "spark.sql.warehouse.dir": str(root / "warehouse"),
        "spark.local.dir": str(root / "scratch"),
        "spark.sql.shuffle.partitions": "2",
    }
    command = [
        str(home / "bin" / "spark-submit"),
        "--class",
        "org.apache.spark.sql.connect.service.SparkConnectServer",
        "--master",
        "local[2]",
        "--driver-memory",
        "1g",
        *(argument for key, value in settings.items() for argument in ("--conf", f"{key}={value}")),
        "--name",
        "ddbloader-tests",
    ]
    environment = {**os.environ, "SPARK_HOME": str(home), "SPARK_LOCAL_IP": "127.0.0.1"}
    with (root / "server.log").open("wb") as log:
        process = subprocess.Popen(
            command, cwd=root, env=environment, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    return SparkServer(process, root, port)


def start() -> SparkServer:
    """Start a Spark Connect server and wait until it answers; skip or fail when Spark is missing.

    Raises:
        RuntimeError: the server exited, or did not answer within :data:`START_TIMEOUT_SECONDS`
            (the message carries the end of its log).
    """
    home = _spark_home()
    if home is None:
        servers.unavailable(
            "pyspark with its Connect client is not installed (pip install 'ddbloader[spark]')",
            "Spark",
            ".ci/prepare-spark.sh",
        )
        raise AssertionError("unreachable")  # pytest.skip/fail raise
    if _java() is None:
        servers.unavailable(
            "Spark needs Java 17 or newer (no java on PATH or in JAVA_HOME)", "Spark", ".ci/prepare-spark.sh"
        )
    root = Path(tempfile.mkdtemp(prefix="ddbloader-spark-"))
    # A port taken between probing and binding fails the start; the next free one is tried.
    for attempt in range(3):
        server = _launch(home, root, servers.free_port())
        atexit.register(server.stop)
        deadline = time.monotonic() + START_TIMEOUT_SECONDS
        while server.process.poll() is None and time.monotonic() < deadline:
            if _answers(server.port):
                return server
            time.sleep(0.25)
        log = server.log_tail()
        exited = server.process.poll() is not None
        if exited and "BindException" in log and attempt < 2:
            continue
        server.stop()
        state = f"exited with {server.process.returncode}" if exited else "did not answer in time"
        raise RuntimeError(f"the Spark Connect server {state}; the end of its log:\n{log}")
    raise AssertionError("unreachable: the last attempt returns or raises")
