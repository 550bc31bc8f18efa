"""The query server's status page (``GET /``, materializer.serve.status_page) through the ASGI
interface over real RocksDB stores: markup in topics, keys and values shows as text; the bearer
token guards it; the lookup box answers as the JSON API (forwarding included); a view says what it
does not know. The browser test against real members is tests/integration/test_status_page.py."""

from __future__ import annotations

import base64

import re
from html import unescape
from urllib.parse import urlencode

import pytest

pytest.importorskip("starlette")  # the `serve` extra; the test dependency group installs it
pytest.importorskip("jinja2")

from materializer.adapters.rocksdb_store import StateStore  # noqa: E402
from materializer.adapters.serdes import JsonSerde, StrSerde  # noqa: E402
from materializer.serve import TopicSource, create_app, view_source  # noqa: E402
from materializer.serve.status import view_status  # noqa: E402
from materializer.storage.record_batch import Record  # noqa: E402
from materializer.view import MaterializedView  # noqa: E402
from tests.unit.materializer.serve import test_serve as _serve  # noqa: E402
from tests.unit.materializer.serve.test_serve import AUTH, call_raw  # noqa: E402

store, two_members = _serve.store, _serve.two_members  # the JSON API tests' fixtures, used by name

SCRIPT = "<script>alert(1)</script>"


def page(app, query: dict[str, str] | None = None, headers=()) -> tuple[int, dict[str, str], str]:
    status, answer_headers, body = call_raw(app, "GET", "/", urlencode(query or {}), headers=headers)
    return status, answer_headers, body.decode("utf-8")


def lookup_result(html: str) -> str:
    """The lookup result's text (tags dropped, entities decoded: what a reader sees)."""
    found = re.search(r'<div id="lookup-result".*?</div>\s*</section>', html, re.S)
    assert found, html
    return unescape(re.sub(r"<[^>]+>", " ", found.group(0)))


def test_markup_in_a_topic_key_or_value_shows_as_text_never_as_markup(tmp_path) -> None:
    topic, key, value = f"t{SCRIPT}", f"k{SCRIPT}\"'&", f"<img src=x onerror=alert(2)>{SCRIPT}"
    with StateStore(tmp_path / "state") as opened:
        opened.apply({0: [Record(0, 1_000, key.encode(), value.encode())]}, {0: 1})
        app = create_app([view_source(topic, MaterializedView(opened, value_serde=StrSerde()))], served_by="h:1")
        status, headers, html = page(app, {"topic": topic, "key": key})
    assert status == 200 and headers["content-type"].startswith("text/html")
    # no markup of the data reaches the page: not a tag, not an attribute, not a script
    assert "<script" not in html.lower() and "<img" not in html.lower()
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    result = lookup_result(html)
    assert f"key {key} of {topic}" in " ".join(result.split())
    assert f'"{value}"' in result  # the value as the JSON API decodes it: a JSON string
    # the key typed stays in the box, as an attribute value that does not break out of its quotes
    assert 'value="k&lt;script&gt;alert(1)&lt;/script&gt;&#34;&#39;&amp;"' in html
    # and nothing is loaded from anywhere: the CSP refuses it
    assert headers["content-security-policy"].startswith("default-src 'none'")
    assert "http://" not in html and "https://" not in html


def test_the_page_needs_the_bearer_token_as_every_endpoint(store) -> None:
    app = create_app([view_source("t", MaterializedView(store, value_serde=JsonSerde()))], token="s3cret")
    status, headers, body = page(app)
    # the page asks a browser for HTTP Basic (its login prompt), the token as the password
    assert status == 401 and headers["www-authenticate"].startswith("Basic") and "token" in body
    assert "user:1" not in body
    status, _, body = page(app, {"topic": "t", "key": "user:1"}, headers=[(b"authorization", b"Bearer wrong")])
    assert status == 401 and '"n": 3' not in body
    status, headers, body = page(app, {"topic": "t", "key": "user:1"},
                                 headers=[(b"authorization", b"Bearer s3cret")])
    assert status == 200 and headers["content-type"].startswith("text/html")
    assert '"n": 3' in lookup_result(body)
    for credentials, allowed in ((b"anyone:s3cret", True), (b":s3cret", True), (b"s3cret:", False),
                                 (b"anyone:wrong", False), (b"s3cret", False)):
        basic = b"Basic " + base64.b64encode(credentials)
        status, _, body = page(app, {"topic": "t", "key": "user:1"}, headers=[(b"authorization", basic)])
        assert (status == 200) is allowed and ('"n": 3' in (lookup_result(body) if allowed else body)) is allowed, \
            credentials
    assert page(app, headers=[(b"authorization", b"Basic not-base64!")])[0] == 401


def test_lookup_answers_as_the_json_api_absent_bad_and_unknown_topic_are_messages(store) -> None:
    app = create_app([view_source("t", MaterializedView(store, value_serde=JsonSerde()))], served_by="h:1")
    _, _, html = page(app, {"topic": "t", "key": "user:1"})
    result = " ".join(lookup_result(html).split())
    assert '"n": 3' in result and "served by address h:1" in result
    assert re.search(r'id="lookup-result" data-status="200"', html)
    _, _, html = page(app, {"topic": "t", "key": "gone"})  # a tombstone: no live value
    assert 'data-status="404"' in html and "no live value" in lookup_result(html)
    _, _, html = page(app, {"topic": "t", "key": "!!", "key_encoding": "base64"})
    assert 'data-status="400"' in html and "base64" in lookup_result(html)
    _, _, html = page(app, {"topic": "nope", "key": "k"})
    assert 'data-status="404"' in html and "not served here" in lookup_result(html)
    _, _, html = page(app)  # no key asked: no result
    assert 'id="lookup-result"' not in html


def test_a_key_another_member_holds_is_looked_up_there_through_the_forwarding(two_members) -> None:
    app_a, _server_b, _p_a, p_b = two_members
    status, _, html = page(app_a(), {"topic": "t", "key": "user:2"}, headers=AUTH)
    result = " ".join(lookup_result(html).split())
    assert status == 200 and 'data-status="200"' in html, result
    assert '"n": 4' in result and "member_id member-b" in result and "address b:1" in result
    assert f"partition {p_b}" in result


def test_a_view_shows_what_it_knows_and_says_what_it_does_not(store) -> None:
    view = MaterializedView(store, value_serde=JsonSerde())
    status = view_status("t", view)
    assert [(p.partition, p.state, p.next_offset, p.high_watermark, p.lag) for p in status.partitions] == [
        (partition, "served here", offset, None, None) for partition, offset in sorted(store.offsets().items())]
    assert status.store_bytes is not None and status.store_bytes > 0 and status.cleaner_rounds is None
    assert any("high watermarks" in u for u in status.unknown)
    _, _, html = page(create_app([view_source("t", view)]))
    assert "not known here: high watermarks and lag" in html and "cleaner rounds" in html
    # a source without a status: the page says so instead of failing
    _, _, html = page(create_app([TopicSource("u", lambda: view)]))
    assert "reports no status" in html


def test_a_status_that_fails_is_a_message_on_the_page_not_a_500(store, caplog) -> None:
    def broken():
        raise RuntimeError("boom")

    app = create_app([TopicSource("t", lambda: MaterializedView(store), status=broken)])
    status, _, html = page(app)
    assert status == 200 and "could not be read" in html and "boom" not in html
    assert "boom" in caplog.text



def test_a_run_not_started_yet_is_not_ready_with_its_store_unknown(tmp_path) -> None:
    from materializer.materializer import Materializer
    from materializer.serve import source_of

    materializer = Materializer("127.0.0.1:1", "t", tmp_path / "data")  # nothing connects before start
    try:
        status, _, html = page(create_app([source_of(materializer)]))
    finally:
        materializer.close()
    assert status == 200 and "not ready" in html and "the run loop is not running" in html
    assert "not known here: the store" in html and "no partition known yet" in html
