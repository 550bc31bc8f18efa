"""The data directory (``DIR``): one owner per file in it, as Kafka Streams' ``StateDirectory``
owns its state directory. One module per concept, each imported by its own path:

* :mod:`~materializer.datadir.layout`: where each file and folder of ``DIR`` is (the whole layout);
* :mod:`~materializer.datadir.holder`: who holds ``DIR/.lock``, as its JSON says;
* :mod:`~materializer.datadir.lock`: one writer per data dir (:class:`~materializer.datadir.lock.DataDirLock`);
* :mod:`~materializer.datadir.markers`: whether each topic's data is complete;
* :mod:`~materializer.datadir.staging`: a topic built aside, then swapped in;
* :mod:`~materializer.datadir.swap`: the swap's point of no return, rolled forward by the next writer;
* :mod:`~materializer.datadir.identity`: is the local copy a copy of the cluster's topic (KIP-516)?
* :mod:`~materializer.datadir.formats`: the key/value formats a topic was materialized with;
* :mod:`~materializer.datadir.lease`: how current a topic's state store is.

Imports the standard library, the storage engine and :mod:`materializer.interrupts` (a swap's
renames run with signals deferred); ``identity`` also the adapters' ``StateStore`` and
``TopicIdChangedError``. Nothing of the composition above it: readers in Spark's planning
processes stay light.
"""
