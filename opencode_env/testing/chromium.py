"""A real headless Chromium (Debian's `chromium` + `chromium-driver`) driven by selenium, for the viewer's tests and
bench/viewer_open.py. It needs the dev dependencies (selenium, pytest: a missing Chromium skips the test)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.chromium.webdriver import ChromiumDriver as WebDriver

DEFAULT_ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
ARTIFACTS = Path(os.environ.get("OPENCODE_ENV_TEST_ARTIFACTS", DEFAULT_ARTIFACTS))
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--window-size=1280,1600",
]


def _binary(*names: str) -> str | None:
    return next((found for name in names if (found := shutil.which(name))), None)


@contextlib.contextmanager
def chromium() -> Iterator[WebDriver]:
    browser, driver = _binary("chromium", "chromium-browser"), _binary("chromedriver")
    if browser is None or driver is None:
        pytest.skip("needs Debian's chromium and chromium-driver (./dev setup installs them as root)")
    # Selenium Manager is never needed (both binaries are given) and must not phone home.
    os.environ.setdefault("SE_AVOID_STATS", "true")
    os.environ.setdefault("SE_OFFLINE", "true")
    with tempfile.TemporaryDirectory(prefix="viewer-chromium-") as profile:
        options = webdriver.ChromeOptions()
        options.binary_location = browser
        for flag in [*FLAGS, f"--user-data-dir={profile}"]:
            options.add_argument(flag)
        options.set_capability("goog:loggingPrefs", {"performance": "ALL"})
        session = webdriver.Chrome(options=options, service=Service(executable_path=driver))
        try:
            yield session
        finally:
            session.quit()


def requested_urls(session: WebDriver) -> list[str]:
    """Every URL the page asked the network stack for since the last call (DevTools Network events)."""
    urls = []
    for entry in session.get_log("performance"):  # type: ignore[no-untyped-call]  # selenium leaves it untyped
        message = json.loads(entry["message"])["message"]
        if message["method"] == "Network.requestWillBeSent":
            urls.append(message["params"]["request"]["url"])
    return urls


NETWORK_SCHEMES = ("http:", "https:", "ws:", "wss:", "ftp:")


def network_requests(session: WebDriver) -> list[str]:
    """The requested URLs that would leave the browser (not chrome://, data:, blob: or file:)."""
    return [url for url in requested_urls(session) if url.startswith(NETWORK_SCHEMES)]


def rgb(css_colour: str) -> tuple[int, int, int]:
    match = re.match(r"rgba?\((\d+), (\d+), (\d+)", css_colour)
    assert match is not None, css_colour
    red, green, blue = (int(part) for part in match.groups())
    return red, green, blue


def save_screenshot(session: WebDriver, name: str) -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / name
    session.save_screenshot(str(path))
    return path
