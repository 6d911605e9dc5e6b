"""Drive the playground page in Debian's Chromium (headless, through chromedriver and Selenium).

Shared by tests/e2e/test_playground_browser.py and tools/playground_check.py. Nothing here
downloads a browser: it uses /usr/bin/chromium and /usr/bin/chromedriver (Debian's chromium
and chromium-driver packages, which the Makefile installs).
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--autoplay-policy=no-user-gesture-required",
    "--window-size=1280,1000",
]


def browser_missing() -> str | None:
    """Why the browser cannot run here, or None."""
    for path in (CHROMIUM, CHROMEDRIVER):
        if shutil.which(path) is None:
            return f"{path} is not installed (Debian packages chromium and chromium-driver)"
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "the selenium package is not installed"
    return None


@dataclass
class PlaygroundRun:
    state: dict[str, Any]
    """window.playground when the stream was done: chunks, first audio, samples, peak..."""
    stats_text: str
    timeline_pixels: int
    """Non-white pixels the timeline canvas drew."""
    browser_log: list[str]
    spoken_text: str
    """The text the page shows, with its words highlighted as they play."""


def run_playground(
    url: str,
    text: str,
    *,
    route: str = "ws",
    stream_format: str = "audio",
    response_format: str = "pcm",
    word_by_word: bool = True,
    token: str = "",
    max_tokens: int | None = None,
    min_tokens: int | None = None,
    screenshot: Path | None = None,
    timeout_s: float = 60.0,
    until_played_out: bool = False,
    while_running: Callable[[dict[str, Any]], None] | None = None,
) -> PlaygroundRun:
    """Open the page at `url`, speak `text` and wait until the stream is done and its audio is
    playing (with `until_played_out`, until the last of it has played). `while_running` gets
    the page's state (window.playground) every 0.1 s meanwhile: a test cuts the network there."""

    from selenium.webdriver.common.by import By

    profile = tempfile.mkdtemp(prefix="playground-chromium-")
    driver = _chromium(profile)
    try:
        driver.set_page_load_timeout(30)
        driver.get(url)
        _fill_form(driver, text, route, stream_format, response_format, word_by_word)
        for element_id, value in (
            ("token", token),
            ("maxTokens", max_tokens),
            ("minTokens", min_tokens),
        ):
            if value:
                driver.find_element(By.ID, element_id).send_keys(str(value))
        driver.find_element(By.ID, "speak").click()
        _wait_done(driver, timeout_s, until_played_out, while_running)
        # Let the live timeline draw the last playback, then read it.
        time.sleep(0.3)
        state = driver.execute_script("return JSON.parse(JSON.stringify(window.playground))")
        pixels = driver.execute_script(_COUNT_TIMELINE_PIXELS)
        stats = driver.find_element(By.ID, "stats").text
        spoken = driver.find_element(By.ID, "spoken").text
        if screenshot is not None:
            screenshot.parent.mkdir(parents=True, exist_ok=True)
            driver.save_screenshot(str(screenshot))
        logs = [entry["message"] for entry in driver.get_log("browser")]
        return PlaygroundRun(state, stats, int(pixels), logs, spoken)
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


_COUNT_TIMELINE_PIXELS = """const c = document.getElementById('timeline');
   const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
   let n = 0; for (let i = 0; i < d.length; i += 4) if (d[i + 3] && (d[i] < 240 || d[i + 1] < 240 || d[i + 2] < 240)) n++;
   return n;"""


def _chromium(profile: str) -> Any:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in [*FLAGS, f"--user-data-dir={profile}"]:
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)


def _fill_form(
    driver: Any,
    text: str,
    route: str,
    stream_format: str,
    response_format: str,
    word_by_word: bool,
) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    box = driver.find_element(By.ID, "text")
    box.clear()
    box.send_keys(text)
    Select(driver.find_element(By.ID, "route")).select_by_value(route)
    if route == "post":  # the WebSocket route has no stream format
        Select(driver.find_element(By.ID, "streamFormat")).select_by_visible_text(stream_format)
        Select(driver.find_element(By.ID, "format")).select_by_visible_text(response_format)
    checkbox = driver.find_element(By.ID, "wordByWord")
    if checkbox.is_selected() != word_by_word:
        checkbox.click()


def _wait_done(
    driver: Any,
    timeout_s: float,
    until_played_out: bool,
    while_running: Callable[[dict[str, Any]], None] | None,
) -> None:
    """Until the page says the stream is done and its audio plays (or it failed)."""
    deadline = time.monotonic() + timeout_s
    state: dict[str, Any] = {}
    while time.monotonic() < deadline:
        state = driver.execute_script("return JSON.parse(JSON.stringify(window.playground))")
        played = driver.execute_script(
            "return window.playground.done && window.playground.peak > 0"
            + (" && window.playground.playedOut" if until_played_out else "")
        )
        if state.get("done") and (played or state.get("error")):
            return
        if while_running is not None and state.get("running"):
            while_running(state)
        time.sleep(0.1)
    raise TimeoutError(f"the playground did not finish in {timeout_s} s: {state}")
