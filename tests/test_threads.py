"""The thread toolkit: Pending, ThreadFailure, start_thread and join_all."""

from __future__ import annotations

import logging
import threading
import time
import traceback
from collections.abc import Callable

import pytest

from ddbloader._io.threads import (
    Pending,
    Stopped,
    ThreadFailure,
    in_worker_thread,
    join_all,
    start_thread,
)

pytestmark = pytest.mark.timeout(30)


class WorkerError(Exception):
    """A failure only the worker raises."""


def _set_later(action: Callable[[], None], delay: float) -> threading.Thread:
    def body() -> None:
        time.sleep(delay)
        action()

    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    return thread


def test_pending_returns_a_value_set_by_another_thread() -> None:
    pending: Pending[str] = Pending("computing the answer")
    assert not pending.done()
    _set_later(lambda: pending.set("answer"), 0.1)
    assert pending.wait(threading.Event(), timeout=5) == "answer"
    assert pending.done()


def test_pending_timeout_names_what_was_awaited() -> None:
    pending: Pending[int] = Pending("fetching partition 3 of group 1")
    started = time.monotonic()
    with pytest.raises(TimeoutError, match=r"within 0\.2 s .*fetching partition 3 of group 1"):
        pending.wait(threading.Event(), timeout=0.2)
    assert 0.2 <= time.monotonic() - started < 1.0


def test_pending_wait_stops_when_the_stop_event_is_set() -> None:
    pending: Pending[int] = Pending("never arriving")
    stop = threading.Event()
    _set_later(stop.set, 0.1)
    started = time.monotonic()
    with pytest.raises(Stopped):
        pending.wait(stop, timeout=30)
    assert time.monotonic() - started < 1.0


def test_pending_cancel_stops_the_waiter_at_once() -> None:
    pending: Pending[int] = Pending("cancelled work")
    _set_later(pending.cancel, 0.1)
    started = time.monotonic()
    with pytest.raises(Stopped):
        pending.wait(threading.Event(), timeout=30)
    assert time.monotonic() - started < 1.0


def test_pending_failure_reraises_the_original_object_with_one_note() -> None:
    pending: Pending[int] = Pending("work")
    error = WorkerError("in the worker")

    def worker() -> None:
        try:
            raise error
        except WorkerError as caught:
            pending.fail(ThreadFailure(caught, "doing the work"))

    thread = start_thread(worker, name="ddbloader-test-worker")
    thread.join(5)
    for _ in range(2):
        with pytest.raises(WorkerError) as caught:
            pending.wait(threading.Event(), timeout=5)
        assert caught.value is error
    assert error.__notes__ == ["raised in thread 'ddbloader-test-worker' while doing the work"]
    assert "in worker" in "".join(traceback.format_exception(error))


def test_start_thread_makes_named_daemon_workers() -> None:
    release = threading.Event()
    inside: list[bool] = []

    def body() -> None:
        inside.append(in_worker_thread())
        release.wait(5)

    thread = start_thread(body, name="ddbloader-test-daemon")
    try:
        assert thread.daemon
        assert thread.name == "ddbloader-test-daemon"
        assert thread.is_alive()
    finally:
        release.set()
        thread.join(5)
    assert inside == [True]
    assert not in_worker_thread()


def test_join_all_gives_up_on_a_stuck_thread_and_says_so(caplog: pytest.LogCaptureFixture) -> None:
    release = threading.Event()
    stuck = start_thread(release.wait, 10, name="ddbloader-test-stuck")
    quick = start_thread(lambda: None, name="ddbloader-test-quick")
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="ddbloader"):
        join_all([quick, stuck], timeout=0.2)
    try:
        assert time.monotonic() - started < 1.0
        assert not quick.is_alive()
        assert "ddbloader-test-stuck" in caplog.text
        assert "ddbloader-test-quick" not in caplog.text
    finally:
        release.set()
        stuck.join(5)


def test_join_all_skips_the_calling_thread() -> None:
    joined = threading.Event()

    def join_self() -> None:
        join_all([threading.current_thread()], timeout=5)
        joined.set()

    thread = start_thread(join_self, name="ddbloader-test-self")
    thread.join(5)
    assert joined.is_set()
