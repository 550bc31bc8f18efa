"""Interactive-query routing against the real broker: ``partition_for_key`` predicts where
librdkafka's partitioners and Java's producer put each key, and ``owner_of`` names the group member
that holds the key's partition (classic and KIP-848 ``consumer`` groups)."""

from __future__ import annotations

import random
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, ConsumerGroupType, Producer

from materializer.adapters.errors import TopicNotFoundError
from materializer.adapters.group_members import GroupMembersClient
from materializer.group.routing import owner_of, partition_for_key

pytestmark = pytest.mark.broker

PARTITION_COUNTS = (1, 3, 12, 17)


def _random_keys(count: int, seed: int) -> list[bytes]:
    rng = random.Random(seed)
    keys = [b""] + [rng.randbytes(rng.randrange(0, 41)) for _ in range(count - 1)]
    return list(dict.fromkeys(keys))


def _delivered_partitions(bootstrap: str, topic: str, keys: list[bytes], partitioner: str) -> dict[bytes, int]:
    delivered: dict[bytes, int] = {}
    failures: list[str] = []

    def on_delivery(error: Any, message: Any) -> None:
        if error is not None:
            failures.append(str(error))
        else:
            delivered[message.key()] = message.partition()

    producer = Producer({"bootstrap.servers": bootstrap, "partitioner": partitioner, "linger.ms": 20,
                         "acks": "1"})
    for key in keys:
        producer.produce(topic, key=key, value=b"v", on_delivery=on_delivery)
        producer.poll(0)
    assert producer.flush(60) == 0
    assert not failures, failures[:3]
    return delivered


@pytest.fixture
def topics(kafka_materializer_topic_factory: Any) -> dict[int, str]:
    """partition count -> a topic of that many partitions."""
    return {count: kafka_materializer_topic_factory(partitions=count) for count in PARTITION_COUNTS}


@pytest.mark.parametrize("partitioner", ["murmur2_random", "consistent_random", "fnv1a_random"])
def test_partition_for_key_predicts_librdkafkas_partitioners(kafka_materializer_broker: Any, topics: dict[int, str],
                                                             partitioner: str) -> None:
    keys = _random_keys(2000, seed=len(partitioner))
    if partitioner == "consistent_random":  # librdkafka sends an empty key to a random partition
        keys.remove(b"")
        with pytest.raises(ValueError, match="empty key"):
            partition_for_key(b"", 3, partitioner=partitioner)
    for count, topic in topics.items():
        delivered = _delivered_partitions(kafka_materializer_broker.bootstrap_servers, topic, keys, partitioner)
        assert len(delivered) == len(keys)
        wrong = [(key, part) for key, part in delivered.items()
                 if partition_for_key(key, count, partitioner=partitioner) != part]
        assert not wrong, f"{len(wrong)} of {len(keys)} keys elsewhere on {count} partitions, e.g. {wrong[:3]}"
        if count > 1:
            assert len(set(delivered.values())) == count  # the keys spread: the test sees every partition


# Java's own hash and producer: Utils.murmur2, BuiltInPartitioner.partitionForKey for each partition
# count, and the partition a KafkaProducer (default partitioner, ByteArraySerializer) delivered each
# key to. Run in the java launcher's source-file mode on the broker's class path.
_JAVA_SOURCE = """
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.HexFormat;
import java.util.List;
import java.util.Properties;
import java.util.concurrent.Future;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.clients.producer.internals.BuiltInPartitioner;
import org.apache.kafka.common.serialization.ByteArraySerializer;
import org.apache.kafka.common.utils.Utils;

public class KeyPartitions {
    // args: bootstrap topic keys-file partition-counts (comma separated); keys-file: "k<hex>" lines
    public static void main(String[] args) throws Exception {
        List<byte[]> keys = new ArrayList<>();
        for (String line : Files.readAllLines(Path.of(args[2]))) {
            keys.add(HexFormat.of().parseHex(line.substring(1)));
        }
        String[] counts = args[3].split(",");
        Properties props = new Properties();
        props.put("bootstrap.servers", args[0]);
        props.put("linger.ms", "20");
        List<Future<RecordMetadata>> sent = new ArrayList<>();
        try (KafkaProducer<byte[], byte[]> producer =
                 new KafkaProducer<>(props, new ByteArraySerializer(), new ByteArraySerializer())) {
            for (byte[] key : keys) {
                sent.add(producer.send(new ProducerRecord<>(args[1], key, "v".getBytes())));
            }
            producer.flush();
            StringBuilder out = new StringBuilder();
            for (int i = 0; i < keys.size(); i++) {
                byte[] key = keys.get(i);
                out.append('k').append(HexFormat.of().formatHex(key)).append(' ').append(Utils.murmur2(key));
                for (String count : counts) {
                    out.append(' ').append(BuiltInPartitioner.partitionForKey(key, Integer.parseInt(count)));
                }
                out.append(' ').append(sent.get(i).get().partition()).append('\\n');
            }
            System.out.print(out);
        }
    }
}
"""


def test_partition_for_key_is_javas_murmur2_and_java_producers_partition(kafka_materializer_broker: Any,
                                                                         topics: dict[int, str],
                                                                         tmp_path: Path) -> None:
    from materializer.storage import _native

    keys = _random_keys(2000, seed=4)
    keys += [b"21", b"foobar", b"abc", b"\xff" * 7, b"\x80\x00\x00\x00"]
    keys_file = tmp_path / "keys.txt"
    keys_file.write_text("".join(f"k{key.hex()}\n" for key in keys))
    source = tmp_path / "KeyPartitions.java"
    source.write_text(_JAVA_SOURCE)
    counts = ",".join(map(str, PARTITION_COUNTS))
    done = kafka_materializer_broker.run_tool(
        str(source), [kafka_materializer_broker.bootstrap_servers, topics[17], keys_file, counts], timeout_s=180,
        check=True)
    lines = done.stdout.splitlines()
    assert len(lines) == len(keys), done.stderr[-2000:]
    for key, line in zip(keys, lines, strict=True):
        hex_key, java_murmur2, *java_partitions, delivered = line.split()
        assert hex_key == f"k{key.hex()}"
        assert _native.murmur2(key) == int(java_murmur2), key
        for count, java_partition in zip(PARTITION_COUNTS, java_partitions, strict=True):
            assert partition_for_key(key, count) == int(java_partition), (key, count)
        assert partition_for_key(key, 17) == int(delivered), key


# ------------------------------------------------------------------------------------------ owner_of

def _wait_for_stable_assignment(consumers: list[Consumer], client: GroupMembersClient, group: str, topic: str,
                                partitions: int, timeout_s: float = 90.0) -> None:
    """Poll every consumer until each holds partitions, together all of them, and the coordinator's
    description names the same owners (a rebalance is over)."""
    deadline = time.monotonic() + timeout_s
    last = "nothing yet"
    while time.monotonic() < deadline:
        for consumer in consumers:
            consumer.poll(0.05)
        held = {tp.partition: consumer.memberid() for consumer in consumers for tp in consumer.assignment()}
        if all(consumer.assignment() for consumer in consumers) and len(held) == partitions:
            owners = client.partition_owners(group, topic)
            if {p: owner.member_id for p, owner in owners.items()} == held:
                return
            last = f"described {len(owners)} owners, consumers hold {len(held)}"
        else:
            last = f"assignments {[len(c.assignment()) for c in consumers]}"
    raise AssertionError(f"group {group} did not settle within {timeout_s:.0f} s: {last}")


@pytest.mark.parametrize("protocol", ["classic", "consumer"])
def test_owner_of_names_the_member_that_holds_the_keys_partition(kafka_materializer_broker: Any,
                                                                 kafka_materializer_admin: Any,
                                                                 kafka_materializer_topic_factory: Any,
                                                                 protocol: str) -> None:
    bootstrap = kafka_materializer_broker.bootstrap_servers
    topic = kafka_materializer_topic_factory(partitions=12)
    group = f"routing-{protocol}-{uuid.uuid4().hex[:8]}"
    consumers: list[Consumer] = []
    client = GroupMembersClient(bootstrap)
    try:
        for name in ("a", "b", "c"):
            config = {"bootstrap.servers": bootstrap, "group.id": group, "group.protocol": protocol,
                      "client.id": f"routing-{name}", "enable.auto.commit": False}
            if name == "c":
                config["group.instance.id"] = f"{group}-static-c"
            consumer = Consumer(config)
            consumer.subscribe([topic])
            consumers.append(consumer)
        _wait_for_stable_assignment(consumers, client, group, topic, 12)
        described = kafka_materializer_admin.describe_consumer_groups([group])[group].result(timeout=30)
        assert described.type == ConsumerGroupType[protocol.upper()]  # the protocol the test meant
        by_member = {consumer.memberid(): (name, consumer) for name, consumer in zip("abc", consumers, strict=True)}
        rng = random.Random(12)
        for key in [rng.randbytes(rng.randrange(0, 30)) for _ in range(60)] + ["prodüct-7"]:
            partition = partition_for_key(key, 12)
            owner = owner_of(key, topic=topic, group_id=group, client=client,
                             partitions=12 if isinstance(key, str) else None)
            assert owner is not None and owner.partition == partition
            name, consumer = by_member[owner.member_id]
            assert partition in {tp.partition for tp in consumer.assignment()}
            assert owner.client_id == f"routing-{name}"
            assert owner.group_instance_id == (f"{group}-static-c" if name == "c" else None)
            assert owner.host.strip("/")  # the address the coordinator saw
        # the one-shot form (its own admin client) answers the same
        fresh = owner_of(b"k-1", topic=topic, group_id=group, bootstrap_servers=bootstrap)
        assert fresh == owner_of(b"k-1", topic=topic, group_id=group, client=client)
    finally:
        for consumer in consumers:
            consumer.close()


@pytest.mark.parametrize("protocol", ["classic", "consumer"])
def test_owner_of_is_none_once_every_member_left(kafka_materializer_broker: Any,
                                                 kafka_materializer_topic_factory: Any, protocol: str) -> None:
    bootstrap = kafka_materializer_broker.bootstrap_servers
    topic = kafka_materializer_topic_factory(partitions=3)
    group = f"routing-left-{protocol}-{uuid.uuid4().hex[:8]}"
    client = GroupMembersClient(bootstrap)
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "group.protocol": protocol})
    try:
        consumer.subscribe([topic])
        _wait_for_stable_assignment([consumer], client, group, topic, 3)
        owner = owner_of(b"k", topic=topic, group_id=group, client=client)
        assert owner is not None and owner.member_id == consumer.memberid()
    finally:
        consumer.close()  # LeaveGroup (classic) / a heartbeat with member epoch -1 (KIP-848)
    deadline = time.monotonic() + 30
    while client.partition_owners(group, topic) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert owner_of(b"k", topic=topic, group_id=group, client=client) is None


def test_owner_of_a_group_without_members_or_topic(kafka_materializer_broker: Any,
                                                   kafka_materializer_topic_factory: Any) -> None:
    bootstrap = kafka_materializer_broker.bootstrap_servers
    topic = kafka_materializer_topic_factory(partitions=3)
    assert owner_of(b"k", topic=topic, group_id=f"no-such-group-{uuid.uuid4().hex[:8]}",
                    bootstrap_servers=bootstrap) is None
    with pytest.raises(TopicNotFoundError, match="does the topic exist"):
        owner_of(b"k", topic=f"no-such-topic-{uuid.uuid4().hex[:8]}", group_id="g", bootstrap_servers=bootstrap)
