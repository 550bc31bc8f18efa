"""One background thread that applies fsynced log stretches to the state store (replica path).

The replica path's round is: receive a Fetch response, append its batches, fsync, apply what
became stable to the store. Appending and applying touch different things (the log's files; the
store's SST files) and their native parts release the GIL, so :class:`ApplyWorker` runs the apply
on its own thread while the ingest thread receives and appends the next responses.

* **Bounds, not "whatever is there".** Each submission is ``partition -> offset``: the log's last
  stable offset taken *after* the fsync, so the store never holds a record whose batch is not
  durable, even though the ingest thread keeps appending above the bound.
* **Coalescing.** Submissions made while an apply runs are merged (highest bound per partition)
  and applied in one call: a cold start applies a few large stretches instead of one per
  response, so the store sorts and writes fewer, larger SST files.
* **Failures** are raised in the ingest thread by the next :meth:`submit` or :meth:`drain`; the
  worker applies nothing after one.

A broker has no such thread (it does not materialize); the split resembles Kafka Streams' state
updater (``StateUpdater``, ``DefaultStateUpdater``), which restores state stores on a thread of
its own while the stream thread keeps processing.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping

__all__ = ["ApplyWorker"]


class ApplyWorker:
    """Run ``apply(bounds)`` on one thread, merging the bounds submitted while it runs.

    Args:
        apply: called with ``{partition: end offset (exclusive)}``; applies each partition's stretch
            from its store offset up to that end (the caller owns store offsets and statistics).
        name: the thread's name.

    Thread safety: :meth:`submit`, :meth:`drain` and :meth:`close` are for one (the ingest) thread;
    ``apply`` runs only on the worker thread, never twice at once.
    """

    def __init__(self, apply: Callable[[dict[int, int]], None], name: str = "materializer-apply") -> None:
        self._apply = apply
        self._condition = threading.Condition()
        self._pending: dict[int, int] = {}
        self._busy = False
        self._closing = False
        self._failure: BaseException | None = None
        self.busy_s = 0.0  # seconds spent inside apply (worker thread)
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def submit(self, bounds: Mapping[int, int]) -> None:
        """Queue ``bounds`` (partition -> end offset), merged with what is queued (highest wins).

        Raises:
            BaseException: the error an earlier apply raised (the worker has stopped applying).
            RuntimeError: the worker is closed.
        """
        with self._condition:
            self._raise_failure()
            if self._closing:
                raise RuntimeError("the apply worker is closed")
            for partition, end in bounds.items():
                if end > self._pending.get(partition, -1):
                    self._pending[partition] = end
            self._condition.notify_all()

    def is_current_thread(self) -> bool:
        """Whether the caller runs on this worker's thread (inside an apply)."""
        return threading.current_thread() is self._thread

    def drain(self) -> None:
        """Wait until everything submitted so far is applied.

        Raises:
            BaseException: the error an apply raised (then nothing more is applied).
        """
        with self._condition:
            while (self._pending or self._busy) and self._failure is None:
                self._condition.wait()
            self._raise_failure()

    def close(self) -> None:
        """Let the apply in progress finish, drop what is queued (the next start replays it from the
        local log) and stop the thread. Idempotent; raises nothing."""
        with self._condition:
            self._closing = True
            self._pending.clear()
            self._condition.notify_all()
        if self._thread is not threading.current_thread():
            self._thread.join()

    def _raise_failure(self) -> None:
        if self._failure is not None:
            raise self._failure

    def _loop(self) -> None:
        while True:
            with self._condition:
                while not self._pending and not self._closing:
                    self._condition.wait()
                if self._closing:
                    return
                bounds, self._pending = self._pending, {}
                self._busy = True
            started = time.monotonic()
            try:
                self._apply(bounds)
            except BaseException as exc:  # noqa: BLE001 - handed to the ingest thread
                with self._condition:
                    self._failure = exc
                    self._busy = False
                    self._pending.clear()
                    self._condition.notify_all()
                return
            finally:
                self.busy_s += time.monotonic() - started
            with self._condition:
                self._busy = False
                self._condition.notify_all()
