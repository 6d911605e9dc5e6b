"""The playground page in a real headless Chromium (Debian's, driven by Selenium): it loads,
streams a sentence word by word over the WebSocket, plays it (the AudioContext receives and
outputs samples), draws the timeline and highlights each word of the text while it plays. The screenshot for bench/results comes from
tools/playground_check.py, not from here."""

from __future__ import annotations

import sys

import pytest

from chattts_devtools.tcp_relay import TcpRelay
from httputil import TOKEN, http_server, http_url, wait_idle
from serverutil import REPO

sys.path.insert(0, str(REPO / "tools"))
from _playground import browser_missing, run_playground  # noqa: E402

TEXT = "Turn left in two hundred meters, then keep right at the fork."
MAX_TOKENS = 40  # per sentence: the random-weight model would otherwise speak to the cap
SAMPLE_RATE_HZ = 24000  # the page's PCM
# Exactly this many audio tokens a sentence (about 2.5 s) when words are highlighted: the
# random-weight model, left to end where it likes, may say six words in half a second.
HIGHLIGHT_TOKENS = 120


@pytest.fixture(scope="module")
def srv(tiny_model_dir, tmp_path_factory):
    missing = browser_missing()
    if missing:
        pytest.skip(f"no browser to drive: {missing}")
    # A long resume window: a loaded machine may be slow to reconnect, not wrong.
    limits = {"resume_window_s": 600.0}
    with http_server(tmp_path_factory.mktemp("playground"), max_streams=2, limits=limits) as server:
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
    wait_idle(srv, "the server to be idle")


def _plays_at_ms(chunks: list[dict], position_s: float) -> float:
    """The page-clock time at which the stream's audio reaches `position_s`, from where the page
    scheduled each chunk's samples (worked out here, apart from the page's own mapping)."""
    sample = position_s * SAMPLE_RATE_HZ
    played = [c for c in chunks if "firstSample" in c]  # a whole-file format: the last one
    for chunk in played:
        first, n = chunk["firstSample"], chunk["playedSamples"]
        if first <= sample < first + n:
            return chunk["playStartMs"] + (sample - first) * 1000 / SAMPLE_RATE_HZ
    return played[-1]["playEndMs"]


# WebSocket PCM plays as it arrives; POST's FLAC (with SSE) plays once whole, so every word's
# timing is known before its audio starts.
@pytest.mark.parametrize("route, response_format", [("ws", "pcm"), ("post", "flac")])
def test_playground_highlights_each_word_in_order_as_it_plays(srv, route, response_format):
    """Word timings (WebSocket messages, or POST's SSE events), on the audio clock: the
    highlighted word only moves forward, each while its own audio plays, and it is the caller's
    text of that word."""
    run = run_playground(
        http_url(srv) + "/",
        TEXT,
        route=route,
        stream_format="sse",
        response_format=response_format,
        token=TOKEN,
        max_tokens=HIGHLIGHT_TOKENS,
        min_tokens=HIGHLIGHT_TOKENS,
        until_played_out=True,
    )
    state, chunks = run.state, run.state["chunks"]
    assert state["error"] is None, (state["error"], run.browser_log)
    assert run.spoken_text == TEXT  # the text sent, shown whole
    words = state["words"]
    assert words and state["wordTimingSource"] == "estimate"  # the dev model's source
    highlights = state["highlights"]
    indices = [h["index"] for h in highlights]
    assert indices == sorted(set(indices)), indices  # in order, never back, never twice
    for h in highlights:
        word = words[h["index"]]
        assert h["shown"] == word["sourceText"] and word["sourceText"] in TEXT
        assert word["startS"] <= h["positionS"] < word["endS"]
        # Not before its audio plays. How late is the audio clock's word (positionS, above), not
        # the page clock: a loaded browser's timers fire late, its audio position does not lie.
        start_ms = _plays_at_ms(chunks, word["startS"])
        assert start_ms - 50 <= h["atMs"], (h, word, start_ms)
    # A word can be highlighted once its timing is known, while its audio plays. The estimate
    # comes with an utterance's end: on a machine that generates slower than real time, most
    # of a streamed utterance has played by then. The page polls every 15 ms.
    chances = [
        k
        for k, w in enumerate(words)
        if _plays_at_ms(chunks, w["endS"]) - max(w["arrivedMs"], _plays_at_ms(chunks, w["startS"]))
        >= 100
    ]
    if route == "post":  # the whole file plays once complete: every timing came before it
        assert all(w["arrivedMs"] <= _plays_at_ms(chunks, w["startS"]) for w in words), words
    assert chances, ("no word was timed while it played", words, chunks)
    assert len(set(chances) & set(indices)) >= max(1, len(chances) // 2), (chances, indices)
    wait_idle(srv, "the server to be idle")


def test_the_playground_resumes_a_dropped_websocket_by_itself(srv):
    """The page's WebSocket goes through a real TCP relay that is cut mid-audio (an RST each
    way, as a network blip does), twice: the page resumes by itself, and plays every sample the
    server sent once (no gap, nothing twice: the count is the server's own)."""
    cut_at = [2, 6]  # chunks received

    with TcpRelay(srv.server.http_port) as relay:

        def blip(state: dict) -> None:
            if cut_at and len(state["chunks"]) >= cut_at[0]:
                cut_at.pop(0)
                relay.cut()

        run = run_playground(
            f"http://127.0.0.1:{relay.port}/",
            TEXT,
            token=TOKEN,
            max_tokens=HIGHLIGHT_TOKENS,
            min_tokens=HIGHLIGHT_TOKENS,
            while_running=blip,
        )
        cuts = relay.cuts
    state = run.state
    assert state["error"] is None, (state["error"], run.browser_log)
    assert cuts >= 1 and len(state["resumes"]) == cuts, (cuts, state["resumes"])
    assert state["samplesScheduled"] == round(state["audioDurationS"] * SAMPLE_RATE_HZ) > 0
    assert state["utteranceEnds"]
    wait_idle(srv, "the server to be idle")


@pytest.mark.parametrize("cut_at", [[], [2, 5]], ids=["uncut", "cut-twice"])
def test_two_voices_take_turns_on_one_socket(srv, cut_at):
    """The contexts route: each sentence a context of its own on one WebSocket, the two voices
    in turn; the page plays each turn's audio after the turn before it, all of it once. Cut
    twice mid-audio (a relay's RST each way), the page resumes every open turn by itself on a
    new socket, and still plays every sample once."""
    text = "Turn left at the light. Then keep right at the fork. You have arrived."
    with TcpRelay(srv.server.http_port) as relay:

        def blip(state: dict) -> None:
            if cut_at and len(state["chunks"]) >= cut_at[0]:
                cut_at.pop(0)
                relay.cut()

        run = run_playground(f"http://127.0.0.1:{relay.port}/", text, route="contexts",
                             token=TOKEN, max_tokens=MAX_TOKENS, min_tokens=MAX_TOKENS,
                             while_running=blip)  # fmt: skip
        cuts = relay.cuts
    state = run.state
    assert state["error"] is None, (state["error"], run.browser_log)
    # A cut also resets the page's idle HTTP connection: `cuts` counts it even when the
    # WebSocket was between sockets, so each new socket is one resume.
    resumes = len(state["resumes"])
    assert state["sockets"] == 1 + resumes and (resumes >= 1) == bool(cuts), (cuts, state)
    turns = state["turns"]
    voices = [t["voice"] for t in turns]
    assert len(turns) == 3 and voices[0] == voices[2] != voices[1], voices
    for turn in turns:
        assert turn["reason"] == "closed" and turn["samples"] > 0, turn
        assert turn["samples"] == round(turn["audioDurationS"] * SAMPLE_RATE_HZ), turn
    assert state["samplesScheduled"] == sum(t["samples"] for t in turns)
    played = [c["turn"] for c in state["chunks"]]
    assert played == sorted(played) and set(played) == {0, 1, 2}, played  # turn after turn
    wait_idle(srv, "the server to be idle")
