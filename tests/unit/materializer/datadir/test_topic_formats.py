"""``get``/``export`` default to the formats and registry URL the topic's last ``run`` recorded
(:mod:`materializer.datadir.formats`); options given still win; readers write nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from materializer.adapters.rocksdb_store import StateStore
from materializer.cli import main
from materializer.datadir.layout import state_dir
from materializer.storage.record_batch import Record
from materializer.datadir.formats import TopicFormats, read_topic_formats, write_topic_formats
from materializer.datadir.layout import topic_formats_path

TOPIC = "prices"


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    with StateStore(state_dir(tmp_path, TOPIC)) as store:
        store.apply({0: [Record(0, 0, b'{"sku":1}', b'{"price":1,"currency":"EUR"}')]}, {0: 1})
    return tmp_path


def _tree(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*")}


def test_a_record_round_trips_without_credentials(tmp_path: Path) -> None:
    write_topic_formats(tmp_path, TOPIC, TopicFormats("str", "avro", "https://alice:secret@registry:8081/apis/ccompat/v7"),
                        written_by="run")
    assert read_topic_formats(tmp_path, TOPIC) == TopicFormats("str", "avro", "https://registry:8081/apis/ccompat/v7")
    assert "secret" not in topic_formats_path(tmp_path, TOPIC).read_text()
    assert read_topic_formats(tmp_path, "other") is None
    with pytest.raises(ValueError, match="value_format 'xml'"):
        write_topic_formats(tmp_path, TOPIC, TopicFormats("str", "xml", None), written_by="run")


def test_an_unreadable_record_names_its_file_and_the_options(data_dir: Path) -> None:
    path = topic_formats_path(data_dir, TOPIC)
    path.parent.mkdir()
    path.write_text('{"key_format": "str"}')
    result = CliRunner().invoke(main, ["get", "--data-dir", str(data_dir), "--topic", TOPIC, '{"sku":1}'])
    assert result.exit_code == 2
    assert result.stderr.startswith(f"error: {path} is not a record of the topic's formats")
    explicit = ["--key-format", "bytes", "--value-format", "auto", "--schema-registry-url", "http://x"]
    result = CliRunner().invoke(main, ["get", "--data-dir", str(data_dir), "--topic", TOPIC, *explicit, '{"sku":1}'])
    assert result.exit_code == 0 and result.stdout == '{"price":1,"currency":"EUR"}\n'


def test_get_and_export_use_what_run_recorded_and_options_win(data_dir: Path) -> None:
    runner = CliRunner()
    get = ["get", "--data-dir", str(data_dir), "--topic", TOPIC]
    export = ["export", "--data-dir", str(data_dir), "--topic", TOPIC]
    # nothing recorded: the commands' own defaults (value as text)
    assert runner.invoke(main, [*get, '{"sku":1}']).stdout == '{"price":1,"currency":"EUR"}\n'
    assert json.loads(runner.invoke(main, export).stdout)["value"] == '{"price":1,"currency":"EUR"}'

    write_topic_formats(data_dir, TOPIC, TopicFormats("json", "json", None), written_by="run")
    before = _tree(data_dir)
    result = runner.invoke(main, [*get, '{ "sku": 1 }'])  # KEY is JSON now, looked up as compact JSON
    assert result.exit_code == 0, result.output
    assert result.stdout == '{\n  "price": 1,\n  "currency": "EUR"\n}\n'  # json: pretty
    line = json.loads(runner.invoke(main, export).stdout)
    assert (line["key"], line["value"]) == ({"sku": 1}, {"price": 1, "currency": "EUR"})
    assert _tree(data_dir) == before  # readers wrote nothing

    result = runner.invoke(main, [*get, "--key-format", "str", "--value-format", "auto", '{"sku":1}'])
    assert result.stdout == '{"price":1,"currency":"EUR"}\n'
    result = runner.invoke(main, [*get, '{"sku":1}'], env={"MATERIALIZER_GET_VALUE_FORMAT": "str"})
    assert result.stdout == '{"price":1,"currency":"EUR"}\n'  # an environment variable counts as given
    line = json.loads(runner.invoke(main, [*export, "--value-format", "bytes"]).stdout)
    assert line["key"] == {"sku": 1} and "value_b64" in line


def test_a_recorded_bytes_keeps_the_readers_defaults_and_the_registry_url_is_used(data_dir: Path) -> None:
    write_topic_formats(data_dir, TOPIC, TopicFormats("bytes", "bytes", None), written_by="run")
    line = json.loads(CliRunner().invoke(main, ["export", "--data-dir", str(data_dir), "--topic", TOPIC]).stdout)
    assert line["value"] == '{"price":1,"currency":"EUR"}'  # auto, not base64
    export = ["export", "--data-dir", str(data_dir), "--topic", TOPIC]
    write_topic_formats(data_dir, TOPIC, TopicFormats("bytes", "avro", None), written_by="run")
    result = CliRunner().invoke(main, export)
    assert result.stderr == "error: the avro format needs --schema-registry-url (or SCHEMA_REGISTRY_URL)\n"
    write_topic_formats(data_dir, TOPIC, TopicFormats("bytes", "avro", "http://127.0.0.1:1"), written_by="run")
    result = CliRunner().invoke(main, export)
    # the recorded registry URL was taken: the value is decoded as avro (and is not Avro)
    assert result.stderr.startswith("error: cannot read the value of prices-0 at offset 0 as avro: "), result.output
