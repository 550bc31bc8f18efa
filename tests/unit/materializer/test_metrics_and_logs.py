"""Issue "Metrics and logs": the JSON and text log formats, the metrics of a Materializer (against
the fake source; the broker test is tests/integration/test_metrics.py), the error when
prometheus_client is missing, and the progress bars' --progress/--no-progress flags."""

from __future__ import annotations

import io
import json
import logging
import re
import subprocess
import sys
import time

import pytest
from click.testing import CliRunner

import materializer.cli as cli_module
from materializer.adapters.rocksdb_store import StateStoreOptions, StoreMemory
from materializer.cli import EXIT_FAILURE, main
from materializer.config import MaterializerOptions
from materializer.log_format import IsoUtcFormatter, JsonFormatter, TEXT_FORMAT
from materializer.materializer import Materializer
from materializer.metrics import METRICS, MaterializerMetrics, MetricsUnavailableError
from tests.tmpfs import fill, mounted_tmpfs

from .test_materializer import TOPIC, _produce, fake_source  # noqa: F401 - fixture

prometheus_parser = pytest.importorskip("prometheus_client.parser")

ISO_UTC = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z"


def _logger_into(stream: io.StringIO, formatter: logging.Formatter) -> logging.Logger:
    logger = logging.getLogger(f"test-log-format-{id(stream)}")
    logger.propagate = False
    logger.setLevel(logging.DEBUG)
    handler = logging.StreamHandler(stream)
    handler.setFormatter(formatter)
    logger.addHandler(handler)
    return logger


def test_json_formatter_writes_one_object_per_line():
    stream = io.StringIO()
    logger = _logger_into(stream, JsonFormatter())
    logger.info("fetched %d records from %s", 3, "t-0")
    logger.warning("two\nlines and non-ASCII: é")
    try:
        raise ValueError("boom")
    except ValueError:
        logger.exception("failed at offset %d", 7)
    lines = stream.getvalue().splitlines()
    assert len(lines) == 3
    entries = [json.loads(line) for line in lines]  # every line parses on its own
    for entry in entries:
        assert set(entry) >= {"ts", "level", "logger", "message"}
        assert re.fullmatch(ISO_UTC, entry["ts"])
        assert entry["logger"] == logger.name
    assert [e["level"] for e in entries] == ["INFO", "WARNING", "ERROR"]
    assert entries[0]["message"] == "fetched 3 records from t-0"
    assert entries[1]["message"] == "two\nlines and non-ASCII: é"
    assert entries[2]["message"] == "failed at offset 7"
    assert "exc_info" not in entries[0]
    assert entries[2]["exc_info"].startswith("Traceback") and "ValueError: boom" in entries[2]["exc_info"]


def test_text_formatter_starts_with_an_iso_utc_timestamp():
    stream = io.StringIO()
    logger = _logger_into(stream, IsoUtcFormatter(TEXT_FORMAT))
    logger.warning("hello %s", "world")
    line = stream.getvalue().rstrip("\n")
    assert re.fullmatch(ISO_UTC + rf" materializer: WARNING {re.escape(logger.name)}: hello world", line)


def test_cli_log_format_json_in_a_fresh_process():
    # pytest's own handlers sit on the root logger here, so the command's configuration is
    # checked in a child process, exactly as `materializer --log-format json -v ...` sets it up.
    code = ("import logging\n"
            "from materializer.cli import _configure_logging\n"
            "_configure_logging(True, False, 'json')\n"
            "logging.getLogger('materializer.x').info('ready %d', 1)\n"
            "logging.getLogger('materializer.x').debug('not shown without --debug')\n"
            "try:\n    1 / 0\nexcept ZeroDivisionError:\n    logging.getLogger('materializer.x').exception('bad')\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    entries = [json.loads(line) for line in result.stderr.splitlines()]
    assert [(e["level"], e["message"]) for e in entries] == [("INFO", "ready 1"), ("ERROR", "bad")]
    assert "ZeroDivisionError" in entries[1]["exc_info"]


def test_log_format_option_and_environment_variable(monkeypatch, tmp_path):
    seen = []
    monkeypatch.setattr(cli_module, "_configure_logging", lambda verbose, debug, log_format: seen.append(log_format))
    args = ["export", "--data-dir", str(tmp_path), "--topic", "nope"]
    CliRunner().invoke(main, ["--log-format", "json", *args])
    CliRunner().invoke(main, args, env={"MATERIALIZER_LOG_FORMAT": "json"})
    CliRunner().invoke(main, args)
    assert seen == ["json", "json", "text"]
    bad = CliRunner().invoke(main, ["--log-format", "xml", *args])
    assert bad.exit_code == 2 and "xml" in bad.output


def _without_prometheus_client(monkeypatch):
    for name in ("prometheus_client", "prometheus_client.core"):
        monkeypatch.setitem(sys.modules, name, None)  # `import prometheus_client` raises ImportError


def test_metrics_port_without_prometheus_client_runs_with_health_only(monkeypatch, tmp_path, caplog):
    """Without prometheus_client, --metrics-port still serves the health probes (Kubernetes needs
    them more than metrics): the run goes on (here to the absent broker's error) after one warning
    naming the extra; /metrics then answers 503 (tests/unit/materializer/test_health.py)."""
    _without_prometheus_client(monkeypatch)
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    result = CliRunner().invoke(main, ["run", "--bootstrap-servers", "127.0.0.1:1", "--topic", "t", "--data-dir",
                                       str(tmp_path / "data"), "--until-caught-up", "--timeout", "1",
                                       "--metrics-port", str(port)])
    assert result.exit_code == EXIT_FAILURE and "cannot read metadata" in result.stderr
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("pip install 'kafka-materializer[metrics]'" in w and "serving only /health/live" in w
               for w in warnings), warnings
    with pytest.raises(MetricsUnavailableError, match=r"kafka-materializer\[metrics\]"):
        MaterializerMetrics(Materializer("127.0.0.1:1", "t", tmp_path))


def test_without_metrics_port_prometheus_client_is_not_needed(monkeypatch, tmp_path):
    _without_prometheus_client(monkeypatch)
    result = CliRunner().invoke(main, ["run", "--bootstrap-servers", "127.0.0.1:1", "--topic", "t", "--data-dir",
                                       str(tmp_path / "d"), "--until-caught-up", "--timeout", "1"])
    assert result.exit_code == EXIT_FAILURE and "cannot read metadata" in result.stderr


def _scrape(metrics: MaterializerMetrics) -> dict[tuple[str, tuple], float]:
    """(sample name, sorted labels without topic) -> value."""
    samples = {}
    for family in prometheus_parser.text_string_to_metric_families(metrics.render().decode()):
        for sample in family.samples:
            labels = dict(sample.labels)
            assert labels.pop("topic") == metrics.materializer.topic
            samples[(sample.name, tuple(sorted(labels.items())))] = sample.value
    return samples


def test_metrics_of_a_run_on_the_fake_source(tmp_path, fake_source):  # noqa: F811 - fixture
    _produce(fake_source.topic_data, 0, 0, [b"a", b"b", b"c"] * 10)
    _produce(fake_source.topic_data, 1, 5, [b"x", b"y"] * 4)
    materializer = Materializer("fake:9092", TOPIC, tmp_path, options=MaterializerOptions(fetch="consumer", batch_size=7))
    with MaterializerMetrics(materializer) as metrics, materializer:
        before = _scrape(metrics)
        assert before[("materializer_partition_lag", (("partition", "0"),))] == 30
        assert before[("materializer_partition_lag", (("partition", "1"),))] == 8
        assert before[("materializer_partition_next_offset", (("partition", "1"),))] == 5
        assert before[("materializer_applied_records_total", ())] == 0
        assert before[("materializer_caught_up", ())] == 0 and before[("materializer_running", ())] == 0
        started = time.monotonic()
        stats = materializer.run(until_caught_up=True)
        elapsed = time.monotonic() - started
        after = _scrape(metrics)
    assert after[("materializer_applied_records_total", ())] == 38 == stats.records_applied
    assert after[("materializer_fetched_records_total", ())] == 38
    assert after[("materializer_applied_bytes_total", ())] == stats.bytes_applied > 0
    assert after[("materializer_partition_lag", (("partition", "0"),))] == 0
    assert after[("materializer_partition_lag", (("partition", "1"),))] == 0
    assert after[("materializer_partition_high_watermark", (("partition", "1"),))] == 13
    assert after[("materializer_caught_up", ())] == 1 and after[("materializer_failed", ())] == 0
    assert after[("materializer_fetches_total", ())] >= 1
    for name in ("fetch", "append", "fsync", "apply"):  # each took time, within the run's wall time
        assert 0 < after[(f"materializer_{name}_seconds_total", ())] <= elapsed, name
    exposed = {name for name, _ in after}
    # librdkafka's need the consumer's statistics; the committed offsets need --commit-group, the
    # generation and the partitioner's candidates --group-id, the store memory ones a budget
    expected = {name for name in METRICS if not name.startswith("materializer_librdkafka_")
                and name not in ("materializer_group_committed_offset", "materializer_group_generation",
                                 "materializer_group_partitioner_candidates",
                                 "materializer_store_memory_used_bytes", "materializer_store_memtable_bytes")}
    assert expected <= exposed, expected - exposed
    assert after[("materializer_live", ())] == 1 and after[("materializer_ready", ())] == 0  # run returned
    assert after[("materializer_group_commits_total", ())] == 0


def test_replay_progress_in_metrics(tmp_path, fake_source):  # noqa: F811 - fixture
    _produce(fake_source.topic_data, 0, 0, [f"k{i}".encode() for i in range(25)])
    with Materializer("fake:9092", TOPIC, tmp_path, options=MaterializerOptions(fetch="consumer")) as materializer:
        materializer.run(until_caught_up=True)
    import shutil
    shutil.rmtree(tmp_path / "state")  # the next start rebuilds the store from the local log
    materializer = Materializer("fake:9092", TOPIC, tmp_path, options=MaterializerOptions(fetch="consumer", progress=False))
    with MaterializerMetrics(materializer) as metrics, materializer:
        samples = _scrape(metrics)
    assert samples[("materializer_store_rebuilt", ())] == 1
    assert samples[("materializer_replay_target_offsets", ())] == 25
    assert samples[("materializer_replay_done_offsets", ())] == 25
    assert samples[("materializer_replayed_records_total", ())] == 25


def test_a_store_memory_budget_is_in_metrics(tmp_path, fake_source):  # noqa: F811 - fixture
    """With ``StateStoreOptions(memory=...)`` the budget's cache and memtable use are exposed; the
    records just applied sit in a memtable charged to it."""
    _produce(fake_source.topic_data, 0, 0, [f"k{i}".encode() for i in range(25)])
    options = MaterializerOptions(fetch="consumer", progress=False,
                                  store=StateStoreOptions(memory=StoreMemory(8 << 20)))
    materializer = Materializer("fake:9092", TOPIC, tmp_path, options=options)
    with MaterializerMetrics(materializer) as metrics, materializer:
        materializer.run(until_caught_up=True)
        samples = _scrape(metrics)
    assert samples[("materializer_store_memtable_bytes", ())] > 0
    assert samples[("materializer_store_memory_used_bytes", ())] >= samples[("materializer_store_memtable_bytes", ())]


def test_librdkafka_statistics_are_folded_in(tmp_path):
    materializer = Materializer("127.0.0.1:1", "prices", tmp_path)
    metrics = MaterializerMetrics(materializer, statistics_interval_ms=1000)
    assert materializer._statistics_interval_ms == 1000
    assert not any(name.startswith("materializer_librdkafka") for name, _ in _scrape(metrics))
    document = {"name": "rdkafka#consumer-1", "type": "consumer", "topics": {"prices": {"partitions": {
        "0": {"partition": 0, "fetch_state": "active", "consumer_lag": 12, "rxmsgs": 100, "rxbytes": 4096},
        "1": {"partition": 1, "fetch_state": "none", "consumer_lag": -1, "rxmsgs": 0, "rxbytes": 0},
        "-1": {"partition": -1, "fetch_state": "none", "consumer_lag": -1, "rxmsgs": 0, "rxbytes": 0},
    }}, "other": {"partitions": {"0": {"partition": 0, "consumer_lag": 99}}}}}
    metrics.observe_client_statistics(json.dumps(document))
    samples = _scrape(metrics)
    assert samples[("materializer_librdkafka_statistics_total", ())] == 1
    assert samples[("materializer_librdkafka_consumer_lag", (("partition", "0"),))] == 12
    assert ("materializer_librdkafka_consumer_lag", (("partition", "1"),)) not in samples  # -1: unknown
    assert samples[("materializer_librdkafka_rx_messages_total", (("partition", "0"),))] == 100
    assert samples[("materializer_librdkafka_rx_bytes_total", (("partition", "0"),))] == 4096
    assert samples[("materializer_librdkafka_fetch_state", (("partition", "0"), ("state", "active")))] == 1
    assert not any(dict(labels).get("partition") == "-1" for _, labels in samples)


def test_statistics_callback_reaches_the_consumer_config():
    from materializer.adapters.kafka_source import KafkaSourceOptions

    plain = KafkaSourceOptions().consumer_config("b:9092")
    assert "statistics.interval.ms" not in plain
    with_stats = KafkaSourceOptions(statistics_callback=lambda s: None, statistics_interval_ms=250)
    assert with_stats.consumer_config("b:9092")["statistics.interval.ms"] == 250
    overridden = KafkaSourceOptions(statistics_callback=lambda s: None,
                                    client_config={"statistics.interval.ms": "60000"})
    assert overridden.consumer_config("b:9092")["statistics.interval.ms"] == "60000"  # -X wins
    assert "statistics.interval.ms" not in overridden.admin_config("b:9092")


def test_progress_flags_exist_on_every_long_command():
    for command in ("run", "export", "restore", "compact"):
        result = CliRunner().invoke(main, [command, "--help"])
        assert "--progress / --no-progress" in result.output, command


def test_export_progress_bar_goes_to_stderr_only(tmp_path):
    from materializer.adapters.rocksdb_store import StateStore
    from materializer.datadir.layout import state_dir
    from materializer.storage.record_batch import Record

    with StateStore(state_dir(tmp_path, TOPIC)) as store:
        store.apply({0: [Record(i, 0, f"k{i}".encode(), b"v") for i in range(5)]}, {0: 5})
    args = ["export", "--data-dir", str(tmp_path), "--topic", TOPIC]
    shown = CliRunner().invoke(main, [*args, "--progress"])
    hidden = CliRunner().invoke(main, [*args, "--no-progress"])
    assert shown.exit_code == hidden.exit_code == 0
    assert shown.stdout == hidden.stdout and shown.stdout.count("\n") == 5
    assert "5/5" in shown.stderr and "keys" in shown.stderr
    # no bar; the age line alone (a store written directly keeps no lease)
    assert hidden.stderr == f"topic {TOPIC!r} in {tmp_path}: age unknown: no lease (written by a command that " \
                            "keeps none, such as `materializer restore`, or before leases existed)\n"


def test_compact_and_restore_progress_bars_go_to_stderr(tmp_path):
    from .offline.test_compact_command import TOPIC as COMPACT_TOPIC, _make_dir, _records

    data_dir = _make_dir(tmp_path, {p: _records(60, 5) for p in range(2)})
    log_bytes = sum(f.stat().st_size for f in data_dir.glob(f"{COMPACT_TOPIC}-*/*.log"))
    compacted = CliRunner().invoke(main, ["compact", "--data-dir", str(data_dir), "--topic", COMPACT_TOPIC,
                                          "--quiet", "--progress"])
    assert compacted.exit_code == 0, compacted.output
    assert f"{COMPACT_TOPIC}: compact" in compacted.stderr and "100%" in compacted.stderr
    assert compacted.stdout.count(f"{COMPACT_TOPIC}-") == 2  # the summary lines stay on stdout
    quiet = CliRunner().invoke(main, ["compact", "--data-dir", str(data_dir), "--topic", COMPACT_TOPIC,
                                      "--quiet", "--no-progress"])
    assert quiet.exit_code == 0 and quiet.stderr == ""
    assert log_bytes > 0

    # The data dir is laid out like a broker's log dir: restore it elsewhere, with a bar.
    restored = CliRunner().invoke(main, ["restore", "--from-log-dir", str(data_dir), "--topic", COMPACT_TOPIC,
                                         "--data-dir", str(tmp_path / "restored"), "--progress"])
    assert restored.exit_code == 0, restored.output
    assert f"{COMPACT_TOPIC}: restore" in restored.stderr and "100%" in restored.stderr
    assert "restored 2 partitions" in restored.stdout


def test_a_full_disk_under_the_cleaner_log_costs_its_lines_not_a_traceback(tmp_path, capfd, caplog):
    """Seen: a full disk printed logging's traceback for each cleaner line, then `error: [Errno 28] No
    space left on device` from closing the file, naming no file (and hiding the run's own error)."""
    from materializer.cli.run import CLEANER_LOG_FILE, _cleaner_log_file

    with mounted_tmpfs(tmp_path, "1m") as disk:
        cleaner = logging.getLogger("materializer.storage.log_cleaner")
        with _cleaner_log_file(disk, enabled=True):  # raised OSError(28) at the exit before
            cleaner.info("a first line")
            fill(disk, 0)
            for _ in range(200):  # more than the file's buffer: its flushes fail
                cleaner.info("a cleaning round's statistics " + "x" * 100)
        err = capfd.readouterr().err
    assert "Traceback" not in err and "Logging error" not in err, err[-2000:]
    said = [r.getMessage() for r in caplog.records if r.name == "materializer.cli.run"]
    assert said == [f"cannot write {disk / CLEANER_LOG_FILE} (No space left on device): the log cleaner's lines are "
                    "not kept there until it can"]
