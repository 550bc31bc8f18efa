"""A continuous ``Materializer.run()`` in a thread, and waiting for a condition, for the tests that
change the broker or the topic while a run goes on."""

from __future__ import annotations

import threading
import time
from typing import Callable, TypeVar

from materializer import Materializer

__all__ = ["BackgroundRun", "wait_until"]

_T = TypeVar("_T")


def wait_until(condition: Callable[[], _T], timeout_s: float, what: str) -> _T:
    """Poll ``condition`` every 0.1 s until it returns a true value, and return that value.

    Raises:
        AssertionError: not true within ``timeout_s`` seconds (naming ``what``).
    """
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


class BackgroundRun:
    """``materializer.run()`` (continuous) in a daemon thread; :meth:`stop` ends it and raises the
    error it ended with, if any."""

    def __init__(self, materializer: Materializer):
        self.materializer = materializer
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.materializer.run()
        except BaseException as exc:  # noqa: BLE001 - reported by stop()
            self.error = exc

    def log_end_offsets(self) -> dict[int, int]:
        """Partition -> local log end offset now."""
        return {p: log.log_end_offset for p, log in dict(self.materializer.logs).items()}

    def stop(self) -> None:
        """Stop the run and wait for it (60 s at most).

        Raises:
            AssertionError: the run did not return.
            BaseException: what the run raised.
        """
        self.materializer.stop()
        self.thread.join(60)
        assert not self.thread.is_alive(), "run() did not return after stop()"
        if self.error is not None:
            raise self.error
