"""Issue 39 (second slice): any member answers any key, against the session's real broker.

Three ``materializer run --group-id G --serve 127.0.0.1:0 --serve-token-file F`` processes split a
six-partition topic in a KIP-848 group whose ``consumer.session.timeout.ms`` is 6 s (a group
config). Each member's URL rides in its ``client.id``; the tests check that every key is answered
by every member with the owner's value and ``served_by`` (single gets, multi-gets, a scan paged
with its cursor), that ``owner_of`` names the owner's URL, that ``get --group-id`` reads a key over
HTTP with no data dir, and that a SIGKILLed owner gives 503 naming it (never 404) until the group
moves its partitions, then 200 from the new owner. Waits poll a condition with a deadline.
"""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.error
import urllib.request
import uuid
from typing import Any

import pytest
from confluent_kafka import Producer

from materializer.adapters.group_members import GroupMembersClient
from materializer.group.routing import owner_of, partition_for_key

from .background_run import wait_until
from .serving_members import ServingMember, fast_group

pytestmark = pytest.mark.broker

DEADLINE_S = 120.0  # generous on a loaded 2-core machine; never a timing assertion
PARTITIONS = 6
TOKEN = "members-s3cret"
KEYS = [f"k/{i:03d}" for i in range(60)]  # '/' in keys: percent-encoded on every hop


def _http(url: str, method: str = "GET", body: Any = None, token: str | None = TOKEN) -> tuple[int, dict, dict]:
    request = urllib.request.Request(url, method=method, data=None if body is None else json.dumps(body).encode())
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, {k.lower(): v for k, v in answer.headers.items()}, json.loads(answer.read())
    except urllib.error.HTTPError as error:
        with error:
            return error.code, {k.lower(): v for k, v in error.headers.items()}, json.loads(error.read())


@pytest.fixture
def three_members(kafka_broker, create_topic, tmp_path):
    bootstrap = kafka_broker.bootstrap_servers
    topic = create_topic(partitions=PARTITIONS)
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "partitioner": "murmur2_random"})
    for key in KEYS:
        producer.produce(topic, key=key.encode(), value=f"v-{key}".encode())
    assert producer.flush(30) == 0
    group = f"serve-members-{uuid.uuid4().hex[:10]}"
    fast_group(bootstrap, group)
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    members: list[ServingMember] = []
    try:
        for n in range(3):
            members.append(ServingMember(bootstrap, topic, group, tmp_path / f"data-{n}", token_file))
        yield bootstrap, topic, group, members, token_file
    finally:
        for member in members:
            member.stop()


def _owners(bootstrap: str, group: str, topic: str) -> dict[int, Any]:
    return GroupMembersClient(bootstrap, {}).partition_owners(group, topic)


def _settled(bootstrap: str, group: str, topic: str, urls: set[str]) -> dict[int, Any] | None:
    """The owners once every partition has an owner among ``urls`` and each of them holds one."""
    owners = _owners(bootstrap, group, topic)
    if len(owners) == PARTITIONS and {o.serving_url for o in owners.values()} == urls:
        return owners
    return None


def _address(url: str) -> str:
    return url.split("//", 1)[1]


def test_every_member_answers_every_key_with_the_owners_value(three_members) -> None:
    bootstrap, topic, group, members, token_file = three_members
    urls = {m.url for m in members}
    owners = wait_until(lambda: _settled(bootstrap, group, topic, urls), DEADLINE_S, "three members, one URL each")
    by_key = {key: owners[partition_for_key(key, PARTITIONS)] for key in KEYS}

    def all_answered() -> bool:  # every member ready (caught up): a 503 until then
        return all(_http(f"{m.url}/v1/topics/{topic}/keys:batch", "POST", KEYS)[0] == 200
                   and all(r["status"] == 200 for r in _http(f"{m.url}/v1/topics/{topic}/keys:batch", "POST",
                                                             KEYS)[2]["results"]) for m in members)

    wait_until(all_answered, DEADLINE_S, "every member to answer every key")
    for member in members:
        for key in KEYS[::3]:  # single gets: a third of the keys from every member
            status, _, body = _http(f"{member.url}/v1/topics/{topic}/keys/{key.replace('/', '%2F')}")
            owner = by_key[key]
            assert status == 200, (member.url, key, body)
            assert body["value"] == f"v-{key}" and body["partition"] == partition_for_key(key, PARTITIONS)
            # the owner answered, even when asked elsewhere: the forward carried the token (else 401)
            assert body["served_by"]["member_id"] == owner.member_id, (member.url, key)
            assert body["served_by"]["address"] == _address(owner.serving_url)
        status, _, body = _http(f"{member.url}/v1/topics/{topic}/keys:batch", "POST", KEYS)
        assert [(r["key"], r["value"], r["served_by"]["member_id"]) for r in body["results"]] == [
            (key, f"v-{key}", by_key[key].member_id) for key in KEYS]
        # a scan across members, 7 at a time with the cursor: every key once, in key order
        seen, cursor = [], None
        while True:
            status, _, page = _http(f"{member.url}/v1/topics/{topic}/scan?prefix=k%2F&limit=7"
                                    + ("" if cursor is None else f"&cursor={cursor}"))
            assert status == 200 and page["partial"] is False and page["partitions"] == list(range(PARTITIONS)), page
            assert len(page["items"]) <= 7
            seen += [(i["key"], i["value"], i["served_by"]["member_id"]) for i in page["items"]]
            cursor = page["next_cursor"]
            if cursor is None:
                break
        assert seen == [(key, f"v-{key}", by_key[key].member_id) for key in sorted(KEYS)]
        # a missing key of another member's partition: the owner's 404, not a 503 or a local guess
        absent = next(k for k in (f"absent-{i}" for i in range(100))
                      if owners[partition_for_key(k, PARTITIONS)].serving_url != member.url)
        status, _, body = _http(f"{member.url}/v1/topics/{topic}/keys/{absent}")
        assert status == 404 and "no live value" in body["error"], body

    # a forwarded request that is not local answers 503 (one hop, never forwarded twice)
    key = KEYS[0]
    elsewhere = next(m for m in members if m.url != by_key[key].serving_url)
    request = urllib.request.Request(f"{elsewhere.url}/v1/topics/{topic}/keys/{key.replace('/', '%2F')}",
                                     headers={"Authorization": f"Bearer {TOKEN}", "X-Materializer-Forwarded": "1"})
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=30)
    assert refused.value.code == 503 and "one hop" in json.loads(refused.value.read())["error"]
    assert _http(f"{elsewhere.url}/v1/topics/{topic}/keys/k", token=None)[0] == 401

    # owner_of names the owner's URL; get --group-id reads over HTTP from the right member, no data dir
    found = owner_of(key, topic=topic, group_id=group, bootstrap_servers=bootstrap)
    assert found is not None and found.serving_url == by_key[key].serving_url
    got = subprocess.run([sys.executable, "-m", "materializer", "get", "--group-id", group, "--bootstrap-servers",
                          bootstrap, "--topic", topic, key, "--serve-token-file", str(token_file), "--metadata"],
                         capture_output=True, text=True, timeout=120)
    assert got.returncode == 0 and got.stdout == f"v-{key}\n", got.stderr
    assert by_key[key].member_id in got.stderr
    missing = subprocess.run([sys.executable, "-m", "materializer", "get", "--group-id", group, "--bootstrap-servers",
                              bootstrap, "--topic", topic, "absent-key", "--serve-token-file", str(token_file)],
                             capture_output=True, text=True, timeout=120)
    assert missing.returncode == 1 and "not found" in missing.stderr, missing.stderr
    # several keys over HTTP (issue 42): one JSON line each, in order, exit 1 for the absent one
    several = subprocess.run([sys.executable, "-m", "materializer", "get", "--group-id", group, "--bootstrap-servers",
                              bootstrap, "--topic", topic, "--value-format", "str", key, "absent-key", KEYS[1],
                              "--serve-token-file", str(token_file)], capture_output=True, text=True, timeout=120)
    lines = [json.loads(line) for line in several.stdout.splitlines()]
    assert several.returncode == 1, several.stderr
    assert [(line["key"], line.get("value"), line.get("absent")) for line in lines] == [
        (key, f"v-{key}", None), ("absent-key", None, True), (KEYS[1], f"v-{KEYS[1]}", None)]


def test_a_killed_owner_is_503_naming_it_until_the_group_moves_its_partitions(three_members) -> None:
    bootstrap, topic, group, members, _ = three_members
    urls = {m.url for m in members}
    owners = wait_until(lambda: _settled(bootstrap, group, topic, urls), DEADLINE_S, "three members, one URL each")
    wait_until(lambda: all(r["status"] == 200 for m in members for r in _http(
        f"{m.url}/v1/topics/{topic}/keys:batch", "POST", KEYS)[2].get("results", [{"status": 503}])),
        DEADLINE_S, "every member to answer every key")
    victim = members[2]
    dead_id = next(o.member_id for o in owners.values() if o.serving_url == victim.url)
    key = next(k for k in KEYS if owners[partition_for_key(k, PARTITIONS)].serving_url == victim.url)
    asker = members[0]
    victim.process.kill()  # SIGKILL: no leave; the coordinator keeps it until its session times out
    victim.process.wait(30)
    seen_503_naming_it = []

    def answered_by_a_live_member() -> dict | None:
        status, headers, body = _http(f"{asker.url}/v1/topics/{topic}/keys/{key.replace('/', '%2F')}")
        assert status in (200, 503), (status, body)  # never 404: the key exists
        if status == 503:
            assert headers["retry-after"] and body["error"], body
            named = [o["member_id"] for o in body.get("owners", {}).values() if o]
            if dead_id in named:
                seen_503_naming_it.append(body)
            return None
        assert body["value"] == f"v-{key}" and body["served_by"]["member_id"] != dead_id, body
        return body

    body = wait_until(answered_by_a_live_member, DEADLINE_S, "a live member to take the dead one's partition")
    assert seen_503_naming_it, "the dead owner was never named in a 503 (it held the partition for 6 s)"
    assert "did not answer" in seen_503_naming_it[0]["error"] and victim.url in seen_503_naming_it[0]["error"]
    assert body["served_by"]["address"] in {_address(m.url) for m in members[:2]}


@pytest.mark.parametrize("protocol", ["classic", "consumer"])
def test_the_serving_url_in_client_id_reaches_owner_of_in_both_group_protocols(kafka_broker, create_topic,
                                                                                protocol) -> None:
    from materializer.adapters.group_membership import GroupMembership
    from materializer.adapters.partition_owner import serving_client_id

    topic = create_topic(partitions=2)
    group = f"serve-carrier-{protocol}-{uuid.uuid4().hex[:8]}"
    url = "https://member-1.example:8439"
    with GroupMembership(kafka_broker.bootstrap_servers, group, [topic], protocol=protocol,
                         client_id=serving_client_id("kafka-materializer-t", url)) as member:
        member.wait_until(lambda held: len(held) == 2, DEADLINE_S)
        found = owner_of("k", topic=topic, group_id=group, bootstrap_servers=kafka_broker.bootstrap_servers)
        assert found is not None and found.member_id == member.member_id
        assert found.serving_url == url and found.client_id == f"kafka-materializer-t;serve={url}"
    # gone with the member: a clean leave, and no owner (nor URL) is left behind
    wait_until(lambda: owner_of("k", topic=topic, group_id=group,
                                bootstrap_servers=kafka_broker.bootstrap_servers) is None, DEADLINE_S, "the member's leave")
