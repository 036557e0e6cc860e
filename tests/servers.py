"""What the throwaway servers the tests start share: free ports, and skipping only outside CI."""

from __future__ import annotations

import os
import socket

import pytest

__all__ = ["free_port", "unavailable"]


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (another process may still take it before it is bound)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def unavailable(reason: str, engine: str, prepare: str) -> None:
    """Skip outside CI; fail in CI (env ``CI`` set), where ``engine`` must be tested.

    ``prepare`` names the script that installs what is missing (CI runs it first).
    """
    if os.environ.get("CI"):
        pytest.fail(f"{reason} (CI is set, so {engine} tests must run: see {prepare})")
    pytest.skip(reason)
