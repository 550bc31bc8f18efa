"""TopicLogs (Kafka LogManager for one topic) and update_offset_checkpoint."""

from __future__ import annotations

import fcntl

from pathlib import Path

import pytest

from materializer.storage.checkpoint import (
    CLEANER_OFFSET_CHECKPOINT,
    LOG_START_OFFSET_CHECKPOINT,
    RECOVERY_POINT_CHECKPOINT,
    read_offset_checkpoint,
    update_offset_checkpoint,
    write_offset_checkpoint,
)
from materializer.storage.errors import CorruptCheckpointError
from materializer.storage.log import Log
from materializer.storage.log_config import LogConfig
from materializer.storage.log_loader import CLEAN_SHUTDOWN_FILE, write_clean_shutdown_file
from materializer.storage.log_manager import TopicLogs
from materializer.storage.record_batch_builder import RecordBatchBuilder

TOPIC = "orders"


def _append(log: Log, count: int) -> None:
    builder = RecordBatchBuilder(log.log_end_offset)
    for i in range(count):
        builder.append(log.log_end_offset + i, 1_000 + i, b"k%d" % i, b"v")
    log.append_batch(builder.build())


class TestUpdateOffsetCheckpoint:
    def test_merges_and_keeps_other_entries(self, tmp_path: Path) -> None:
        path = tmp_path / "cp"
        write_offset_checkpoint(path, {("other", 0): 5, (TOPIC, 0): 1, (TOPIC, 9): 3})
        result = update_offset_checkpoint(path, {(TOPIC, 0): 7, (TOPIC, 1): 8}, remove=[(TOPIC, 9)])
        assert result == {("other", 0): 5, (TOPIC, 0): 7, (TOPIC, 1): 8}
        assert read_offset_checkpoint(path) == result
        assert (tmp_path / "cp.lock").exists()

    def test_remove_predicate_and_conditional_update(self, tmp_path: Path) -> None:
        path = tmp_path / "cp"
        write_offset_checkpoint(path, {("a", 0): 50, ("b", 0): 5})
        update_offset_checkpoint(path, lambda cur: {("a", 0): 10} if cur.get(("a", 0), 0) > 10 else {},
                                 remove=lambda tp: tp[0] == "b")
        assert read_offset_checkpoint(path) == {("a", 0): 10}

    def test_conditional_update_that_changes_nothing_creates_no_file(self, tmp_path: Path) -> None:
        update_offset_checkpoint(tmp_path / "cp", lambda cur: {})
        assert not (tmp_path / "cp").exists()
        update_offset_checkpoint(tmp_path / "cp2", {})
        assert read_offset_checkpoint(tmp_path / "cp2") == {}

    def test_corrupt_file_raises_or_is_replaced(self, tmp_path: Path) -> None:
        path = tmp_path / "cp"
        path.write_text("0\n2\nx 0 1\n")
        with pytest.raises(CorruptCheckpointError):
            update_offset_checkpoint(path, {(TOPIC, 0): 1})
        update_offset_checkpoint(path, {(TOPIC, 0): 1}, replace_corrupt=True)
        assert read_offset_checkpoint(path) == {(TOPIC, 0): 1}


class TestTopicLogs:
    def test_open_close_round_trip(self, tmp_path: Path) -> None:
        with TopicLogs.open(tmp_path, TOPIC, [0, 1], LogConfig()) as topic_logs:
            assert sorted(topic_logs.logs) == [0, 1]
            assert not topic_logs.had_clean_shutdown
            _append(topic_logs.logs[0], 3)
            topic_logs.logs[1].truncate_fully_and_start_at(40)
        assert read_offset_checkpoint(tmp_path / RECOVERY_POINT_CHECKPOINT) == {(TOPIC, 0): 3, (TOPIC, 1): 40}
        assert read_offset_checkpoint(tmp_path / LOG_START_OFFSET_CHECKPOINT) == {(TOPIC, 0): 0, (TOPIC, 1): 40}
        assert (tmp_path / CLEAN_SHUTDOWN_FILE).exists()
        with TopicLogs.open(tmp_path, TOPIC, [0, 1], LogConfig()) as again:
            assert again.had_clean_shutdown
            assert again.logs[0].log_end_offset == 3
            assert again.logs[1].log_start_offset == 40

    def test_a_removed_partition_keeps_its_folder_and_reopens_where_it_ended(self, tmp_path: Path) -> None:
        with TopicLogs.open(tmp_path, TOPIC, [0, 1], LogConfig()) as topic_logs:
            _append(topic_logs.logs[1], 4)
            topic_logs.logs[1].maybe_increment_log_start_offset(2)
            topic_logs.remove_partition(1)
            assert sorted(topic_logs.logs) == [0]
            assert (tmp_path / f"{TOPIC}-1").is_dir()
            # checkpointed at removal: a reopen recovers nothing and keeps the log start offset
            assert read_offset_checkpoint(tmp_path / RECOVERY_POINT_CHECKPOINT)[(TOPIC, 1)] == 4
            assert read_offset_checkpoint(tmp_path / LOG_START_OFFSET_CHECKPOINT)[(TOPIC, 1)] == 2
            with pytest.raises(KeyError):
                topic_logs.remove_partition(1)
            log = topic_logs.add_partition(1)
            assert (log.log_start_offset, log.log_end_offset, log.recovery_truncations) == (2, 4, [])
            _append(log, 1)
        with TopicLogs.open(tmp_path, TOPIC, [0, 1], LogConfig()) as again:
            assert again.had_clean_shutdown and again.logs[1].log_end_offset == 5

    def test_a_deleted_partition_leaves_no_folder_and_no_checkpoint_entries(self, tmp_path: Path) -> None:
        write_offset_checkpoint(tmp_path / CLEANER_OFFSET_CHECKPOINT, {(TOPIC, 1): 3, (TOPIC, 0): 1, ("other", 1): 7})
        with TopicLogs.open(tmp_path, TOPIC, [0, 1], LogConfig()) as topic_logs:
            _append(topic_logs.logs[1], 4)
            _append(topic_logs.logs[0], 2)
            topic_logs.checkpoint()
            with pytest.raises(ValueError, match="is open"):
                topic_logs.delete_partition(1)
            topic_logs.remove_partition(1)
            assert topic_logs.delete_partition(1)
            assert not topic_logs.delete_partition(1)  # nothing left to delete
            assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == [f"{TOPIC}-0"]  # no *-delete left
            for name in (RECOVERY_POINT_CHECKPOINT, LOG_START_OFFSET_CHECKPOINT, CLEANER_OFFSET_CHECKPOINT):
                entries = read_offset_checkpoint(tmp_path / name)
                assert (TOPIC, 1) not in entries and (TOPIC, 0) in entries, name
            assert read_offset_checkpoint(tmp_path / CLEANER_OFFSET_CHECKPOINT)[("other", 1)] == 7
            log = topic_logs.add_partition(1)  # a later log of the partition starts from nothing
            assert (log.log_start_offset, log.log_end_offset) == (0, 0)
        with TopicLogs.open(tmp_path, TOPIC, [0, 1], LogConfig()) as again:
            assert again.had_clean_shutdown and again.logs[0].log_end_offset == 2

    def test_marker_removed_while_open_and_written_on_close(self, tmp_path: Path) -> None:
        write_clean_shutdown_file(tmp_path)
        topic_logs = TopicLogs.open(tmp_path, TOPIC, [0], LogConfig())
        assert topic_logs.had_clean_shutdown
        assert not (tmp_path / CLEAN_SHUTDOWN_FILE).exists()
        topic_logs.close()
        topic_logs.close()  # idempotent
        assert (tmp_path / CLEAN_SHUTDOWN_FILE).exists()
        assert topic_logs.logs == {}

    def test_other_topics_entries_are_kept(self, tmp_path: Path) -> None:
        for name in (RECOVERY_POINT_CHECKPOINT, LOG_START_OFFSET_CHECKPOINT):
            write_offset_checkpoint(tmp_path / name, {("other", 0): 12, (TOPIC, 0): 0})
        with TopicLogs.open(tmp_path, TOPIC, [0], LogConfig()) as topic_logs:
            _append(topic_logs.logs[0], 2)
        assert read_offset_checkpoint(tmp_path / RECOVERY_POINT_CHECKPOINT) == {("other", 0): 12, (TOPIC, 0): 2}
        assert read_offset_checkpoint(tmp_path / LOG_START_OFFSET_CHECKPOINT) == {("other", 0): 12, (TOPIC, 0): 0}

    def test_corrupt_checkpoint_is_ignored_on_open_and_replaced(self, tmp_path: Path) -> None:
        with TopicLogs.open(tmp_path, TOPIC, [0], LogConfig()) as topic_logs:
            _append(topic_logs.logs[0], 4)
        (tmp_path / RECOVERY_POINT_CHECKPOINT).write_text("7\n")
        with TopicLogs.open(tmp_path, TOPIC, [0], LogConfig()) as topic_logs:
            assert topic_logs.logs[0].log_end_offset == 4
        assert read_offset_checkpoint(tmp_path / RECOVERY_POINT_CHECKPOINT) == {(TOPIC, 0): 4}

    def test_recovery_after_unclean_open(self, tmp_path: Path) -> None:
        topic_logs = TopicLogs.open(tmp_path, TOPIC, [0], LogConfig())
        _append(topic_logs.logs[0], 5)
        topic_logs.logs[0].flush()
        log_path = topic_logs.logs[0].active_segment.log_path
        topic_logs.abandon()  # as if the process died: no checkpoints, no marker
        assert not (tmp_path / CLEAN_SHUTDOWN_FILE).exists()
        with open(log_path, "ab") as f:
            f.write(b"\x00\x00\x00\x00\x00\x00\x00\x05\x00\x00\x01\x00torn")  # a torn batch at the tail
        with TopicLogs.open(tmp_path, TOPIC, [0], LogConfig()) as again:
            assert not again.had_clean_shutdown
            log = again.logs[0]
            assert log.log_end_offset == 5
            assert log.recovery_truncations
        assert (tmp_path / CLEAN_SHUTDOWN_FILE).exists()

    def test_exception_in_block_writes_neither_checkpoints_nor_marker(self, tmp_path: Path) -> None:
        with pytest.raises(RuntimeError):
            with TopicLogs.open(tmp_path, TOPIC, [0], LogConfig()) as topic_logs:
                _append(topic_logs.logs[0], 1)
                raise RuntimeError("boom")
        assert not (tmp_path / RECOVERY_POINT_CHECKPOINT).exists()
        assert not (tmp_path / CLEAN_SHUTDOWN_FILE).exists()

    def test_marker_not_written_when_other_topic_logs_were_unclean(self, tmp_path: Path) -> None:
        (tmp_path / "other-0").mkdir()  # another topic's log, no marker: it may need recovery
        with TopicLogs.open(tmp_path, TOPIC, [0], LogConfig()):
            pass
        assert not (tmp_path / CLEAN_SHUTDOWN_FILE).exists()
        assert read_offset_checkpoint(tmp_path / RECOVERY_POINT_CHECKPOINT) == {(TOPIC, 0): 0}

    def test_unopened_folders_of_the_topic_count_as_ours_unless_left_by_an_unclean_shutdown(
            self, tmp_path: Path) -> None:
        # A consumer-group member opens only its assigned partitions: after a clean shutdown the
        # kept folders of the others do not stop the marker from being written again.
        with TopicLogs.open(tmp_path, TOPIC, [0, 1, 2], LogConfig()):
            pass
        with TopicLogs.open(tmp_path, TOPIC, [0], LogConfig()) as topic_logs:
            assert topic_logs.had_clean_shutdown
        (tmp_path / CLEAN_SHUTDOWN_FILE).unlink()  # as after a crash
        topic_logs = TopicLogs.open(tmp_path, TOPIC, [0], LogConfig())
        topic_logs.close()  # 1 and 2 were neither opened nor recovered: no marker
        assert not (tmp_path / CLEAN_SHUTDOWN_FILE).exists()
        with TopicLogs.open(tmp_path, TOPIC, [0], LogConfig()) as topic_logs:
            topic_logs.add_partition(1)
            topic_logs.remove_partition(1)  # recovered when opened; 2 still not
        assert not (tmp_path / CLEAN_SHUTDOWN_FILE).exists()
        with TopicLogs.open(tmp_path, TOPIC, [0, 1], LogConfig()) as topic_logs:
            topic_logs.add_partition(2)
        assert (tmp_path / CLEAN_SHUTDOWN_FILE).exists()

    def test_topics_open_in_one_process_share_the_marker(self, tmp_path: Path) -> None:
        # Several topics of one process (a TopicSet) act as one owner, as a broker's logs do: the
        # first open reads the marker for all of them, the last close writes it back.
        write_clean_shutdown_file(tmp_path)
        first = TopicLogs.open(tmp_path, "a", [0], LogConfig())
        second = TopicLogs.open(tmp_path, "b", [0], LogConfig())
        assert first.had_clean_shutdown and second.had_clean_shutdown
        assert not (tmp_path / CLEAN_SHUTDOWN_FILE).exists()  # logs open for writing
        first.close()  # "b" still has its logs open
        assert not (tmp_path / CLEAN_SHUTDOWN_FILE).exists()
        second.close()
        assert (tmp_path / CLEAN_SHUTDOWN_FILE).exists()
        for _ in range(2):  # and again: no recovery on the next start either
            first = TopicLogs.open(tmp_path, "a", [0], LogConfig())
            with TopicLogs.open(tmp_path, "b", [0], LogConfig()) as second:
                assert first.had_clean_shutdown and second.had_clean_shutdown
            first.close()
            assert (tmp_path / CLEAN_SHUTDOWN_FILE).exists()

    def test_a_crash_of_one_topic_keeps_the_marker_away_for_all(self, tmp_path: Path) -> None:
        write_clean_shutdown_file(tmp_path)
        first = TopicLogs.open(tmp_path, "a", [0], LogConfig())
        second = TopicLogs.open(tmp_path, "b", [0], LogConfig())
        second.abandon()  # as if it died
        first.close()
        assert not (tmp_path / CLEAN_SHUTDOWN_FILE).exists()
        with TopicLogs.open(tmp_path, "a", [0], LogConfig()) as again:
            assert not again.had_clean_shutdown

    def test_logs_never_closed_count_as_a_crash_once_collected(self, tmp_path: Path) -> None:
        import gc

        write_clean_shutdown_file(tmp_path)
        leaked = TopicLogs.open(tmp_path, "a", [0], LogConfig())
        for log in leaked.logs.values():
            log.close()
        del leaked, log
        gc.collect()  # no close, no abandon: its open count goes with it
        with TopicLogs.open(tmp_path, "b", [0], LogConfig()) as second:
            assert not second.had_clean_shutdown  # the marker is read again (gone since "a" opened)
        assert not (tmp_path / CLEAN_SHUTDOWN_FILE).exists()  # "a-0" was not recovered by anyone

    def test_marker_not_written_while_another_process_has_logs_open(self, tmp_path: Path) -> None:
        write_clean_shutdown_file(tmp_path)
        with open(tmp_path / (CLEAN_SHUTDOWN_FILE + ".lock"), "a+b") as other:  # its own open file: as another process
            fcntl.flock(other.fileno(), fcntl.LOCK_SH)
            with TopicLogs.open(tmp_path, "a", [0], LogConfig()) as topic_logs:
                assert topic_logs.had_clean_shutdown
            assert not (tmp_path / CLEAN_SHUTDOWN_FILE).exists()
