"""CLI conventions (:mod:`materializer.cli.conventions`): global options anywhere on the line, one
``error:`` line with exit 2 for every error, Ctrl-C as 130 with one line, and the
``MATERIALIZER_<COMMAND>_<OPTION>`` environment variables of every command."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

import materializer.cli as cli_module
from materializer.cli import main
from materializer.cli.conventions import option_envvars, walk_commands
from materializer.cli.log_setup import RepeatFoldingHandler, is_connection_report

ALL_COMMANDS = [path for path, _ in walk_commands(main)]


@pytest.fixture
def logging_calls(monkeypatch):
    """The (verbose, debug, log_format) each invocation configured logging with."""
    seen: list[tuple[bool, bool, str]] = []
    monkeypatch.setattr(cli_module, "_configure_logging",
                        lambda verbose, debug, log_format: seen.append((verbose, debug, log_format)))
    return seen


@pytest.mark.parametrize("args", [
    ["-v", "--log-format", "json", "export", "--data-dir", "{d}", "--topic", "t"],
    ["export", "--data-dir", "{d}", "--topic", "t", "-v", "--log-format", "json"],
    ["--log-format", "text", "export", "-v", "--data-dir", "{d}", "--topic", "t", "--log-format", "json"],
    ["broker", "status", "--state-dir", "{d}", "--verbose", "--log-format", "json"],
    ["broker", "-v", "--log-format", "json", "status", "--state-dir", "{d}"],
])
def test_global_options_before_or_after_the_command_at_any_depth(tmp_path, logging_calls, args):
    result = CliRunner().invoke(main, [arg.format(d=tmp_path) for arg in args])
    assert "no such option" not in result.output.lower(), result.output
    assert logging_calls == [(True, False, "json")]


def test_debug_after_the_command_shows_the_traceback(tmp_path):
    result = CliRunner().invoke(main, ["get", "--data-dir", str(tmp_path), "--topic", "t", "k", "--debug"])
    assert type(result.exception).__name__ == "IncompleteDataDirError"


@pytest.mark.parametrize(("args", "expected"), [
    (["run", "--foo"], "error: no such option '--foo' (see 'materializer run --help')\n"),
    (["nope"], "error: no such command 'nope' (see 'materializer --help')\n"),
    (["get", "--data-dir", "d", "--topic", "t"], "error: missing argument 'KEY...' (see 'materializer get --help')\n"),
    (["broker", "start", "--bogus"], "error: no such option '--bogus'. Did you mean '--verbose'? "
                                        "(see 'materializer broker start --help')\n"),
    (["spark", "snapshot", "--topic", "t"],
     "error: missing option '--log-dir' (env var: 'MATERIALIZER_SPARK_SNAPSHOT_LOG_DIR', "
     "'MATERIALIZER_SPARK_LOG_DIR') (see 'materializer spark snapshot --help')\n"),
    (["restore", "--topic", "t", "--data-dir", "d"],
     "error: give either --from-log-dir (repeatable) or --from-snapshot (see 'materializer restore --help')\n"),
    (["run", "--fetch", "x"], "error: invalid value for '--fetch' (env var: 'MATERIALIZER_RUN_FETCH'): 'x' is not one of 'replica', 'consumer' "
                              "(see 'materializer run --help')\n"),
])
def test_usage_errors_are_one_error_line_with_exit_2(args, expected):
    result = CliRunner().invoke(main, args, prog_name="materializer")
    assert (result.exit_code, result.stderr, result.stdout) == (2, expected, "")


def test_a_command_failure_is_one_error_line_with_exit_2(tmp_path):
    (tmp_path / "00000000000000000000.log").write_bytes(b"\x00" * 7)
    result = CliRunner().invoke(main, ["dump-log", str(tmp_path / "00000000000000000000.log")])
    assert result.exit_code == 2 and result.stderr.startswith("error: ") and result.stderr.count("\n") == 1


@pytest.mark.parametrize("path", ALL_COMMANDS, ids=" ".join)
def test_help_of_every_command_exits_0_and_names_its_environment_variables(path):
    result = CliRunner().invoke(main, [*path, "--help"])
    assert result.exit_code == 0, result.output
    command = main
    for name in path:
        assert isinstance(command, click.Group)
        command = command.commands[name]
    text = " ".join(result.output.split())
    for param in command.params:
        if isinstance(param, click.Option) and param.name not in ("debug", "verbose", "log_format"):
            assert param.envvar == option_envvars(path, param, tuple(param.envvar[len(path):]))
            assert f"MATERIALIZER_{'_'.join(p.upper().replace('-', '_') for p in path)}_" in text


def test_the_envvar_rule_for_nested_commands():
    options = {opt: param for param in main.commands["broker"].commands["start"].params
               if isinstance(param, click.Option) for opt in param.opts}
    assert options["--state-dir"].envvar == ["MATERIALIZER_BROKER_START_STATE_DIR", "MATERIALIZER_BROKER_STATE_DIR",
                                             "MATERIALIZER_BROKER_DIR"]
    run_options = {opt: param for param in main.commands["run"].params
                   if isinstance(param, click.Option) for opt in param.opts}
    assert run_options["--bootstrap-servers"].envvar == ["MATERIALIZER_RUN_BOOTSTRAP_SERVERS", "KAFKA_BOOTSTRAP_SERVERS"]
    assert run_options["--timeout"].envvar == ["MATERIALIZER_RUN_TIMEOUT"]
    assert run_options["-X"].envvar == ["MATERIALIZER_RUN_X"]
    snapshot = {opt: param for param in main.commands["spark"].commands["snapshot"].params
                if isinstance(param, click.Option) for opt in param.opts}
    assert snapshot["--out"].envvar == ["MATERIALIZER_SPARK_SNAPSHOT_OUT", "MATERIALIZER_SPARK_OUT"]


@pytest.mark.parametrize("variable", ["MATERIALIZER_BROKER_{COMMAND}_STATE_DIR", "MATERIALIZER_BROKER_STATE_DIR",
                                      "MATERIALIZER_BROKER_DIR"])
def test_broker_commands_read_their_state_dir_from_the_environment(tmp_path, variable):
    state_dir = tmp_path / "from-env"
    for command in ("status", "stop"):
        env = {variable.format(COMMAND=command.upper()): str(state_dir)}
        result = CliRunner().invoke(main, ["broker", command], env=env)
        assert f"no broker running in {state_dir}" in result.stderr, result.output


def test_the_more_specific_variable_and_the_command_line_win(tmp_path):
    env = {"MATERIALIZER_REGISTRY_STATE_DIR": str(tmp_path / "group"),
           "MATERIALIZER_REGISTRY_STATUS_STATE_DIR": str(tmp_path / "command")}
    result = CliRunner().invoke(main, ["registry", "status"], env=env)
    assert f"running in {tmp_path / 'command'}" in result.stderr
    result = CliRunner().invoke(main, ["registry", "status", "--state-dir", str(tmp_path / "line")], env=env)
    assert f"running in {tmp_path / 'line'}" in result.stderr


def test_run_reads_its_options_from_the_environment(tmp_path):
    env = {"MATERIALIZER_RUN_BOOTSTRAP_SERVERS": "127.0.0.1:1", "MATERIALIZER_RUN_TOPIC": "t",
           "MATERIALIZER_RUN_DATA_DIR": str(tmp_path / "d"), "MATERIALIZER_RUN_UNTIL_CAUGHT_UP": "1",
           "MATERIALIZER_RUN_TIMEOUT": "1"}
    result = CliRunner().invoke(main, ["run"], env=env)
    assert result.exit_code == 2 and result.stderr.startswith("error: cannot read metadata of topic 't' from 127.0.0.1:1")


def test_ctrl_c_while_the_command_line_is_parsed_or_a_prompt_waits_is_130_and_one_line(monkeypatch, tmp_path):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(click.Path, "convert", interrupted)
    result = CliRunner().invoke(main, ["export", "--data-dir", str(tmp_path), "--topic", "t"])
    assert (result.exit_code, result.stderr) == (130, "error: interrupted (SIGINT)\n")
    monkeypatch.undo()

    def aborted(*args, **kwargs):
        raise click.Abort

    monkeypatch.setattr("materializer.cli.read._open_existing_store", aborted)
    result = CliRunner().invoke(main, ["export", "--data-dir", str(tmp_path), "--topic", "t"])
    assert (result.exit_code, result.stderr) == (130, "error: interrupted (SIGINT)\n")


def _java_in_process_group(group: int) -> bool:
    """True when a ``java`` process runs in process group ``group`` (/proc/PID/stat: comm, pgrp)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue  # exited meanwhile
        comm = text[text.index("(") + 1:text.rindex(")")]
        fields = text[text.rindex(")") + 2:].split()
        if comm == "java" and int(fields[2]) == group:
            return True
    return False


def _ctrl_c(args: list[str], delay_s: float, cwd: Path, *, after_java_starts: bool = False) -> tuple[int, str, str]:
    """``materializer ARGS`` in a session of its own, SIGINT to its process group (a terminal's Ctrl-C)
    after ``delay_s`` seconds, or (``after_java_starts``) ``delay_s`` seconds after a JVM appeared in
    the group: (exit status, stdout, stderr)."""
    process = subprocess.Popen([sys.executable, "-m", "materializer", *args], cwd=cwd, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        if after_java_starts:
            deadline = time.monotonic() + 60
            while not _java_in_process_group(process.pid):
                assert process.poll() is None and time.monotonic() < deadline, "no JVM started"
                time.sleep(0.02)
        time.sleep(delay_s)
        os.killpg(process.pid, signal.SIGINT)
        out, err = process.communicate(timeout=60)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
    return process.returncode, out, err


@pytest.mark.parametrize(("args", "delay_s", "after_java_starts"), [
    (["demo", "--bootstrap-servers", "127.0.0.1:1", "--data-dir", "d"], 3.0, False),
    (["spark", "snapshot", "--log-dir", ".", "--topic", "t", "--out", "o"], 1.5, False),
    # the JVM's start then takes seconds more before the command finds no partition folder
    (["spark", "snapshot", "--log-dir", ".", "--topic", "t", "--out", "o"], 0.2, True),
], ids=["demo", "spark snapshot, Python starting", "spark snapshot, JVM starting"])
def test_ctrl_c_in_a_command_is_130_and_one_line(tmp_path: Path, args, delay_s, after_java_starts):
    """A real SIGINT to the process group (as a terminal's Ctrl-C): while the demo waits for an
    unreachable broker; while Spark starts (its driver JVM, which ignores SIGINT, must not outlive
    the command: it would hold the pipes open past the timeout)."""
    if args[0] == "spark":
        pytest.importorskip("pyspark")
    returncode, out, err = _ctrl_c(args, delay_s, cwd=tmp_path, after_java_starts=after_java_starts)
    assert returncode == 130, err
    # on a loaded machine the signal may come while the command line still loads: its own line
    assert err.endswith(("error: interrupted (SIGINT)\n", "error: interrupted (SIGINT) while the command line loaded\n"))
    assert err.count("error:") == 1, err
    assert "Traceback" not in err and "Aborted" not in err


def test_ctrl_c_stops_a_continuous_run_after_its_batch_then_exits_130(tmp_path: Path):
    """run's Ctrl-C is a clean stop (batch finished, logs flushed, the summary printed), and the
    caller still sees an interruption: exit 130 and one error line (SIGTERM, a service stop: 0)."""
    returncode, out, err = _ctrl_c(["run", "--bootstrap-servers", "127.0.0.1:1", "--topic", "t", "--data-dir",
                                    str(tmp_path / "d"), "--timeout", "1"], 4.0, cwd=tmp_path)
    assert returncode == 130, err
    assert out.startswith("t: fetched 0 records"), out
    assert err.endswith("error: interrupted (SIGINT); the run stopped after its current batch (summary above)\n"), err
    assert err.count("error:") == 1 and "Traceback" not in err


def _client_record(name: str, level: int, message: str, *args: object, created: float) -> logging.LogRecord:
    record = logging.LogRecord(name, level, __file__, 1, message, args or None, None)
    record.created = created
    return record


def test_client_lines_are_folded_with_a_count_and_connection_reports_need_verbose():
    lines: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(f"{record.levelname} {record.name}: {record.getMessage()}")

    handler = RepeatFoldingHandler(Collect(), window_s=60.0, client_level=logging.WARNING)
    for i in range(5):  # librdkafka: numbers differ ("after Nms"), the line is the same
        handler.handle(_client_record("materializer.adapters.kafka_source.librdkafka", logging.WARNING,
                                      "Kafka client error: Receive failed (after %dms in state UP)", i, created=100.0 + i))
    handler.handle(_client_record("kafka.net.manager", logging.ERROR, "Connection failed: 111 ECONNREFUSED",
                                  created=101.0))
    handler.handle(_client_record("materializer.adapters.kafka_source.librdkafka", logging.ERROR,
                                  "%s [%s] %s", "FAIL", "rdkafka#consumer-1", "Connect failed", created=101.0))
    for _ in range(3):  # the materializer's own lines are never folded
        handler.handle(_client_record("materializer.broker_outage", logging.WARNING, "broker away", created=102.0))
    handler.handle(_client_record("materializer.adapters.kafka_source.librdkafka", logging.WARNING,
                                  "Kafka client error: Receive failed (after 9ms in state UP)", created=170.0))
    assert lines == [
        "WARNING materializer.adapters.kafka_source.librdkafka: Kafka client error: Receive failed (after 0ms in state UP)",
        *["WARNING materializer.broker_outage: broker away"] * 3,
        "WARNING materializer.adapters.kafka_source.librdkafka: Kafka client error: Receive failed (after 0ms in state UP)"
        " (repeated 4 more times in 70.0 s)",
        "WARNING materializer.adapters.kafka_source.librdkafka: Kafka client error: Receive failed (after 9ms in state UP)",
    ]
    assert is_connection_report(_client_record("kafka.conn", logging.ERROR, "x", created=0.0))
    assert not is_connection_report(_client_record("kafka.consumer.fetcher", logging.ERROR, "x", created=0.0))


@pytest.mark.parametrize("verbose", [False, True], ids=["quiet", "-v"])
def test_an_unreachable_broker_prints_the_error_line_and_at_most_folded_client_lines(tmp_path, verbose):
    args = ["run", "--bootstrap-servers", "127.0.0.1:1", "--topic", "t", "--data-dir", str(tmp_path / "d"),
            "--until-caught-up", "--timeout", "3"] + (["-v"] if verbose else [])
    done = subprocess.run([sys.executable, "-m", "materializer", *args], capture_output=True, text=True, timeout=60)
    lines = done.stderr.splitlines()
    assert done.returncode == 2 and lines[-1].startswith("error: cannot read metadata of topic 't' from 127.0.0.1:1")
    if not verbose:
        assert lines == lines[-1:], done.stderr
    else:
        refused = [line for line in lines[:-1] if "Connect to ipv4#127.0.0.1:1 failed" in line]
        assert 1 <= len(refused) <= 2 and " INFO " in refused[0], done.stderr
        assert all("(repeated " in line for line in refused[1:])
