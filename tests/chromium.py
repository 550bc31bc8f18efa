"""A real headless Chromium for browser tests: Debian's ``chromium`` driven by Selenium through
Debian's ``chromedriver`` (``apt-get install chromium chromium-driver``; ``.ci/run`` installs them).

Both binaries are named, so Selenium Manager never looks for or downloads a browser or a driver;
the flags keep Chromium off the network (no background requests, no component updates, no sync,
no QUIC) with a fresh profile. Performance logging is on: :func:`requested_urls` lists every URL the
page asked for, so a test can assert that nothing left the machine.

Outside CI a machine without the binaries or Selenium skips the test with the reason; in CI
(``CI=true``, which ``.ci/run`` exports) the test fails instead, as tests/tmpfs.py does.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Iterator

import pytest

__all__ = ["CHROMEDRIVER", "CHROMIUM", "headless_chromium", "requested_urls"]

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-default-apps", "--disable-extensions", "--window-size=1100,1000")


def _missing(reason: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(reason)
    pytest.skip(reason)


@contextlib.contextmanager
def headless_chromium() -> Iterator[Any]:
    """A Selenium ``webdriver.Chrome`` on Debian's headless Chromium (module docstring); quit after."""
    missing = [str(p) for p in (CHROMIUM, CHROMEDRIVER) if not p.is_file()]
    if missing:
        _missing(f"{' and '.join(missing)} missing: apt-get install chromium chromium-driver")
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError as exc:
        _missing(f"selenium is not installed (the test dependency group has it): {exc}")
    with tempfile.TemporaryDirectory(prefix="chromium-profile-") as profile:
        options = webdriver.ChromeOptions()
        options.binary_location = str(CHROMIUM)
        for flag in (*FLAGS, f"--user-data-dir={profile}"):
            options.add_argument(flag)
        options.set_capability("goog:loggingPrefs", {"performance": "ALL"})
        driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
        try:
            yield driver
        finally:
            driver.quit()


def requested_urls(driver: Any) -> list[str]:
    """The URLs the browser sent a request for since the last call (its performance log's
    ``Network.requestWillBeSent`` events)."""
    urls = []
    for entry in driver.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message.get("method") == "Network.requestWillBeSent":
            urls.append(message["params"]["request"]["url"])
    return urls
