"""The query server's addressing and hardening (issue 39): the advertised address and its checks,
the Host header check against DNS rebinding, and 503 bodies that keep the server's internals
(paths, exception text) to its log. Broker-backed tests: tests/integration/test_serve_secure.py."""

from __future__ import annotations

import json
import logging

import pytest

pytest.importorskip("starlette")  # the `serve` extra; the test dependency group installs it

from materializer.adapters.errors import SchemaRegistryError, StoreError  # noqa: E402
from materializer.adapters.partition_owner import PartitionOwner, serving_client_id, serving_url_of  # noqa: E402
from materializer.adapters.rocksdb_store import StateStore  # noqa: E402
from materializer.adapters.serdes import JsonSerde  # noqa: E402
from materializer.datadir.lease import StaleStoreError  # noqa: E402
from materializer.health import ProbeResult  # noqa: E402
from materializer.serve import TopicSource, create_app, view_source  # noqa: E402
from materializer.serve.addresses import advertised_url, allowed_host_names, parse_advertise  # noqa: E402
from materializer.serve.hosts import AllowedHosts  # noqa: E402
from materializer.storage.errors import IncompleteDataDirError  # noqa: E402
from materializer.storage.record_batch import Record  # noqa: E402
from materializer.view import MaterializedView, ServedPartitions  # noqa: E402
from tests.tls import self_signed  # noqa: E402

from .test_serve import call  # noqa: E402

SECRET_PATH = "/srv/secret-data-dir/state/orders/000042.sst"


@pytest.fixture
def store(tmp_path):
    with StateStore(tmp_path / "state") as opened:
        opened.apply({0: [Record(0, 1_000, b"k", b'{"n": 1}')]}, {0: 1})
        yield opened


# -- the advertised address ------------------------------------------------------------------------

def test_the_advertised_address_defaults_to_the_bound_one_and_takes_its_port_when_none_is_given():
    assert advertised_url("127.0.0.1", 8439, tls=False, advertise=None, required=True) == "http://127.0.0.1:8439"
    assert advertised_url("::1", 8439, tls=True, advertise=None, required=True) == "https://[::1]:8439"
    assert advertised_url("0.0.0.0", 8439, tls=True, advertise="member-1.svc", required=True) \
        == "https://member-1.svc:8439"
    assert advertised_url("0.0.0.0", 8439, tls=False, advertise="10.0.0.7:30439", required=True) \
        == "http://10.0.0.7:30439"
    assert advertised_url("::", 8439, tls=False, advertise="[fd00::7]:9000", required=True) == "http://[fd00::7]:9000"
    assert parse_advertise("fd00::7") == ("fd00::7", None)


@pytest.mark.parametrize("bound", ["0.0.0.0", "::"])
def test_a_group_member_bound_to_every_interface_must_say_what_to_announce(bound):
    with pytest.raises(ValueError, match="--serve-advertise"):
        advertised_url(bound, 8439, tls=False, advertise=None, required=True)
    # without a group nothing is announced: its answers name this machine
    assert advertised_url(bound, 8439, tls=False, advertise=None, required=False,
                          machine_name="box.example") == "http://box.example:8439"
    assert advertised_url(bound, 8439, tls=False, advertise=None, required=False, machine_name="not a name!") \
        == ("http://[::1]:8439" if bound == "::" else "http://127.0.0.1:8439")


@pytest.mark.parametrize("bad", ["0.0.0.0", "0.0.0.0:8439", "[::]:8439", "::", ":8439", "", "host:0", "host:65536",
                                 "host:x", "bad host", "-lead.example", "a..b", "[::1", "x" * 64 + ".example",
                                 ".".join(["a" * 63] * 4) + ".b", "host;serve=http://evil:1"])
def test_an_advertised_address_others_cannot_use_is_refused(bad):
    with pytest.raises(ValueError):
        advertised_url("0.0.0.0", 8439, tls=False, advertise=bad, required=True)


def test_the_longest_host_name_fits_in_client_id_and_comes_back_whole():
    longest = ".".join(["a" * 63] * 3 + ["b" * 61])  # 253 characters: RFC 1035's bound
    assert len(longest) == 253
    url = advertised_url("0.0.0.0", 65535, tls=True, advertise=longest, required=True)
    client_id = serving_client_id("kafka-materializer-" + "t" * 249, url)  # a topic name is 249 at most
    assert serving_url_of(client_id) == url and len(client_id) < 32767  # Kafka's STRING: int16 length
    with pytest.raises(ValueError):
        parse_advertise(longest + "c")


# -- the Host header check -------------------------------------------------------------------------

def test_allowed_host_names_are_the_bound_and_advertised_hosts_loopback_and_extras():
    assert allowed_host_names("0.0.0.0", "https://member-1.svc:8439", ["api.example", " ", "*.corp.example"]) == (
        "member-1.svc", "localhost", "127.0.0.1", "::1", "api.example", "*.corp.example")
    assert allowed_host_names("10.0.0.7", "http://[fd00::7]:1") == ("10.0.0.7", "fd00::7", "localhost", "127.0.0.1",
                                                                     "::1")


def test_a_request_naming_another_host_is_400_json_dns_rebinding(store):
    app = create_app([view_source("t", MaterializedView(store, value_serde=JsonSerde()))], token="tok",
                     allowed_hosts=allowed_host_names("127.0.0.1", "http://member-1.svc:8439", ["*.corp.example"]))
    auth = (b"authorization", b"Bearer tok")
    for host in (b"evil.example:8439", b"evil.example", b"127.0.0.1.evil.example", b"corp.example", b""):
        status, _, body = call(app, "GET", "/v1/topics/t/keys/k", headers=[(b"host", host), auth])
        assert status == 400 and "Host header" in body["error"], (host, body)
    # refused before the token is looked at: a page cannot probe for it either
    assert call(app, "GET", "/v1/topics/t/keys/k", headers=[(b"host", b"evil.example")])[0] == 400
    # two Host headers (RFC 9112 §3.2), even if one is allowed
    assert call(app, "GET", "/v1/topics/t/keys/k", headers=[(b"host", b"localhost"), (b"host", b"evil.example"),
                                                             auth])[0] == 400
    for host in (b"127.0.0.1:8439", b"localhost", b"LOCALHOST:1", b"[::1]:8439", b"member-1.svc:8439",
                 b"a.corp.example"):
        status, _, body = call(app, "GET", "/v1/topics/t/keys/k", headers=[(b"host", host), auth])
        assert status == 200 and body["value"] == {"n": 1}, (host, body)
    # the unit tests' helper sends "Host: test": no check unless asked (an embedding app checks its own)
    plain = create_app([view_source("t", MaterializedView(store, value_serde=JsonSerde()))])
    assert call(plain, "GET", "/v1/topics/t/keys/k")[0] == 200
    assert AllowedHosts(plain, ["*"]).allows("anything") and not AllowedHosts(plain, ["a"]).allows("")
    with pytest.raises(ValueError):
        AllowedHosts(plain, [" "])


# -- 503 bodies ------------------------------------------------------------------------------------

class _FailingView(MaterializedView):
    def __init__(self, store, error: Exception) -> None:
        super().__init__(store, value_serde=JsonSerde())
        self.error = error

    def get_entry(self, key):
        raise self.error

    def get_entries(self, keys, **kwargs):  # keys:batch reads with one multi-get
        raise self.error


@pytest.mark.parametrize(("error", "kind"), [
    (StoreError(f"IO error: No such file or directory: While open a file for random read: {SECRET_PATH}"), "store"),
    (StaleStoreError(f"the store in {SECRET_PATH} is 9000 ms old, more than max_staleness_ms 1000", None), "stale"),
    (IncompleteDataDirError(f"{SECRET_PATH}: a rebuild is in progress"), "incomplete"),
    (SchemaRegistryError(f"https://user:pw@registry.example/schemas/ids/7 ({SECRET_PATH})"), "schema_registry"),
], ids=["store", "stale", "incomplete", "schema-registry"])
def test_a_503_says_a_stable_reason_and_keeps_paths_to_the_log(store, caplog, error, kind):
    app = create_app([TopicSource("t", lambda: _FailingView(store, error))])
    with caplog.at_level(logging.WARNING, logger="materializer.serve"):
        status, headers, body = call(app, "GET", "/v1/topics/t/keys/k")
    assert status == 503 and headers["retry-after"] == "1" and body["reason"] == kind, body
    text = json.dumps(body)
    assert "secret-data-dir" not in text and "pw@" not in text, body
    assert SECRET_PATH in caplog.text  # the operator still sees it
    status, _, body = call(app, "POST", "/v1/topics/t/keys:batch", body=b'["k"]')
    assert body["results"][0]["status"] == 503 and "secret-data-dir" not in json.dumps(body)


def test_a_not_ready_503_names_a_failed_ingest_by_its_kind_only(store, caplog):
    reason = f"ingest failed: StoreCorruptedError: Corruption: block checksum mismatch in {SECRET_PATH}"
    app = create_app([TopicSource("t", lambda: MaterializedView(store, value_serde=JsonSerde()),
                                  lambda: ProbeResult(False, (reason, "the Kafka cluster does not answer")))])
    with caplog.at_level(logging.WARNING, logger="materializer.serve"):
        status, _, body = call(app, "GET", "/v1/topics/t/keys/k")
    assert status == 503 and "secret-data-dir" not in json.dumps(body), body
    assert body["reasons"] == ["ingest failed (StoreCorruptedError; the detail is in the server's log)",
                               "the Kafka cluster does not answer"]
    assert SECRET_PATH in caplog.text


def test_an_unreachable_owner_is_503_naming_the_failure_kind_not_the_ca_file(store, tmp_path, caplog):
    from materializer.serve import QueryServer
    from materializer.serve.forwarding import Forwarding

    ca, key = self_signed(tmp_path)
    other_dir = tmp_path / "other"
    other_dir.mkdir()
    other_ca, _ = self_signed(other_dir)
    app_b = create_app([view_source("t", MaterializedView(store, value_serde=JsonSerde()))])

    def member_a(url: str, router: Forwarding):
        owner = PartitionOwner(0, "member-b", f"c;serve={url}", "/127.0.0.1")
        served = ServedPartitions("t", "g", lambda: frozenset(), lambda: 1, owners=lambda: {0: owner})
        return create_app([TopicSource("t", lambda: MaterializedView(store, value_serde=JsonSerde(), served=served),
                                       group_id="g", member_id=lambda: "member-a")], router=router)

    with QueryServer(app_b, certfile=ca, keyfile=key) as tls_b, QueryServer(app_b) as plain_b:
        cases = [(tls_b.url, Forwarding(cafile=other_ca), "tls"),  # not signed by the CA this member trusts
                 (plain_b.url, Forwarding(cafile=ca), "tls"),  # plain http under TLS: not sent
                 (tls_b.url, Forwarding(cafile=ca), None)]  # trusted: answered by the owner
        for url, router, kind in cases:
            with caplog.at_level(logging.WARNING, logger="materializer.serve"):
                status, _, body = call(member_a(url, router), "GET", "/v1/topics/t/keys/k")
            if kind is None:
                assert status == 200 and body["value"] == {"n": 1}, body
                continue
            assert status == 503 and body["reason"] == kind and "TLS failure" in body["error"], body
            assert "member-b" in body["error"] and url in body["error"]
            assert str(tmp_path) not in json.dumps(body) and "Traceback" not in json.dumps(body)
    assert "CERTIFICATE_VERIFY_FAILED" in caplog.text and str(ca) in caplog.text  # the detail is logged
