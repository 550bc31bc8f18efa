"""ApplyWorker: the replica path's background apply (bounds merged while it runs, failures handed
to the ingest thread, close dropping what is queued)."""

from __future__ import annotations

import threading

import pytest

from materializer.apply.worker import ApplyWorker


class _Gate:
    """An apply function that records its calls and blocks each one until released."""

    def __init__(self, fail_on_call: int | None = None) -> None:
        self.calls: list[dict[int, int]] = []
        self.entered = threading.Semaphore(0)
        self.release = threading.Semaphore(0)
        self.fail_on_call = fail_on_call

    def __call__(self, bounds: dict[int, int]) -> None:
        self.calls.append(dict(bounds))
        self.entered.release()
        assert self.release.acquire(timeout=10)
        if self.fail_on_call == len(self.calls):
            raise OSError(28, "No space left on device")


def test_bounds_submitted_while_an_apply_runs_are_merged_into_one_call() -> None:
    gate = _Gate()
    worker = ApplyWorker(gate)
    try:
        worker.submit({0: 10, 1: 5})
        assert gate.entered.acquire(timeout=10)  # the first apply runs and blocks
        worker.submit({0: 20})
        worker.submit({1: 7, 0: 15})  # a lower bound never lowers a queued one
        worker.submit({2: 3})
        gate.release.release()
        assert gate.entered.acquire(timeout=10)
        gate.release.release()
        worker.drain()
        assert gate.calls == [{0: 10, 1: 5}, {0: 20, 1: 7, 2: 3}]
    finally:
        gate.release.release()
        worker.close()


def test_drain_waits_for_the_apply_in_progress() -> None:
    gate = _Gate()
    worker = ApplyWorker(gate)
    drained = threading.Event()
    try:
        worker.submit({0: 1})
        assert gate.entered.acquire(timeout=10)
        waiter = threading.Thread(target=lambda: (worker.drain(), drained.set()))
        waiter.start()
        assert not drained.wait(0.2)  # still applying
        gate.release.release()
        assert drained.wait(10)
        waiter.join()
    finally:
        worker.close()


def test_a_failed_apply_is_raised_by_the_next_submit_and_drain_and_nothing_more_is_applied() -> None:
    gate = _Gate(fail_on_call=1)
    worker = ApplyWorker(gate)
    try:
        worker.submit({0: 10})
        assert gate.entered.acquire(timeout=10)
        worker.submit({0: 20})  # queued behind the apply that is about to fail
        gate.release.release()
        with pytest.raises(OSError, match="No space left"):
            worker.drain()
        with pytest.raises(OSError, match="No space left"):
            worker.submit({0: 30})
        assert gate.calls == [{0: 10}]  # the queued bound was dropped with the failure
    finally:
        worker.close()


def test_close_lets_the_running_apply_finish_and_drops_the_queue() -> None:
    gate = _Gate()
    worker = ApplyWorker(gate)
    worker.submit({0: 10})
    assert gate.entered.acquire(timeout=10)
    worker.submit({0: 20})
    closer = threading.Thread(target=worker.close)
    closer.start()
    gate.release.release()
    closer.join(10)
    assert not closer.is_alive()
    assert gate.calls == [{0: 10}]
    with pytest.raises(RuntimeError, match="closed"):
        worker.submit({0: 30})
    worker.close()  # idempotent
