"""The prefetch stage: Prefetcher's order, bound, error transport, timeouts and shutdown."""

from __future__ import annotations

import threading
import time
import traceback
from collections.abc import Iterator

import pytest
from conftest import wait_until

from ddbloader._io.threads import (
    Stopped,
    start_thread,
)
from ddbloader._pipeline.prefetch import JUDGED, Prefetcher, _Paused

pytestmark = pytest.mark.timeout(30)


class ProducerError(Exception):
    """A failure only the producer raises."""


class Recorder:
    """A producer that records what it produced, in which thread, and whether it was closed."""

    def __init__(self, count: int | None, fail_after: int | None = None) -> None:
        self.count = count
        self.fail_after = fail_after
        self.produced = 0
        self.threads: set[str] = set()
        self.finalised = threading.Event()

    def __call__(self, stop: threading.Event) -> Iterator[int]:
        try:
            while self.count is None or self.produced < self.count:
                if self.fail_after is not None and self.produced == self.fail_after:
                    raise ProducerError(f"failed after {self.produced} items")
                self.threads.add(threading.current_thread().name)
                self.produced += 1
                yield self.produced
        finally:
            self.finalised.set()


def _named(name: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == name]


@pytest.mark.parametrize("depth", [0, 1, 3])
def test_yields_every_item_in_order(depth: int) -> None:
    producer = Recorder(count=7)
    prefetcher: Prefetcher[int] = Prefetcher(producer, depth=depth, name="ddbloader-test-order", timeout=5)
    assert list(prefetcher) == [1, 2, 3, 4, 5, 6, 7]
    assert producer.finalised.is_set()
    with pytest.raises(StopIteration):
        next(prefetcher)
    assert wait_until(lambda: not _named("ddbloader-test-order"), 2)


def test_close_from_another_thread_ends_a_waiting_consumer_with_stop_iteration() -> None:
    """Not with "background thread ... ended without a result": the loader turns this
    StopIteration into its own RuntimeError saying the iteration was closed."""

    def slow(stop: threading.Event) -> Iterator[int]:
        yield 1
        stop.wait(30)
        yield 2

    prefetcher: Prefetcher[int] = Prefetcher(slow, depth=1, name="ddbloader-test-closed", timeout=20)
    assert next(prefetcher) == 1
    closer = threading.Timer(0.2, prefetcher.close)
    closer.start()
    started = time.monotonic()
    with pytest.raises(StopIteration):
        next(prefetcher)
    assert time.monotonic() - started < 5
    closer.join()


def test_depth_zero_runs_in_the_consumer_thread() -> None:
    producer = Recorder(count=3)
    prefetcher: Prefetcher[int] = Prefetcher(producer, depth=0, name="ddbloader-test-inline", timeout=5)
    assert not _named("ddbloader-test-inline")
    assert list(prefetcher) == [1, 2, 3]
    assert producer.threads == {threading.current_thread().name}


def test_background_thread_is_named_daemon_and_bounded() -> None:
    producer = Recorder(count=None)
    prefetcher: Prefetcher[int] = Prefetcher(producer, depth=2, name="ddbloader-test-bounded", timeout=5)
    try:
        assert next(prefetcher) == 1
        (thread,) = _named("ddbloader-test-bounded")
        assert thread.daemon
        time.sleep(0.3)
        assert producer.threads == {"ddbloader-test-bounded"}
        # one taken, ``depth`` queued, one more held by the producer while it waits for room
        assert producer.produced <= 1 + 2 + 1
    finally:
        prefetcher.close()
    assert not thread.is_alive()


@pytest.mark.parametrize("depth", [0, 2])
def test_producer_error_reraised_with_type_note_and_frames(depth: int) -> None:
    producer = Recorder(count=10, fail_after=2)
    prefetcher: Prefetcher[int] = Prefetcher(producer, depth=depth, name="ddbloader-test-error", timeout=5)
    assert next(prefetcher) == 1
    assert next(prefetcher) == 2
    with pytest.raises(ProducerError, match="failed after 2 items") as caught:
        next(prefetcher)
    frames = "".join(traceback.format_exception(caught.value))
    assert 'raise ProducerError(f"failed after' in frames
    if depth:
        assert "in _produce" in frames
        assert "raised in thread 'ddbloader-test-error' while assembling batches" in caught.value.__notes__
    assert producer.finalised.is_set()
    with pytest.raises(StopIteration):
        next(prefetcher)
    assert wait_until(lambda: not _named("ddbloader-test-error"), 2)


def test_base_exception_from_the_producer_travels_too() -> None:
    def interrupted(stop: threading.Event) -> Iterator[int]:
        yield 1
        raise KeyboardInterrupt

    prefetcher: Prefetcher[int] = Prefetcher(interrupted, depth=1, name="ddbloader-test-base", timeout=5)
    assert next(prefetcher) == 1
    with pytest.raises(KeyboardInterrupt):
        next(prefetcher)
    assert wait_until(lambda: not _named("ddbloader-test-base"), 2)


@pytest.mark.parametrize("depth", [1, 3])
def test_close_while_the_producer_is_blocked_on_a_full_queue(depth: int) -> None:
    producer = Recorder(count=None)
    prefetcher: Prefetcher[int] = Prefetcher(producer, depth=depth, name="ddbloader-test-full", timeout=5)
    assert wait_until(lambda: producer.produced == depth + 1)
    time.sleep(0.2)
    assert producer.produced == depth + 1, "the producer should be blocked on the full queue"
    assert prefetcher.ready() == depth
    (thread,) = _named("ddbloader-test-full")
    started = time.monotonic()
    prefetcher.close()
    assert time.monotonic() - started < 1.0
    assert not thread.is_alive()
    assert producer.finalised.is_set(), "the producer's finally must run on close"
    assert prefetcher.ready() == 0, "no batch may stay behind after close"
    with pytest.raises(StopIteration):
        next(prefetcher)


def test_close_is_idempotent_and_inline_close_finalises_the_producer() -> None:
    producer = Recorder(count=None)
    prefetcher: Prefetcher[int] = Prefetcher(producer, depth=0, name="ddbloader-test-idem", timeout=5)
    assert next(prefetcher) == 1
    prefetcher.close()
    prefetcher.close()
    assert producer.finalised.is_set()
    with pytest.raises(StopIteration):
        next(prefetcher)


def test_close_sets_the_stop_event_the_producer_sees() -> None:
    seen = threading.Event()

    def watcher(stop: threading.Event) -> Iterator[int]:
        yield 1
        while not stop.wait(0.01):
            pass
        seen.set()
        raise Stopped

    prefetcher: Prefetcher[int] = Prefetcher(watcher, depth=1, name="ddbloader-test-stop", timeout=5)
    assert next(prefetcher) == 1
    prefetcher.close()
    assert seen.is_set()
    assert not _named("ddbloader-test-stop")


def test_slow_producer_times_out_naming_the_thread() -> None:
    release = threading.Event()

    def stuck(stop: threading.Event) -> Iterator[int]:
        release.wait(10)
        yield 1

    prefetcher: Prefetcher[int] = Prefetcher(stuck, depth=1, name="ddbloader-test-slow", timeout=0.3)
    started = time.monotonic()
    try:
        with pytest.raises(TimeoutError, match=r"ddbloader-test-slow.*0\.3 s"):
            next(prefetcher)
        assert 0.3 <= time.monotonic() - started < 2.0
    finally:
        release.set()
        prefetcher.close()
    assert not _named("ddbloader-test-slow")


def test_close_from_a_worker_thread_stops_without_joining() -> None:
    # A garbage collection in a worker may run a consumer's finalizer there; joining the
    # producer from that thread could wait on a producer that is waiting on the worker.
    finished = threading.Event()

    def slow_to_notice(stop: threading.Event) -> Iterator[int]:
        yield 1
        while not stop.is_set():
            time.sleep(0.01)
        time.sleep(0.5)
        finished.set()

    prefetcher: Prefetcher[int] = Prefetcher(slow_to_notice, depth=1, name="ddbloader-test-gc", timeout=5)
    assert next(prefetcher) == 1
    took: list[float] = []

    def close_in_worker() -> None:
        started = time.monotonic()
        prefetcher.close()
        took.append(time.monotonic() - started)

    start_thread(close_in_worker, name="ddbloader-test-closer").join(5)
    assert took and took[0] < 0.3
    assert not finished.is_set()
    assert wait_until(finished.is_set, 3)
    assert wait_until(lambda: not _named("ddbloader-test-gc"), 2)


class _Released:
    """An item that records the thread that drops the last reference to it."""

    def __init__(self, where: list[str]) -> None:
        self.where = where

    def __del__(self) -> None:
        self.where.append(threading.current_thread().name)


def test_items_the_consumer_let_go_are_released_in_the_producer_thread() -> None:
    # the consumer's thread must not free them: freeing a tensor gives the GIL to the producer,
    # which the consumer's take has just woken, and the consumer waits for it back
    released: list[str] = []

    def items(stop: threading.Event) -> Iterator[_Released]:
        for _ in range(8):
            yield _Released(released)

    prefetcher: Prefetcher[_Released] = Prefetcher(items, depth=1, name="ddbloader-test-release", timeout=5)
    item = next(prefetcher)
    for _ in range(5):
        item = next(prefetcher)  # rebinding lets the one before go, as a training loop does
    # items 1-4 went back with the room tokens of takes 3-6; the producer dropped those of 1-3
    # before its next items (it waits for room with item 4's token in hand)
    assert wait_until(lambda: len(released) >= 3, 2)
    assert released[:3] == ["ddbloader-test-release"] * 3
    del item
    prefetcher.close()
    assert len(released) == 8  # nothing is kept after close


# --- the consumer's thread or a thread of its own, by the consumer's steps ------------------------

STEP = 0.001  # a step a thread gains from: far above SHORT_STEP_SECONDS


def _consume(prefetcher: Prefetcher[int], count: int, step: float) -> list[int]:
    taken = []
    for _ in range(count):
        taken.append(next(prefetcher))
        if step:
            time.sleep(step)
    return taken


def test_a_consumer_that_only_takes_gets_the_iterator_in_its_own_thread() -> None:
    producer = Recorder(count=3 * JUDGED)
    prefetcher: Prefetcher[int] = Prefetcher(producer, depth=2, name="ddbloader-test-takes", timeout=5)
    assert list(prefetcher) == list(range(1, 3 * JUDGED + 1))
    assert producer.threads == {"ddbloader-test-takes", threading.current_thread().name}
    assert not _named("ddbloader-test-takes")
    assert producer.finalised.is_set()


def test_a_consumer_with_steps_keeps_the_thread() -> None:
    producer = Recorder(count=3 * JUDGED)
    prefetcher: Prefetcher[int] = Prefetcher(producer, depth=2, name="ddbloader-test-steps", timeout=5)
    assert _consume(prefetcher, 3 * JUDGED, STEP) == list(range(1, 3 * JUDGED + 1))
    assert producer.threads == {"ddbloader-test-steps"}
    prefetcher.close()


def test_the_iterator_moves_back_to_a_thread_when_steps_grow_and_nothing_is_lost() -> None:
    producer = Recorder(count=None)
    name = "ddbloader-test-back"
    prefetcher: Prefetcher[int] = Prefetcher(producer, depth=2, name=name, timeout=5)
    try:
        first = _consume(prefetcher, 3 * JUDGED, 0)
        assert not _named(name) and prefetcher.ready() == 0  # in this thread now
        produced_inline = producer.produced
        second = _consume(prefetcher, 2 * JUDGED, STEP)
        assert _named(name)  # a thread again
        assert first + second == list(range(1, 5 * JUDGED + 1))
        assert producer.produced > produced_inline
    finally:
        prefetcher.close()
    assert producer.finalised.is_set()
    assert wait_until(lambda: not _named(name), 2)


def test_a_failure_after_the_move_is_raised_as_it_was() -> None:
    producer = Recorder(count=None, fail_after=3 * JUDGED)
    prefetcher: Prefetcher[int] = Prefetcher(producer, depth=2, name="ddbloader-test-moved-error", timeout=5)
    assert _consume(prefetcher, 3 * JUDGED, 0) == list(range(1, 3 * JUDGED + 1))
    assert not _named("ddbloader-test-moved-error")
    with pytest.raises(ProducerError, match=f"failed after {3 * JUDGED} items"):
        next(prefetcher)
    assert producer.finalised.is_set()


def test_close_after_the_move_closes_the_iterator() -> None:
    producer = Recorder(count=None)
    prefetcher: Prefetcher[int] = Prefetcher(producer, depth=2, name="ddbloader-test-moved-close", timeout=5)
    _consume(prefetcher, 3 * JUDGED, 0)
    assert not _named("ddbloader-test-moved-close")
    prefetcher.close()
    assert producer.finalised.is_set()
    with pytest.raises(StopIteration):
        next(prefetcher)


def test_an_iterator_handed_back_as_another_thread_closes_is_closed() -> None:
    """The hand-back races a close() from another thread: the iterator must not outlive it."""
    producer = Recorder(count=None)
    prefetcher: Prefetcher[int] = Prefetcher(producer, depth=2, name="ddbloader-test-race", timeout=5)
    items = producer(threading.Event())
    next(items)
    prefetcher.close()
    with pytest.raises(StopIteration):
        prefetcher._resume_inline(_Paused(items))
    assert producer.finalised.is_set()
