"""WS /v1/audio/speech/stream with the `websockets` client: StreamingSynthesize over a WebSocket,
through the same text reader (release policy, markdown, barge-in) as gRPC."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager, suppress

import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect

from httputil import (
    TOKEN,
    fixed,
    http_server,
    samples_for,
    stalled_total,
    streams_total,
    wait_freed_by_the_call,
    wait_idle,
    ws_stream_url,
)

N = 24


@pytest.fixture(scope="module")
def srv(tiny_model_dir, tmp_path_factory):
    with http_server(tmp_path_factory.mktemp("ws"), max_streams=2, max_queue=0) as server:
        yield server


@pytest.fixture
def ws_url(srv):
    yield ws_stream_url(srv)
    wait_idle(srv, "the server to be idle after the test")


@contextmanager
def _open(url: str, **config: object) -> Iterator[ClientConnection]:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    with connect(url, additional_headers=headers, open_timeout=10) as ws:
        ws.send(json.dumps({"type": "config", "voice": "alloy", **config}))
        yield ws


def _events(ws: ClientConnection, timeout_s: float = 60) -> list[bytes | dict]:
    """Everything until the server closes the socket: audio bytes and JSON events, in order."""
    out: list[bytes | dict] = []
    try:
        while True:
            message = ws.recv(timeout=timeout_s)
            out.append(message if isinstance(message, bytes) else json.loads(message))
    except ConnectionClosed:
        return out


def _json(events: list[bytes | dict], kind: str) -> list[dict]:
    return [e for e in events if isinstance(e, dict) and e["type"] == kind]


def test_fragments_stream_in_and_audio_streams_out(ws_url):
    with _open(ws_url, sampling=fixed(N)["sampling"]) as ws:
        ws.send(json.dumps({"type": "text", "text": "Hello there", "flush": False}))
        ws.send(json.dumps({"type": "text", "text": ", this is streamed.", "flush": True}))
        first = ws.recv(timeout=30)
        # Audio of the first sentence while the client has more to say.
        assert isinstance(first, bytes) and first
        for word in ["And", "so", "is", "this", "one"]:
            ws.send(json.dumps({"type": "text", "text": word + " "}))
        ws.send(json.dumps({"type": "end"}))
        events = [first, *_events(ws)]
        assert ws.close_code == 1000
    # The release policy of gRPC: the first utterance at its first clause, then at the flush,
    # then the rest at the end.
    ends = _json(events, "utterance_end")
    assert [e["text"] for e in ends] == ["Hello there,", "this is streamed.", "And so is this one"]
    assert [e["utterance_index"] for e in ends] == [0, 1, 2]
    audio = b"".join(e for e in events if isinstance(e, bytes))
    assert len(audio) == 2 * 3 * samples_for(N)  # LINEAR16 at 24 kHz
    (done,) = _json(events, "done")
    assert done["num_utterances"] == 3 and done["num_tokens"] == 3 * N
    assert done["audio_duration_s"] == pytest.approx(3 * samples_for(N) / 24000)


def test_barge_in_clears_and_speaks_what_follows(ws_url):
    with _open(ws_url, sampling={"min_new_tokens": 120, "max_new_tokens": 120}) as ws:
        ws.send(json.dumps({"type": "text", "text": "A long first sentence.", "flush": True}))
        assert isinstance(ws.recv(timeout=30), bytes)
        ws.send(json.dumps({"type": "text", "text": "Rerouting now.", "clear": True}))
        ws.send(json.dumps({"type": "end"}))
        events = _events(ws)
    ends = _json(events, "utterance_end")
    assert [e["finish_reason"] for e in ends] == ["cleared", "max_tokens"]
    assert ends[0]["num_tokens"] < 120 and "Rerouting" in ends[1]["text"]


def test_markdown_is_read_by_the_same_text_reader(ws_url):
    with _open(ws_url, sampling=fixed(N)["sampling"], audio_format="wav") as ws:
        for token in ["**Turn", " left**", " at the [station](https://example.com/x)", ".\n"]:
            ws.send(json.dumps({"type": "text", "text": token}))
        ws.send(json.dumps({"type": "end"}))
        events = _events(ws)
    ends = _json(events, "utterance_end")
    spoken = " ".join(e["text"] for e in ends)
    assert "*" not in spoken and "](" not in spoken and "http" not in spoken
    assert "Turn left" in spoken and "station" in spoken
    audio = b"".join(e for e in events if isinstance(e, bytes))
    assert audio[:4] == b"RIFF" and len(audio) == 44 + 2 * len(ends) * samples_for(N)


@pytest.mark.parametrize(
    "messages, param",
    [
        ([{"type": "text", "text": "Hi."}], "config"),
        ([{"type": "config", "sampling": {"top_p": 2}}], "config.sampling.top_p"),
        ([{"type": "config", "voice": "nobody"}], "config.voice"),
        ([{"type": "config", "audio_format": "ogg"}], "config.audio_format"),
        ([{"type": "config"}, {"type": "config"}], "config"),
        ([{"type": "config"}, {"type": "shout", "text": "Hi."}], "type"),
        ([{"type": "config"}, {"type": "text", "text": "[Ptts] hi."}], "text.text"),
    ],
    ids=["text-first", "bad-top-p", "unknown-voice", "bad-format", "second-config",
         "unknown-type", "structural-token"],
)  # fmt: skip
def test_bad_messages_end_with_an_error_naming_the_field(ws_url, messages, param):
    with connect(ws_url, additional_headers={"Authorization": f"Bearer {TOKEN}"}) as ws:
        for message in messages:
            ws.send(json.dumps(message))
        events = _events(ws, 30)
        assert ws.close_code == 1007
    (error,) = _json(events, "error")
    assert error["error"]["param"] == param and error["error"]["type"] == "invalid_request_error"


def test_tokens_are_those_of_grpc(ws_url):
    with connect(ws_url) as ws:
        events = _events(ws, 30)
        assert ws.close_code == 1008
    assert _json(events, "error")[0]["error"]["code"] == "invalid_api_key"
    # Browsers cannot set headers on a WebSocket: ?api_key= is accepted instead.
    with connect(ws_url + f"?api_key={TOKEN}") as ws:
        ws.send(json.dumps({"type": "config", "sampling": fixed(4)["sampling"]}))
        ws.send(json.dumps({"type": "text", "text": "Hi there.", "flush": True}))
        ws.send(json.dumps({"type": "end"}))
        assert _json(_events(ws), "done")


def test_full_server_is_an_error_to_retry(ws_url, srv):
    long = {"min_new_tokens": 300, "max_new_tokens": 300}
    with ExitStack() as stack:
        for _ in range(2):  # the server's two places
            ws = stack.enter_context(_open(ws_url, sampling=long))
            ws.send(json.dumps({"type": "text", "text": "Hold the place.", "flush": True}))
            assert isinstance(ws.recv(timeout=30), bytes)
        with _open(ws_url) as third:
            # The server refuses at the config: its close may come before this text goes out.
            with suppress(ConnectionClosed):
                third.send(json.dumps({"type": "text", "text": "Me too.", "flush": True}))
            events = _events(third, 30)
            assert third.close_code == 1013  # try again later
        assert _json(events, "error")[0]["error"]["code"] == "server_full"


def test_disconnect_cancels_generation(ws_url, srv):
    before = streams_total(srv, "HTTPSpeechStream", "CANCELLED")
    stalled_before = stalled_total(srv)
    with _open(ws_url, sampling={"min_new_tokens": 300, "max_new_tokens": 300}) as ws:
        ws.send(json.dumps({"type": "text", "text": "Talk for a long while.", "flush": True}))
        ws.send(json.dumps({"type": "end"}))  # nothing more to read: the server still notices
        assert isinstance(ws.recv(timeout=30), bytes)
        assert srv.server.engine.stats().active_requests == 1
    # closed: the client went away mid-utterance
    wait_freed_by_the_call(srv, stalled_before, "the closed socket's slot to be freed")
    assert streams_total(srv, "HTTPSpeechStream", "CANCELLED") == before + 1
