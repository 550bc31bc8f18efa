"""CLI export/get over a store built in tmp_path; export's UTF-8 / base64 rule; one-line errors."""

from __future__ import annotations

import base64
import json
import re
import time

import pytest
from click.testing import CliRunner

from materializer.adapters.errors import StoreError
from materializer.adapters.rocksdb_store import StateStore
from materializer.adapters.serdes import decode_for_display, parse_key, text_or_base64
from materializer.cli import EXIT_ABSENT, EXIT_FAILURE, main
from materializer.datadir.layout import state_dir
from materializer.storage.record_batch import Record

TOPIC = "prices"


@pytest.fixture
def data_dir(tmp_path):
    with StateStore(state_dir(tmp_path, TOPIC)) as store:
        store.apply(
            {
                0: [Record(0, 0, b"apple", b'{"price": 1}'), Record(1, 0, "pomme-\u00e9".encode(), "\u20ac2".encode()),
                    Record(2, 0, b"gone", b"x"), Record(3, 0, b"gone", None)],
                1: [Record(0, 0, b"\xff\xfe", b"binary-key"), Record(1, 0, b"bin-value", b"\x00\x9f\xff")],
            },
            {0: 4, 1: 2},
        )
    return tmp_path


def test_text_or_base64_rule():
    assert text_or_base64("key", b"abc") == {"key": "abc"}
    assert text_or_base64("key", "\u00e9".encode()) == {"key": "\u00e9"}
    assert text_or_base64("value", b"") == {"value": ""}
    assert text_or_base64("value", b"\xc3") == {"value_b64": "ww=="}  # truncated UTF-8 sequence
    assert text_or_base64("key", b"\xed\xa0\x80") == {"key_b64": "7aCA"}  # UTF-8-encoded surrogate is invalid


def test_export_json_lines(data_dir):
    result = CliRunner().invoke(main, ["export", "--data-dir", str(data_dir), "--topic", TOPIC])
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert lines == [
        {"partition": 0, "offset": 0, "key": "apple", "value": '{"price": 1}'},
        {"partition": 0, "offset": 1, "key": "pomme-\u00e9", "value": "\u20ac2"},
        {"partition": 1, "offset": 1, "key": "bin-value", "value_b64": base64.b64encode(b"\x00\x9f\xff").decode()},
        {"partition": 1, "offset": 0, "key_b64": base64.b64encode(b"\xff\xfe").decode(), "value": "binary-key"},
    ]
    assert "\u00e9" in result.stdout  # UTF-8 text, not \\u escapes
    # no lease (the store was written directly): the age is unknown, and said so on stderr
    assert result.stderr == f"topic {TOPIC!r} in {data_dir}: age unknown: no lease (written by a command that keeps " \
                            "none, such as `materializer restore`, or before leases existed)\n"


def test_same_key_in_two_partitions(tmp_path):
    with StateStore(state_dir(tmp_path, TOPIC)) as store:
        store.apply({0: [Record(0, 1000, b"dup", b"B"), Record(1, 3000, b"dup", b"C")],
                     1: [Record(0, 2000, b"dup", b"A")]}, {0: 2, 1: 1})
    runner = CliRunner()
    base = ["--data-dir", str(tmp_path), "--topic", TOPIC]
    lines = [json.loads(line) for line in runner.invoke(main, ["export", *base]).stdout.splitlines()]
    assert lines == [{"partition": 0, "offset": 1, "key": "dup", "value": "C"},
                     {"partition": 1, "offset": 0, "key": "dup", "value": "A"}]
    result = runner.invoke(main, ["get", *base, "--metadata", "dup"])
    assert result.exit_code == 0 and result.stdout == "C\n"
    assert "partition 0 offset 1 timestamp 3000" in result.stderr and "also lives in partition(s) 1" in result.stderr
    result = runner.invoke(main, ["get", *base, "--partition", "1", "dup"])
    assert result.exit_code == 0 and result.stdout == "A\n"
    result = runner.invoke(main, ["get", *base, "--partition", "2", "dup"])
    assert result.exit_code == 1 and "not found in partition 2" in result.stderr


def test_get_prints_value(data_dir):
    runner = CliRunner()
    result = runner.invoke(main, ["get", "--data-dir", str(data_dir), "--topic", TOPIC, "apple"])
    assert result.exit_code == 0
    assert result.output == '{"price": 1}\n'
    result = runner.invoke(main, ["get", "--data-dir", str(data_dir), "--topic", TOPIC, "--format", "json", "apple"])
    assert json.loads(result.output) == {"price": 1}
    result = runner.invoke(main, ["get", "--data-dir", str(data_dir), "--topic", TOPIC, "--key-encoding", "hex",
                                  "fffe"])
    assert result.output == "binary-key\n"
    result = runner.invoke(main, ["get", "--data-dir", str(data_dir), "--topic", TOPIC, "bin-value"])
    assert result.output == "base64:AJ//\n"
    result = runner.invoke(main, ["get", "--data-dir", str(data_dir), "--topic", TOPIC, "--format", "bytes",
                                  "bin-value"])
    assert result.stdout_bytes == b"\x00\x9f\xff"


def test_get_absent_exits_1(data_dir):
    runner = CliRunner()
    for key in ("gone", "never"):
        result = runner.invoke(main, ["get", "--data-dir", str(data_dir), "--topic", TOPIC, key])
        assert result.exit_code == EXIT_ABSENT
        assert result.stdout == ""


def test_missing_store_is_one_line_error(tmp_path):
    result = CliRunner().invoke(main, ["export", "--data-dir", str(tmp_path), "--topic", "nope"])
    assert result.exit_code != 0
    assert "no state store for topic 'nope'" in result.output
    assert not (tmp_path / "state").exists()


def test_get_and_export_read_while_a_writer_holds_the_store(data_dir):
    # Issue 9.3: a second process (the CLI) reads the store `run` holds, without its lock.
    with StateStore(state_dir(data_dir, TOPIC)) as writer:
        writer.apply({0: [Record(4, 0, b"written-by-run", b"new")]}, {0: 5})
        result = CliRunner().invoke(main, ["get", "--data-dir", str(data_dir), "--topic", TOPIC, "written-by-run"])
        assert result.exit_code == 0 and result.output == "new\n"  # unflushed writes: replayed from the WAL
        exported = CliRunner().invoke(main, ["export", "--data-dir", str(data_dir), "--topic", TOPIC])
        assert exported.exit_code == 0 and '"written-by-run"' in exported.output
    with StateStore(state_dir(data_dir, TOPIC), read_only=True) as reader:
        with pytest.raises(StoreError, match="read-only"):
            reader.apply({0: [Record(9, 0, b"k", b"v")]}, {0: 10})


def test_get_without_a_store_is_one_line_error(tmp_path):
    result = CliRunner().invoke(main, ["get", "--data-dir", str(tmp_path), "--topic", TOPIC, "apple"])
    assert result.exit_code == EXIT_FAILURE
    assert result.stderr.startswith("error: no state store ") and result.stderr.count("\n") == 1
    assert "Traceback" not in result.output


def test_debug_shows_traceback(tmp_path):
    result = CliRunner().invoke(main, ["--debug", "get", "--data-dir", str(tmp_path), "--topic", TOPIC, "apple"])
    assert result.exit_code != 0
    assert type(result.exception).__name__ == "IncompleteDataDirError"


def test_run_unreachable_broker_is_one_line_error(tmp_path):
    result = CliRunner().invoke(main, ["run", "--bootstrap-servers", "127.0.0.1:1", "--topic", "t", "--data-dir",
                                       str(tmp_path), "--until-caught-up", "--timeout", "1"])
    assert result.exit_code == EXIT_FAILURE
    assert result.stderr.startswith("error: cannot read metadata of topic 't' from 127.0.0.1:1")
    assert result.stderr.count("\n") == 1


def test_bad_config_override_is_one_line_error(tmp_path):
    result = CliRunner().invoke(main, ["run", "--bootstrap-servers", "127.0.0.1:1", "--topic", "t", "--data-dir",
                                       str(tmp_path), "--config", "segment.bytes"])
    assert result.exit_code == EXIT_FAILURE
    assert "not of the form key=value" in result.stderr


def test_commands_are_registered():
    assert {"run", "export", "get", "demo", "broker", "dump-log"} <= set(main.commands)
    for name, command in main.commands.items():
        assert command.help, name


def test_decode_for_display_and_parse_key():
    assert decode_for_display(b"\xff", "auto") == "base64:/w=="
    with pytest.raises(ValueError, match="not valid UTF-8"):
        decode_for_display(b"\xff", "str")
    with pytest.raises(ValueError, match="not UTF-8 JSON"):
        decode_for_display(b"{", "json")
    assert parse_key("/w==", "base64") == b"\xff"
    with pytest.raises(ValueError):
        parse_key("zz", "hex")


@pytest.mark.parametrize(("override", "message"), [
    ("segment.index.bytes=8", "segment.index.bytes: must be in [12, 2147483647]"),
    ("segment.byte=1000", "unknown topic config 'segment.byte'"),
])
def test_run_rejects_a_bad_config_override_before_connecting(tmp_path, override, message):
    result = CliRunner().invoke(main, ["run", "--bootstrap-servers", "127.0.0.1:1", "--topic", TOPIC,
                                       "--data-dir", str(tmp_path / "d"), "--config", override])
    assert result.exit_code == 2, result.output
    assert message in result.output and "Traceback" not in result.output


def test_get_exit_codes(data_dir, tmp_path):
    runner = CliRunner()
    assert runner.invoke(main, ["get", "--data-dir", str(data_dir), "--topic", TOPIC, "apple"]).exit_code == 0
    assert runner.invoke(main, ["get", "--data-dir", str(data_dir), "--topic", TOPIC, "absent"]).exit_code == 1
    missing = runner.invoke(main, ["get", "--data-dir", str(tmp_path / "none"), "--topic", TOPIC, "apple"])
    assert missing.exit_code == 2 and missing.stderr.startswith("error: no state store")


def test_client_config_from_properties_file_and_x(tmp_path):
    from materializer.cli.options import client_config

    properties = tmp_path / "client.properties"
    properties.write_text("# a comment\nsecurity.protocol=SASL_SSL\n! another\nsasl.mechanism: PLAIN\n\n"
                          "sasl.username = alice\n")
    assert client_config(("sasl.username=bob", "client.id=x=y"), properties) == {
        "security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN", "sasl.username": "bob", "client.id": "x=y"}
    properties.write_text("security.protocol\n")  # a key alone: the empty value (java.util.Properties)
    assert client_config((), properties) == {"security.protocol": ""}


# The expected values are java.util.Properties.load's reading of the file, worked out by hand from
# its specification (line terminators, continuation lines, separators, escapes, comments).
JAVA_PROPERTIES = r"""# comment
! bang comment
bootstrap.servers = broker1:9092,\
    broker2:9092
security.protocol:SASL_SSL
sasl.mechanism SCRAM-SHA-512
sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required \
  username="alice" \
  password="p\=ss\:w\\rd";
key\ with\ spaces=v
unicode=caf\u00e9
utf8=café
tab\tin.key=x
empty=
lonely.key
client.id=first
client.id=second
""" + "   indented.key   =   trailing   \n" + r"""odd.backslashes=a\\\
  continued
even.backslashes=b\\
not.continued=c
"""


def test_command_config_reads_java_properties(tmp_path):
    from materializer.cli.options import read_properties

    path = tmp_path / "client.properties"
    path.write_text(JAVA_PROPERTIES, encoding="utf-8")
    assert read_properties(path) == {
        "bootstrap.servers": "broker1:9092,broker2:9092",  # the continuation's leading whitespace dropped
        "security.protocol": "SASL_SSL",  # ':' separates
        "sasl.mechanism": "SCRAM-SHA-512",  # whitespace separates
        "sasl.jaas.config": 'org.apache.kafka.common.security.scram.ScramLoginModule required username="alice" '
                            'password="p=ss:w\\rd";',  # \= \: \\ unescaped, three lines joined
        "key with spaces": "v",  # escaped spaces in a key
        "unicode": "caf\u00e9",  # \uXXXX
        "utf8": "caf\u00e9",
        "tab\tin.key": "x",  # \t
        "empty": "",
        "lonely.key": "",  # a key alone
        "client.id": "second",  # a later key wins
        "indented.key": "trailing",  # leading whitespace skipped; the value trimmed as Kafka's ConfigDef does
        "odd.backslashes": "a\\continued",  # \\ then \ at the end: continued
        "even.backslashes": "b\\",  # \\ at the end: not continued
        "not.continued": "c",
    }


def test_command_config_refuses_a_bad_escape_or_encoding_naming_the_file(tmp_path):
    from materializer.cli.options import read_properties

    path = tmp_path / "client.properties"
    path.write_text("a=1\nb=\\uZZZZ\n", encoding="ascii")
    with pytest.raises(ValueError, match=r"client\.properties line 2"):
        read_properties(path)
    path.write_bytes(b"a=caf\xe9\n")  # ISO-8859-1, not UTF-8: refused, not guessed
    with pytest.raises(ValueError, match=r"client\.properties: not UTF-8"):
        read_properties(path)


def test_version_and_environment_variables(data_dir, monkeypatch):
    result = CliRunner().invoke(main, ["--version"])
    assert result.exit_code == 0 and result.output.startswith("materializer, version ")
    monkeypatch.setenv("MATERIALIZER_GET_DATA_DIR", str(data_dir))
    monkeypatch.setenv("MATERIALIZER_GET_TOPIC", TOPIC)
    result = CliRunner().invoke(main, ["get", "apple"])
    assert result.exit_code == 0 and result.output == '{"price": 1}\n'


def test_a_bounded_run_that_cannot_reach_the_broker_fails_after_its_timeout_and_leaves_no_data_dir(tmp_path):
    data_dir = tmp_path / "new-data-dir"
    started = time.monotonic()
    result = CliRunner().invoke(main, ["run", "--bootstrap-servers", "127.0.0.1:1", "--topic", TOPIC,
                                       "--data-dir", str(data_dir), "--timeout", "1", "--until-caught-up"])
    assert result.exit_code == 2 and result.stderr.startswith("error: ")
    assert result.stderr.count("error:") == 1 and "127.0.0.1:1" in result.stderr
    assert time.monotonic() - started < 15
    assert not data_dir.exists()


def test_a_continuous_run_waits_for_an_unreachable_broker_until_sigterm_then_prints_its_summary(tmp_path):
    """No broker at start: a continuous run keeps retrying with backoff (one warning, not one per
    attempt) instead of giving up, and SIGTERM in that phase ends it with the summary and exit 0."""
    import signal
    import subprocess
    import sys

    process = subprocess.Popen([sys.executable, "-m", "materializer", "run", "--bootstrap-servers", "127.0.0.1:1",
                                "--topic", TOPIC, "--data-dir", str(tmp_path / "d"), "--timeout", "1"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(6)  # several attempts
        assert process.poll() is None, process.communicate()
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=20)
    finally:
        process.kill()
    assert process.returncode == 0, err
    assert out.startswith(f"{TOPIC}: fetched 0 records"), out
    assert err.count("retrying with backoff") == 1, err


def test_text_logs_keep_a_logged_exception_on_one_line_unless_debug():
    """`--debug` is what shows tracebacks; otherwise a warning with an exception is one stderr line."""
    import subprocess
    import sys

    code = ("import logging\nfrom materializer.cli import _configure_logging\n_configure_logging(False, {debug})\n"
            "try:\n    1 / 0\nexcept ZeroDivisionError:\n"
            "    logging.getLogger('materializer.x').warning('cleaning failed', exc_info=True)\n")
    quiet = subprocess.run([sys.executable, "-c", code.format(debug=False)], capture_output=True, text=True)
    assert quiet.stderr.strip().endswith("cleaning failed: division by zero")
    assert "Traceback" not in quiet.stderr and len(quiet.stderr.strip().splitlines()) == 1
    loud = subprocess.run([sys.executable, "-c", code.format(debug=True)], capture_output=True, text=True)
    assert "Traceback" in loud.stderr and "ZeroDivisionError" in loud.stderr


def test_get_several_keys_prints_one_json_line_each_in_order(data_dir):
    base = ["get", "--data-dir", str(data_dir), "--topic", TOPIC]
    result = CliRunner().invoke(main, [*base, "bin-value", "never", "apple", "pomme-\u00e9"])
    assert result.exit_code == EXIT_ABSENT  # a key absent: 1, every line printed all the same
    assert result.stdout.splitlines() == [
        '{"key": "bin-value", "partition": 1, "offset": 1, "timestamp": 0, "value_b64": "AJ//"}',
        '{"key": "never", "absent": true}',
        '{"key": "apple", "partition": 0, "offset": 0, "timestamp": 0, "value": "{\\"price\\": 1}"}',
        '{"key": "pomme-\u00e9", "partition": 0, "offset": 1, "timestamp": 0, "value": "\u20ac2"}',
    ]
    result = CliRunner().invoke(main, [*base, "--format", "json", "apple", "apple"])
    assert result.exit_code == 0
    assert result.stdout == ('{"key": "apple", "partition": 0, "offset": 0, "timestamp": 0, "value": {"price": 1}}\n' * 2)


def test_get_reads_keys_from_stdin_with_a_dash(data_dir):
    base = ["get", "--data-dir", str(data_dir), "--topic", TOPIC, "--format", "bytes"]
    result = CliRunner().invoke(main, [*base, "-"], input="apple\n\nbin-value\n")  # an empty line is skipped
    assert result.exit_code == 0
    assert result.stdout == ('{"key": "apple", "partition": 0, "offset": 0, "timestamp": 0, "value_b64": "eyJwcmljZSI6IDF9"}\n'
                             '{"key": "bin-value", "partition": 1, "offset": 1, "timestamp": 0, "value_b64": "AJ//"}\n')
    result = CliRunner().invoke(main, [*base, "-"], input="apple\n")  # one line on stdin: JSON Lines still
    assert result.stdout.startswith('{"key": "apple"')
    result = CliRunner().invoke(main, [*base, "apple", "-"])
    assert (result.exit_code, result.stderr) == (
        EXIT_FAILURE, "error: - (the keys on stdin) cannot be given with other keys (see 'main get --help')\n")


@pytest.mark.parametrize("args", [["-h"], ["get", "-h"], ["broker", "start", "-h"], ["spark", "snapshot", "-h"]])
def test_dash_h_is_help_everywhere(args):
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith(" ".join(["Usage:", "main", *args[:-1], "["]))
    assert result.stdout == CliRunner().invoke(main, [*args[:-1], "--help"]).stdout


def test_main_help_lists_the_main_commands_first_with_whole_sentences():
    help_text = CliRunner().invoke(main, ["--help"]).stdout
    sections = help_text.split("\n\n")
    main_section = next(s for s in sections if s.startswith("Main commands:"))
    other_section = next(s for s in sections if s.startswith("Other commands:"))
    assert [line.split()[0] for line in main_section.splitlines()[1:]] == ["run", "get", "export", "demo"]
    assert help_text.index("Main commands:") < help_text.index("Other commands:")
    listed = main_section.splitlines()[1:] + other_section.splitlines()[1:]
    assert sorted(line.split()[0] for line in listed) == sorted(main.commands)  # every command, once
    assert all(line.rstrip().endswith(".") and "..." not in line for line in listed), listed


def test_run_help_is_in_sections_after_an_example():
    help_text = CliRunner().invoke(main, ["run", "--help"]).stdout
    titles = [line[:-1] for line in help_text.splitlines() if line.endswith(":") and not line.startswith(" ")]
    assert titles == ["Connection", "Storage", "Cleaner", "Group", "Formats", "Serving", "Metrics", "Other options"]
    assert help_text.index("  Example:\n    materializer run --bootstrap-servers") < help_text.index("\nConnection:")
    section_of = {}
    for block in help_text.split("\n\n"):
        title = block.split(":\n", 1)[0]
        if title not in titles:  # the description
            continue
        for name in re.findall(r"^  (?:-\w, )?(--[\w-]+|-\w)\b", block, flags=re.MULTILINE):
            section_of.setdefault(name, []).append(title)
    assert section_of["--bootstrap-servers"] == ["Connection"] and section_of["--cleaner-threads"] == ["Cleaner"]
    assert section_of["--group-id"] == ["Group"] and section_of["--serve"] == ["Serving"]
    assert section_of["--value-format"] == ["Formats"] and section_of["--metrics-port"] == ["Metrics"]
    assert section_of["--data-dir"] == ["Storage"] and section_of["--debug"] == ["Other options"]
    options = {opt for param in main.commands["run"].params for opt in param.opts if opt.startswith("--")}
    assert {name for name in section_of if name.startswith("--")} == options | {"--help"}  # each listed, once
    assert all(len(titles) == 1 for titles in section_of.values())


def test_get_several_keys_over_http_lines_from_the_members_answers():
    from materializer.cli.read import _remote_line
    from materializer.deletions import Deletion

    where = {"partition": 1, "offset": 5, "timestamp": 9}
    assert _remote_line("k", {**where, "value": base64.b64encode(b"hi").decode(), "value_format": "bytes"}, None, None) \
        == {"key": "k", **where, "value": "hi"}
    assert _remote_line("k", {**where, "value": base64.b64encode(b"\xff").decode(), "value_format": "bytes"}, None,
                        None) == {"key": "k", **where, "value_b64": "/w=="}
    assert _remote_line("k", {**where, "value": {"a": 1}, "value_format": "json"}, None, None) \
        == {"key": "k", **where, "value": {"a": 1}}
    assert _remote_line("k", {**where, "value": "t\u00e9", "value_format": "str"}, "bytes", None) \
        == {"key": "k", **where, "value_b64": base64.b64encode("t\u00e9".encode()).decode()}
    assert _remote_line("k", None, None, Deletion(0, 7, -1)) \
        == {"key": "k", "absent": True, "deleted": {"partition": 0, "offset": 7, "timestamp": -1}}
    assert _remote_line("k", None, None, None) == {"key": "k", "absent": True}
