"""Issue 39: the query server's status page (``GET /``) in a real headless Chromium, against the
session's real broker.

Two ``materializer run --group-id G --serve 127.0.0.1:0 --serve-token-file F`` members split a
four-partition topic. Chromium (Debian's, through Selenium: tests/chromium.py) first gets no
page without the token, then one after a Basic login with the token as the password, then sends
it on every request (``Authorization: Bearer``, set through the DevTools protocol as a header
extension would) and loads each member's page. What the page must show is
what the broker says, asked through confluent-kafka, not through the code under test: each
member's partitions (the group's assignment, DescribeConsumerGroups) are "served here" with the
broker's high watermark and lag 0, the other member's partitions name that member's URL. Then the
lookup box: a key typed and submitted shows the value produced, its partition (the producer's
delivery report) and offset, served by this member, and a key of the other member's partition is
answered by that member (forwarded). No request leaves 127.0.0.1 (Chromium's network log).

``MATERIALIZER_STATUS_SCREENSHOT=docs/images/status-page.png`` writes the page, after the forwarded
lookup, as the screenshot docs/serving.md shows (docs/development.md).
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from tests.chromium import headless_chromium, requested_urls

from .background_run import wait_until
from .serving_members import ServingMember, fast_group

pytestmark = pytest.mark.broker

DEADLINE_S = 90.0  # generous on a loaded 2-core machine; never a timing assertion
PARTITIONS = 4
TOKEN = "page-s3cret"
KEYS = [f"customer/{i:02d}" for i in range(24)]


def _produce(bootstrap: str, topic: str) -> dict[str, tuple[int, int]]:
    """Produce ``v-<key>`` for every key; key -> (partition, offset) from the delivery reports."""
    delivered: dict[str, tuple[int, int]] = {}

    def report(error: Any, message: Any) -> None:
        assert error is None, error
        delivered[message.key().decode()] = (message.partition(), message.offset())

    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "partitioner": "murmur2_random"})
    for key in KEYS:
        producer.produce(topic, key=key.encode(), value=f"v-{key}".encode(), on_delivery=report)
    assert producer.flush(30) == 0 and len(delivered) == len(KEYS)
    return delivered


def _high_watermarks(bootstrap: str, topic: str) -> dict[int, int]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"hw-{uuid.uuid4().hex[:8]}"})
    try:
        return {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1] for p in range(PARTITIONS)}
    finally:
        consumer.close()


def _assignment(admin: AdminClient, group: str, topic: str) -> dict[str, set[int]] | None:
    """The group's assignment as the coordinator describes it: serving URL (from each member's
    ``client.id``, ``<name>;serve=<url>``) -> its partitions of ``topic``; None while not described."""
    try:
        description = admin.describe_consumer_groups([group], request_timeout=10)[group].result(timeout=15)
    except Exception:  # noqa: BLE001 - the group does not exist yet: ask again
        return None
    held: dict[str, set[int]] = {}
    for member in description.members or ():
        url = member.client_id.partition(";serve=")[2]
        partitions = member.assignment.topic_partitions if member.assignment is not None else ()
        held.setdefault(url, set()).update(tp.partition for tp in partitions if tp.topic == topic)
    return held


def _rows(driver: Any) -> dict[int, dict[str, str]]:
    """The partitions table as the browser shows it: partition -> {column (a cell's first class): text}."""
    from selenium.webdriver.common.by import By

    rows = {}
    for row in driver.find_elements(By.CSS_SELECTOR, "table.partitions tbody tr[data-partition]"):
        cells = {cell.get_attribute("class").split()[0]: cell.text for cell in row.find_elements(By.TAG_NAME, "td")}
        rows[int(row.get_attribute("data-partition"))] = cells
    return rows


def _look_up(driver: Any, key: str) -> dict[str, str]:
    """Type ``key`` into the lookup box, submit, and return the result as shown."""
    from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
    from selenium.webdriver.common.by import By

    box = driver.find_element(By.ID, "lookup-key")
    box.clear()
    box.send_keys(key)
    driver.find_element(By.ID, "lookup-submit").click()

    def shown() -> dict[str, str] | None:
        try:
            if driver.find_element(By.ID, "lookup-key-echo").text != key:
                return None
            result = driver.find_element(By.ID, "lookup-result")
            fields = {"status": result.get_attribute("data-status")}
            for name in ("value", "partition", "offset", "served-by", "error"):
                found = result.find_elements(By.ID, f"lookup-{name}")
                if found:
                    fields[name] = found[0].text
            return fields
        except (NoSuchElementException, StaleElementReferenceException):  # the next page is loading
            return None

    return wait_until(shown, DEADLINE_S, f"the lookup of {key!r} shown")


def test_the_status_page_in_headless_chromium(kafka_broker, create_topic, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By

    bootstrap = kafka_broker.bootstrap_servers
    with headless_chromium() as driver:  # first: a machine without Chromium skips before starting members
        topic = create_topic(f"customers-{uuid.uuid4().hex[:8]}", partitions=PARTITIONS,
                             config={"cleanup.policy": "compact"})
        delivered = _produce(bootstrap, topic)
        highs = _high_watermarks(bootstrap, topic)
        assert sum(highs.values()) == len(KEYS)
        group = f"status-page-{uuid.uuid4().hex[:10]}"
        fast_group(bootstrap, group)
        admin = AdminClient({"bootstrap.servers": bootstrap})
        token_file = tmp_path / "token"
        token_file.write_text(TOKEN + "\n")
        members: list[ServingMember] = []
        try:
            for n in range(2):
                members.append(ServingMember(bootstrap, topic, group, tmp_path / f"data-{n}", token_file))
            urls = [m.url for m in members]
            held = wait_until(lambda: (lambda a: a if a is not None and set(a) == set(urls) and all(a.values())
                                       and sorted(set().union(*a.values())) == list(range(PARTITIONS)) else None)(
                _assignment(admin, group, topic)), DEADLINE_S, "both members holding partitions")

            # without the token: a 401 asking for HTTP Basic (the browser's login prompt), no page
            driver.get(urls[0] + "/")
            assert "served here" not in driver.page_source
            # the browser's Basic login, the token as the password (here in the URL, as a prompt sends it)
            host = urls[0].removeprefix("http://")
            driver.get(f"http://anyone:{TOKEN}@{host}/")
            wait_until(lambda: "served here" in driver.page_source, DEADLINE_S, "the page after a Basic login")
            # with it, sent on every request as a header extension would
            driver.execute_cdp_cmd("Network.enable", {})
            driver.execute_cdp_cmd("Network.setExtraHTTPHeaders", {"headers": {"Authorization": f"Bearer {TOKEN}"}})

            seen: list[Any] = []
            for url, other in ((urls[0], urls[1]), (urls[1], urls[0])):
                def as_the_broker_says(url: str = url, other: str = other) -> bool:
                    driver.get(url + "/")
                    rows = _rows(driver)
                    seen[:] = [rows]
                    mine = all(rows.get(p, {}).get("state") == "served here"
                               and rows[p]["high-watermark"] == str(highs[p]) and rows[p]["lag"] == "0"
                               and rows[p]["next-offset"] == str(highs[p]) for p in held[url])
                    theirs = all(rows.get(p, {}).get("state") == "another member" and other in rows[p]["owner"]
                                 and rows[p]["high-watermark"] == "—" for p in held[other])
                    return mine and theirs and set(rows) == set(range(PARTITIONS))

                try:
                    wait_until(as_the_broker_says, DEADLINE_S, f"{url}'s page to show the broker's high watermarks")
                except AssertionError as exc:
                    raise AssertionError(f"{exc}: {highs}, the assignment {held}; the page shows {seen}") from None
                assert "ready" in driver.find_element(By.CSS_SELECTOR, "section.topic h2 .badge").text
                assert driver.find_element(By.CSS_SELECTOR, ".generation").text.isdigit()
                assert driver.find_element(By.CSS_SELECTOR, ".store-bytes").text.endswith("bytes)")

            # the lookup box on the first member: its own key, then one the other member holds
            driver.get(urls[0] + "/")
            for url in urls:
                key = next(k for k in KEYS if delivered[k][0] in held[url])
                shown = _look_up(driver, key)
                assert shown["status"] == "200", shown
                assert shown["value"] == f'"v-{key}"'  # as the JSON API answers a str value
                assert (int(shown["partition"]), int(shown["offset"])) == delivered[key]
                assert f"address {urlsplit(url).netloc}" in shown["served-by"], (url, shown)  # the owner answered
            shown = _look_up(driver, "nobody/here")
            assert shown["status"] in ("404",) and "no live value" in shown["error"], shown
            key = next(k for k in KEYS if delivered[k][0] in held[urls[1]])
            _look_up(driver, key)
            if os.environ.get("MATERIALIZER_STATUS_SCREENSHOT"):
                driver.save_screenshot(os.environ["MATERIALIZER_STATUS_SCREENSHOT"])

            # nothing went over the network but to the two members on 127.0.0.1 (the browser's own
            # chrome:// pages and data: URLs do not leave it)
            asked = [u for u in requested_urls(driver) if urlsplit(u).scheme not in ("chrome", "data", "about")]
            # (host, port): the Basic login's URL carries user info
            assert asked and {(urlsplit(u).hostname, urlsplit(u).port) for u in asked} <= {
                (urlsplit(u).hostname, urlsplit(u).port) for u in urls}, asked
            assert all(urlsplit(u).hostname == "127.0.0.1" for u in asked), asked
        finally:
            for member in members:
                member.stop()
