"""Which kept partitions a group member lets go (materializer.group.kept): by time since their
release (Kafka Streams' state.cleanup.delay.ms) and by the bytes all kept folders hold together."""

from __future__ import annotations

import os
from pathlib import Path

from materializer.group.kept import KeptPartition, expired, kept_partitions, mark_released

NOW = 1_000_000_000


def _kept(partition: int, age_ms: int, size: int) -> KeptPartition:
    return KeptPartition(partition, Path(f"t-{partition}"), NOW - age_ms, size)


def test_by_time_a_partition_goes_once_the_retention_passed_since_its_release() -> None:
    kept = [_kept(3, 9_000, 10), _kept(1, 5_000, 10), _kept(2, 4_999, 10)]
    assert [k.partition for k in expired(kept, 5_000, -1, NOW)] == [3, 1]
    assert expired(kept, -1, -1, NOW) == []  # no bound at all
    assert [k.partition for k in expired(kept, 0, -1, NOW)] == [3, 1, 2]  # 0: at once


def test_by_bytes_the_oldest_releases_go_first_until_the_rest_fits() -> None:
    kept = [_kept(3, 9_000, 100), _kept(1, 5_000, 50), _kept(2, 10, 70)]
    assert [k.partition for k in expired(kept, -1, 120, NOW)] == [3]  # 50 + 70 = 120 fit
    assert [k.partition for k in expired(kept, -1, 119, NOW)] == [3, 1]
    assert [k.partition for k in expired(kept, -1, 0, NOW)] == [3, 1, 2]
    assert expired(kept, -1, 220, NOW) == []
    # both bounds: what time let go no longer counts against the bytes
    assert [k.partition for k in expired(kept, 6_000, 70, NOW)] == [3, 1]


def test_kept_partitions_lists_folders_not_held_oldest_release_first(tmp_path: Path) -> None:
    for partition, size in ((0, 5), (1, 7), (2, 11), (10, 3)):
        folder = tmp_path / f"t-{partition}"
        folder.mkdir()
        (folder / "00000000000000000000.log").write_bytes(b"x" * size)
    (tmp_path / "other-1").mkdir()
    (tmp_path / "t-3.0123456789abcdef0123456789abcdef-delete").mkdir()  # not a partition folder
    os.utime(tmp_path / "t-2", (NOW / 1000 - 60, NOW / 1000 - 60))
    os.utime(tmp_path / "t-1", (NOW / 1000 - 30, NOW / 1000 - 30))
    os.utime(tmp_path / "t-10", (NOW / 1000 - 10, NOW / 1000 - 10))
    kept = kept_partitions(tmp_path, "t", held={0})
    assert [(k.partition, k.size_bytes) for k in kept] == [(2, 11), (1, 7), (10, 3)]
    assert kept[0].released_ms == NOW - 60_000 and kept[0].folder == tmp_path / "t-2"
    mark_released([tmp_path / "t-2", tmp_path / "t-99"])  # a vanished folder is skipped
    assert [k.partition for k in kept_partitions(tmp_path, "t", held={0})] == [1, 10, 2]
