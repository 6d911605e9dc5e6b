"""The playground page in a real headless Chromium (Debian's, driven by Selenium): it loads,
streams a sentence word by word over the WebSocket, plays it (the AudioContext receives and
outputs samples) and draws the timeline. The screenshot for bench/results comes from
tools/playground_check.py, not from here."""

from __future__ import annotations

import sys

import pytest

from httputil import TOKEN, engine_idle, http_server, http_url
from polling import wait_until
from serverutil import REPO

sys.path.insert(0, str(REPO / "tools"))
from _playground import browser_missing, run_playground  # noqa: E402

TEXT = "Turn left in two hundred meters, then keep right at the fork."
MAX_TOKENS = 40  # per sentence: the random-weight model would otherwise speak to the cap


@pytest.fixture(scope="module")
def srv(tiny_model_dir, tmp_path_factory):
    missing = browser_missing()
    if missing:
        pytest.skip(f"no browser to drive: {missing}")
    with http_server(tmp_path_factory.mktemp("playground"), max_streams=2) as server:
        yield server


@pytest.mark.parametrize("route", ["ws", "post"])
def test_playground_streams_plays_and_draws_the_timeline(srv, route):
    run = run_playground(http_url(srv) + "/", TEXT, route=route, token=TOKEN, max_tokens=MAX_TOKENS)
    state = run.state
    assert state["error"] is None, (state["error"], run.browser_log)
    assert state["chunks"] and state["firstAudioMs"] is not None
    if route == "ws":
        # The first audio came before the last chunk: it played while it streamed. (Over POST
        # a fast tiny model's whole body may arrive in one read of a loaded browser.)
        assert state["firstAudioMs"] < state["chunks"][-1]["atMs"]
        assert state["chunks"][0]["playStartMs"] < state["chunks"][-1]["atMs"]
    # The AudioContext got every sample that arrived (how many the random-weight model speaks
    # before its end code varies)...
    assert state["samplesScheduled"] == sum(c["samples"] for c in state["chunks"]) > 0
    assert state["peak"] > 0  # ...and its output carried them (the analyser saw them)
    if route == "ws":
        assert len(state["textSent"]) == len(TEXT.split())  # word by word
        assert state["utteranceEnds"]
    assert run.timeline_pixels > 500 and "first audio:" in run.stats_text
    wait_until(lambda: engine_idle(srv), 10, "the server to be idle")
