"""Typed reads: str/json/avro serdes (confluent-kafka's mock registry), MaterializedView, readers that catch up.

Avro bytes here are written by confluent-kafka's own ``AvroSerializer`` (not by the code under
test), registered in one shared ``mock://`` client (each ``new_client`` call has its own store).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from materializer.adapters.avro_serde import AvroSerde
from materializer.adapters.errors import DeserializationError
from materializer.adapters.rocksdb_store import StateStore
from materializer.adapters.serdes import JsonSerde, StrSerde, make_serde, to_json_compatible
from materializer.datadir.layout import state_dir
from materializer.storage.errors import IncompleteDataDirError
from materializer.storage.record_batch import Record
from materializer.view import MaterializedView

TOPIC = "users"
USER_V1 = {"type": "record", "name": "User", "fields": [
    {"name": "id", "type": "long"}, {"name": "name", "type": "string"}]}
# Backward compatible: one field added with a default.
USER_V2 = {"type": "record", "name": "User", "fields": [
    {"name": "id", "type": "long"}, {"name": "name", "type": "string"},
    {"name": "email", "type": ["null", "string"], "default": None}]}
KEY_SCHEMA = {"type": "record", "name": "UserKey", "fields": [{"name": "id", "type": "long"}]}


@pytest.fixture
def registry():
    return SchemaRegistryClient.new_client({"url": "mock://serdes-test"})


def avro_bytes(registry, schema, datum, field=MessageField.VALUE):
    serializer = AvroSerializer(registry, json.dumps(schema), conf={"auto.register.schemas": True})
    return serializer(datum, SerializationContext(TOPIC, field))


class TestTextSerdes:
    def test_str_decodes_utf8_and_names_the_record_when_it_cannot(self):
        serde = StrSerde(TOPIC)
        assert serde.decode("pomme-\u00e9".encode()) == "pomme-\u00e9"
        with pytest.raises(DeserializationError) as err:
            serde.decode(b"ok\xff", partition=3, offset=42)
        assert (err.value.partition, err.value.offset, err.value.fmt) == (3, 42, "str")
        assert "users-3 at offset 42" in str(err.value) and "byte 2" in str(err.value)

    def test_json_of_binary_bytes_is_not_a_codec_riddle(self):
        # json.loads(bytes) guesses UTF-32 for b"\x00\x00\x00\x01..." (an Avro value): the message
        # must say UTF-8 instead of "'utf-32-be' codec can't decode".
        with pytest.raises(DeserializationError) as err:
            JsonSerde(TOPIC).decode(b"\x00\x00\x00\x01\x02\x0cfoo", partition=0, offset=7)
        assert "utf-32" not in str(err.value).lower() and "offset 7" in str(err.value)
        assert JsonSerde().decode(b'{"a": [1, 2]}') == {"a": [1, 2]}
        assert JsonSerde().encode({"id": 1}) == b'{"id":1}'

    def test_unknown_format_and_avro_without_registry(self):
        with pytest.raises(ValueError, match="unknown format"):
            make_serde("protobuf")
        with pytest.raises(ValueError, match="Schema Registry"):
            make_serde("avro")


class TestAvroSerde:
    def test_schema_evolution_across_ids_in_one_topic(self, registry):
        old = avro_bytes(registry, USER_V1, {"id": 1, "name": "ann"})
        new = avro_bytes(registry, USER_V2, {"id": 2, "name": "bob", "email": "b@x"})
        assert old[1:5] != new[1:5]  # two schema ids
        serde = AvroSerde(registry, topic=TOPIC)
        assert serde.decode(old) == {"id": 1, "name": "ann"}
        assert serde.decode(new) == {"id": 2, "name": "bob", "email": "b@x"}
        # A reader schema projects both onto the newer shape (Avro schema resolution).
        projected = AvroSerde(registry, topic=TOPIC, reader_schema=json.dumps(USER_V2))
        assert projected.decode(old) == {"id": 1, "name": "ann", "email": None}

    def test_unknown_schema_id_names_partition_and_offset(self, registry):
        value = bytearray(avro_bytes(registry, USER_V1, {"id": 1, "name": "ann"}))
        value[1:5] = (4242).to_bytes(4, "big")
        with pytest.raises(DeserializationError) as err:
            AvroSerde(registry, topic=TOPIC).decode(bytes(value), partition=2, offset=17)
        assert "schema id 4242" in str(err.value) and "users-2 at offset 17" in str(err.value)

    @pytest.mark.parametrize("mutate, reason", [
        (lambda v: v[:-2], "do not match"),                     # cut short
        (lambda v: v + b"\x00", "left after a datum"),           # trailing byte
        (lambda v: b"\x01" + v[1:], "magic byte 0x01"),          # not the wire format
        (lambda v: v[:3], "3 bytes"),                            # shorter than the header
    ])
    def test_bytes_that_do_not_match_are_an_error_never_a_wrong_value(self, registry, mutate, reason):
        value = avro_bytes(registry, USER_V1, {"id": 300, "name": "carol"})
        with pytest.raises(DeserializationError, match=reason):
            AvroSerde(registry, topic=TOPIC).decode(mutate(value), partition=0, offset=5)

    def test_key_encode_equals_confluents_serializer(self, registry):
        expected = avro_bytes(registry, KEY_SCHEMA, {"id": 7}, MessageField.KEY)
        assert AvroSerde(registry, topic=TOPIC, field="key").encode({"id": 7}) == expected

    def test_logical_and_bytes_values_export_as_json(self):
        import datetime
        import decimal
        shown = to_json_compatible({"b": b"\x00\xff", "t": datetime.date(2026, 1, 2), "d": decimal.Decimal("1.50"),
                                    "l": [b"a"]})
        assert shown == {"b": "AP8=", "t": "2026-01-02", "d": "1.50", "l": ["YQ=="]}


@pytest.fixture
def data_dir(tmp_path):
    return tmp_path / "data"


def write_store(data_dir, records_by_partition, next_offsets):
    with StateStore(state_dir(data_dir, TOPIC)) as store:
        store.apply(records_by_partition, next_offsets)


class TestMaterializedView:
    def test_typed_reads_scans_and_metadata(self, data_dir):
        write_store(data_dir, {0: [Record(0, 100, b"user:1", b'{"n": 1}'), Record(1, 101, b"user:2", b'{"n": 2}'),
                                   Record(2, 102, b"group:1", b'{"n": 3}')],
                               1: [Record(0, 200, b"user:3", b'{"n": 4}')]}, {0: 3, 1: 1})
        with MaterializedView.open(data_dir, TOPIC, key_format="str", value_format="json") as view:
            assert view.get("user:2") == {"n": 2}
            assert view.get("nobody", "absent") == "absent"
            assert view.get_many(["user:1", "user:3", "nobody"]) == {"user:1": {"n": 1}, "user:3": {"n": 4}}
            assert [(e.key, e.value["n"]) for e in view.scan(prefix="user:")] == [
                ("user:1", 1), ("user:2", 2), ("user:3", 4)]
            assert [e.key for e in view.scan("user:2", "user:9")] == ["user:2", "user:3"]
            entry = view.get_entry("user:3")
            assert (entry.partition, entry.offset, entry.timestamp) == (1, 0, 200)
            assert len(view) == 4 and "group:1" in view and view.offsets() == {0: 3, 1: 1}
            assert [e.key for e in view.items(partition=1)] == ["user:3"]

    def test_a_bad_value_fails_the_read_naming_where_it_is(self, data_dir):
        write_store(data_dir, {0: [Record(9, 1, b"k", b"not json")]}, {0: 10})
        with MaterializedView.open(data_dir, TOPIC, value_format="json") as view:
            with pytest.raises(DeserializationError, match="offset 9"):
                view.get(b"k")

    def test_missing_store_is_an_error(self, data_dir):
        with pytest.raises(IncompleteDataDirError, match=r"no state store .* \(run `materializer run`"):
            MaterializedView.open(data_dir, TOPIC)


WRITER = """
import sys, time
from materializer.adapters.rocksdb_store import StateStore
from materializer.storage.record_batch import Record
with StateStore(sys.argv[1]) as store:
    store.apply({0: [Record(0, 1, b"k", b"v0")]}, {0: 1})
    print("applied 1", flush=True)
    sys.stdin.readline()
    store.apply({0: [Record(1, 2, b"k", b"v1"), Record(2, 3, b"j", b"w")]}, {0: 3})
    print("applied 2", flush=True)
    sys.stdin.readline()
"""


def test_a_reader_in_another_process_catches_up_with_the_running_writer(data_dir):
    """The writer keeps its lock the whole time; the reader never needs it and follows on catch_up()."""
    path = state_dir(data_dir, TOPIC)
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(path)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert writer.stdout.readline().strip() == "applied 1"
        with MaterializedView.open(data_dir, TOPIC, value_format="str") as view:
            assert view.get(b"k") == "v0" and view.offsets() == {0: 1}
            writer.stdin.write("\n")
            writer.stdin.flush()
            assert writer.stdout.readline().strip() == "applied 2"
            assert view.get(b"k") == "v0"  # a consistent snapshot until it catches up
            assert view.catch_up() == {0: 3}
            assert view.get(b"k") == "v1" and view.get(b"j") == "w"
        writer.stdin.write("\n")
        writer.stdin.flush()
        assert writer.wait(timeout=30) == 0
    finally:
        writer.kill()
