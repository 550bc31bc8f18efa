"""Point gets answered on the server's event loop: the common answer (a key read from this
member's own store, 200) without the hop to a worker thread.

A RocksDB point get takes microseconds; handing it to a worker thread (Starlette's
``run_in_threadpool``: a future, a queue, two thread switches under the GIL) cost more CPU than the
read itself (benchmarks/RESULTS.md, 2026-11-29, "CPU per request"). But nothing that may wait may
run on the loop, or every other request waits with it. So the loop answers only a read that cannot wait:

* the topic's :class:`~materializer.serve.sources.TopicSource` says its readiness, view and reads
  touch nothing but memory and the local store (:attr:`~materializer.serve.sources.TopicSource.reads_on_loop`:
  a running Materializer's, or a view a user gives);
* the value format decodes without I/O (``bytes``, ``str``, ``json``; never ``avro``, which may ask
  the Schema Registry for a schema);
* the read finds a live value in a partition served here. It is made on a copy of the view that
  never asks the group coordinator who owns a partition (``owners`` None), so a refusal raises at
  once.

Anything else, a topic not ready, a refusal (another member's partition, one catching up, a
stale store), an absent key (whose answer looks for its tombstone in the local log) or any error,
gives None: the request is then read again in a worker thread as before, which answers, refuses,
forwards or fails exactly as it did. The loop only ever answers 200 with what the thread would
have answered; it never answers "absent" nor decides who owns a key.
"""

from __future__ import annotations

import copy
import dataclasses

from materializer.adapters.serdes import BytesSerde, JsonSerde, StrSerde
from materializer.serve.sources import TopicSource
from materializer.view import Entry, MaterializedView

__all__ = ["entry_on_loop"]

#: Serdes whose decode is in-memory work only (the classes themselves, not subclasses a user wrote).
_IN_MEMORY_SERDES = (BytesSerde, StrSerde, JsonSerde)


def entry_on_loop(source: TopicSource, key: bytes) -> tuple[MaterializedView, Entry] | None:
    """``key``'s live entry in ``source`` and the view it was read from, when that can be read
    without waiting (module docstring); None: read it in a worker thread. Never raises."""
    if not source.reads_on_loop:
        return None
    try:
        if source.readiness is not None and not source.readiness().ok:
            return None  # the thread answers 503 with the reasons
        view = source.view()
        if type(view.value_serde) not in _IN_MEMORY_SERDES or type(view.key_serde) is not BytesSerde:
            return None
        served = view.served
        if served is not None and served.owners is not None:
            view = copy.copy(view)  # the source's view may be shared: only this copy's `served` changes
            view.served = dataclasses.replace(served, owners=None)  # a refusal raises without asking the group
        entry = view.get_entry(key)
    except Exception:  # noqa: BLE001 - every refusal and failure is the worker thread's read to answer
        return None
    return None if entry is None else (view, entry)
