"""Issue 39 (security and addressing): members forwarding over TLS with the token, an advertised
address that differs from the bound one, the Host header check, and a member whose CA does not
trust the others', against the session's real broker.

Three ``materializer run --group-id G --serve ... --serve-cert --serve-key --serve-token-file``
processes split a three-partition topic:

* A binds ``127.0.0.1:0``; B binds ``0.0.0.0:0`` and announces ``127.0.0.2:R`` (``--serve-advertise``),
  R the port of a TCP relay the test runs in front of it (a NAT's or a container's port mapping).
  A and B share one certificate (for 127.0.0.1 and 127.0.0.2), which is their CA.
* C has a certificate of its own and trusts only it (``--serve-ca-file``).

The test checks that a key of B's partition asked of A is forwarded through the relay (the
announced URL, never the bound one) over TLS with the token and answered by B (``served_by``),
that ``owner_of`` and ``get --group-id`` over HTTPS use the announced URL, that a ``Host`` header
naming another host is 400 while forwarded requests (``Host: 127.0.0.2:R``) pass, and that a
forward between members whose CAs do not trust each other's certificates is 503 ``reason: tls``,
never plain HTTP, never a traceback. Waits poll a condition with a deadline.
"""

from __future__ import annotations

import json
import socket
import ssl
import subprocess
import sys
import threading
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer

from materializer.adapters.group_members import GroupMembersClient
from materializer.group.routing import owner_of, partition_for_key

from tests.tls import self_signed

from .background_run import wait_until
from .serving_members import ServingMember

pytestmark = pytest.mark.broker

DEADLINE_S = 120.0  # generous on a loaded 2-core machine; never a timing assertion
PARTITIONS = 3
TOKEN = "members-s3cret"
KEYS = [f"k/{i:03d}" for i in range(30)]


def _http(url: str, cafile: Path, *, token: str | None = TOKEN, host: str | None = None) -> tuple[int, dict]:
    request = urllib.request.Request(url)
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    if host is not None:
        request.add_header("Host", host)
    context = ssl.create_default_context(cafile=str(cafile))
    try:
        with urllib.request.urlopen(request, timeout=30, context=context) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as error:
        with error:
            return error.code, json.loads(error.read())


class Relay:
    """A TCP relay on 127.0.0.2 (a NAT's port mapping): every connection goes on to ``target``,
    set once the member behind it has bound its port. Counts the connections it relayed."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.2", 0))
        self.port = self.listener.getsockname()[1]
        self.target: tuple[str, int] | None = None
        self.connections = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:  # closed
                return
            assert self.target is not None
            self.connections += 1
            upstream = socket.create_connection(self.target)
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for end in (source, sink):
                try:
                    end.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self.listener.close()


def test_members_forward_over_tls_to_the_advertised_address_and_refuse_an_untrusted_one(
        kafka_broker, create_topic, tmp_path) -> None:
    bootstrap = kafka_broker.bootstrap_servers
    topic = create_topic(partitions=PARTITIONS)
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "partitioner": "murmur2_random"})
    for key in KEYS:
        producer.produce(topic, key=key.encode(), value=f"v-{key}".encode())
    assert producer.flush(30) == 0
    group = f"serve-secure-{uuid.uuid4().hex[:10]}"
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    (tmp_path / "ab").mkdir()
    (tmp_path / "c").mkdir()
    cert, key = self_signed(tmp_path / "ab", ("127.0.0.1", "127.0.0.2"))  # A's and B's, and their CA
    cert_c, key_c = self_signed(tmp_path / "c")  # C's own, trusted by C only
    relay = Relay()
    members: list[ServingMember] = []
    try:
        a = ServingMember(bootstrap, topic, group, tmp_path / "data-a", token_file, scheme="https", serve=["--serve", "127.0.0.1:0", "--serve-cert", str(cert), "--serve-key", str(key)])
        members.append(a)
        b = ServingMember(bootstrap, topic, group, tmp_path / "data-b", token_file, scheme="https", serve=["--serve", "0.0.0.0:0", "--serve-cert", str(cert), "--serve-key", str(key),
                    "--serve-advertise", f"127.0.0.2:{relay.port}"])
        members.append(b)
        relay.target = ("127.0.0.1", b.port)
        assert f"advertised as https://127.0.0.2:{relay.port}" in "".join(b.stderr)
        c = ServingMember(bootstrap, topic, group, tmp_path / "data-c", token_file, scheme="https", serve=["--serve", "127.0.0.1:0", "--serve-cert", str(cert_c), "--serve-key", str(key_c),
                    "--serve-ca-file", str(cert_c)])
        members.append(c)
        url_a, url_b, url_c = a.url, f"https://127.0.0.2:{relay.port}", c.url

        def settled() -> dict[int, Any] | None:
            owners = GroupMembersClient(bootstrap, {}).partition_owners(group, topic)
            return owners if {o.serving_url for o in owners.values()} == {url_a, url_b, url_c} else None

        owners = wait_until(settled, DEADLINE_S, "three members, one partition each, their announced URLs")
        by_url = {o.serving_url: o for o in owners.values()}
        key_of = {url: next(k for k in KEYS if owners[partition_for_key(k, PARTITIONS)].serving_url == url)
                  for url in (url_a, url_b, url_c)}
        path = "/v1/topics/{}/keys/{}".format(topic, "{}")

        def get(base: str, k: str, cafile: Path = cert, **kwargs: Any) -> tuple[int, dict]:
            return _http(base + path.format(k.replace("/", "%2F")), cafile, **kwargs)

        # every member ready (each answers its own key)
        wait_until(lambda: get(url_a, key_of[url_a])[0] == 200 and get(url_b, key_of[url_b])[0] == 200
                   and get(url_c, key_of[url_c], cert_c)[0] == 200, DEADLINE_S, "every member caught up")

        # A forwards B's key to B's announced address (the relay), over TLS with the token; B answers
        before = relay.connections
        status, body = get(url_a, key_of[url_b])
        assert status == 200 and body["value"] == f"v-{key_of[url_b]}", body
        assert body["served_by"]["member_id"] == by_url[url_b].member_id
        assert body["served_by"]["address"] == f"127.0.0.2:{relay.port}"
        assert relay.connections > before  # through the announced port, not B's bound one
        # and back: B forwards A's key to A (Host: 127.0.0.1:port)
        status, body = get(url_b, key_of[url_a])
        assert status == 200 and body["served_by"]["member_id"] == by_url[url_a].member_id, body
        # owner_of names the announced URL
        found = owner_of(key_of[url_b], topic=topic, group_id=group, bootstrap_servers=bootstrap)
        assert found is not None and found.serving_url == url_b

        # the Host header check: a name this member is not known by is 400 (DNS rebinding), token or not
        for base in (url_a, url_b):
            status, body = get(base, key_of[url_a], host="evil.example")
            assert status == 400 and "Host header" in body["error"], body
        assert get(url_a, key_of[url_a], host=f"localhost:{a.port}")[0] == 200

        # C trusts only its own certificate: its forwards to A are 503 reason tls, and A's to C too
        for asker, cafile, owner_url in ((url_c, cert_c, url_a), (url_a, cert, url_c)):
            status, body = get(asker, key_of[owner_url], cafile)
            assert status == 503 and body["reason"] == "tls" and "TLS failure" in body["error"], body
            assert by_url[owner_url].member_id in body["error"] and "Traceback" not in json.dumps(body)
            assert str(tmp_path) not in json.dumps(body)  # no CA file path, no certificate path

        # get --group-id over HTTPS with the members' CA and token: from the owner's announced URL
        got = subprocess.run([sys.executable, "-m", "materializer", "get", "--group-id", group, "--bootstrap-servers",
                              bootstrap, "--topic", topic, key_of[url_b], "--serve-token-file", str(token_file),
                              "--serve-ca-file", str(cert), "--metadata"],
                             capture_output=True, text=True, timeout=120)
        assert got.returncode == 0 and got.stdout == f"v-{key_of[url_b]}\n", got.stderr
        assert by_url[url_b].member_id in got.stderr
        # C's key: C's certificate is not trusted, nor is the forward from A: exit 2 naming TLS, no traceback
        refused = subprocess.run([sys.executable, "-m", "materializer", "get", "--group-id", group,
                                  "--bootstrap-servers", bootstrap, "--topic", topic, key_of[url_c],
                                  "--serve-token-file", str(token_file), "--serve-ca-file", str(cert)],
                                 capture_output=True, text=True, timeout=120)
        assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr
        assert refused.stderr.startswith("error:") and "CERTIFICATE_VERIFY_FAILED" in refused.stderr
        assert "TLS failure" in refused.stderr, refused.stderr
    finally:
        for member in members:
            member.stop()
        relay.close()


def test_a_group_member_bound_to_every_interface_without_an_advertised_address_is_refused(
        kafka_broker, create_topic, tmp_path) -> None:
    topic = create_topic(partitions=1)
    run = subprocess.run([sys.executable, "-m", "materializer", "run", "--bootstrap-servers",
                          kafka_broker.bootstrap_servers, "--topic", topic, "--data-dir", str(tmp_path / "data"),
                          "--group-id", f"g-{uuid.uuid4().hex[:8]}", "--serve", "0.0.0.0:0", "--until-caught-up"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 2, run.stderr
    assert run.stderr.startswith("error:") and "--serve-advertise" in run.stderr and len(run.stderr.splitlines()) == 1
