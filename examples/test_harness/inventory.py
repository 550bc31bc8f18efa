"""A small application to test: stock levels per SKU, kept from a compacted Kafka topic.

Producers write ``sku -> quantity`` (UTF-8 text) to a topic with ``cleanup.policy=compact``; a
discontinued SKU is a tombstone (null value). :class:`Inventory` materializes the topic into a
local data directory with kafka-materializer and answers :meth:`Inventory.stock` from RocksDB.
A restart reopens the same data directory and fetches only what was produced since.

``test_inventory.py`` next to this file tests it with the pytest fixtures of kafka-materializer.
"""

from __future__ import annotations

from pathlib import Path

from materializer.config import MaterializerOptions
from materializer.materializer import Materializer

TOPIC_CONFIG = {"cleanup.policy": "compact"}


class Inventory:
    """Stock levels of ``topic`` materialized into ``data_dir``.

    Args:
        bootstrap_servers: ``host:port`` of the Kafka cluster.
        topic: the compacted stock topic (key = SKU, value = quantity as text).
        data_dir: where the local Kafka-format log and the RocksDB store live.
    """

    def __init__(self, bootstrap_servers: str, topic: str, data_dir: Path) -> None:
        self.materializer = Materializer(bootstrap_servers, topic, data_dir,
                                         options=MaterializerOptions(progress=False, poll_timeout_ms=200,
                                                                     key_format="str", value_format="str"))

    def refresh(self) -> int:
        """Fetch everything produced so far; returns the records fetched by this call."""
        before = self.materializer.stats.records_fetched
        self.materializer.start()
        return self.materializer.run(until_caught_up=True).records_fetched - before

    def stock(self, sku: str) -> int | None:
        """Quantity of ``sku``, or None when it was never stocked or is discontinued (tombstone)."""
        value = self.materializer.view().get(sku)
        return None if value is None else int(value)

    def close(self) -> None:
        """Flush and close the local log and store."""
        self.materializer.close()
