"""Contexts on one WebSocket (api/http/ws_contexts.py), with the `websockets` client: several
streams with their own voices and timelines on one socket, closed one by one or at once
(barge-in), each context's errors its own."""

from __future__ import annotations

import json
import struct
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect

from httputil import TOKEN, fixed, http_server, wait_idle, ws_stream_url

RATE = 24000
WAIT_S = 120  # a generous bound on one message: a loaded machine is slow, not wrong


@pytest.fixture
def url(contexts_url: str) -> str:
    return contexts_url


@contextmanager
def _socket(url: str, **config: object) -> Iterator[ClientConnection]:
    """A context socket: its config says so, PCM, fixed-length sentences."""
    headers = {"Authorization": f"Bearer {TOKEN}"}
    with connect(url, additional_headers=headers, open_timeout=30) as ws:
        first = {"type": "config", "contexts": True, "audio_format": "pcm", **fixed(24)}
        ws.send(json.dumps({**first, **config}))
        yield ws


def _send(ws: ClientConnection, context_id: object, kind: str, **fields: object) -> None:
    ws.send(json.dumps({"type": kind, "context_id": context_id, **fields}))


@dataclass
class Heard:
    """Each context's audio (samples) and messages, in order, and the socket's own errors."""

    samples: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    messages: dict[str, list[tuple[int, dict]]] = field(default_factory=lambda: defaultdict(list))
    errors: list[dict] = field(default_factory=list)
    close_code: int | None = None

    def take(self, frame: bytes | str) -> None:
        if isinstance(frame, bytes):
            header, id_length = struct.unpack_from("<HB", frame)
            assert header % 4 == 0 and header >= 3 + id_length
            context_id = frame[3 : 3 + id_length].decode()
            assert not any(frame[3 + id_length : header]), "the padding is zeros"
            self.samples[context_id] += (len(frame) - header) // 2
            return
        message = json.loads(frame)
        if message["type"] == "error":
            self.errors.append(message)
        if message.get("context_id") is not None:
            cid = message["context_id"]
            self.messages[cid].append((self.samples[cid], message))

    def kinds(self, context_id: str) -> list[str]:
        return [m["type"] for _, m in self.messages[context_id]]

    def closed(self, context_id: str) -> dict:
        ((_, last),) = [
            (n, m) for n, m in self.messages[context_id] if m["type"] == "context_closed"
        ]
        return last


def _read(ws: ClientConnection, until=lambda heard: False) -> Heard:  # type: ignore[no-untyped-def]
    heard = Heard()
    try:
        while not until(heard):
            heard.take(ws.recv(timeout=WAIT_S))
    except ConnectionClosed as exc:
        heard.close_code = exc.rcvd.code if exc.rcvd else None
    return heard


def _assert_own_timeline(heard: Heard, context_id: str) -> None:
    """A context's sample offsets count its own audio only: its utterances tile it, each mark
    sits at the audio received before it, its words lie inside it, and its close says so."""
    total = heard.samples[context_id]
    assert total > 0, context_id
    ends = [m for _, m in heard.messages[context_id] if m["type"] == "utterance_end"]
    offset = 0
    for end in ends:
        assert end["sample_offset"] == offset, (context_id, end)
        offset += end["num_samples"]
    assert offset == total, (context_id, offset, total)
    for before, message in heard.messages[context_id]:
        if message["type"] == "mark":
            assert message["sample_offset"] == before, (context_id, message, before)
        if message["type"] == "word_timings":
            assert all(0 <= w["start_sample"] <= w["end_sample"] <= total for w in message["words"])
    closed = heard.closed(context_id)
    assert round(closed["audio_duration_s"] * RATE) == total, (closed, total)


def test_three_contexts_with_three_voices_interleaved_keep_their_own_timelines(url) -> None:
    with _socket(url, word_timing=True) as ws:
        for n, context_id in enumerate("abc"):
            _send(ws, context_id, "config", voice=f"seed:{n + 1}", audio_format="pcm",
                  sampling=fixed(24, seed=n)["sampling"], word_timing=True)  # fmt: skip
        for piece in ("Turn left here. ", "Then keep right. "):
            for context_id in "abc":
                _send(ws, context_id, "text", text=f"{context_id}: {piece}", mark=piece[:4])
        for context_id in "abc":
            _send(ws, context_id, "close_context")
        ws.send(json.dumps({"type": "end"}))
        heard = _read(ws)
    assert heard.close_code == 1000 and not heard.errors, heard.errors
    for context_id in "abc":
        _assert_own_timeline(heard, context_id)
        assert heard.closed(context_id)["reason"] == "closed"
        assert heard.kinds(context_id).count("mark") == 2
        assert heard.kinds(context_id)[-1] == "context_closed"


def test_closing_one_context_now_leaves_the_other_speaking(url) -> None:
    with _socket(url) as ws:
        long = " ".join(["Keep straight on for a while."] * 4)
        _send(ws, "a", "text", text=long, flush=True)
        _send(ws, "b", "text", text=long, flush=True)
        heard = _read(ws, until=lambda h: h.samples["a"] > 0 and h.samples["b"] > 0)
        _send(ws, "a", "close_context", immediate=True)
        _send(ws, "b", "close_context")
        ws.send(json.dumps({"type": "end"}))
        rest = _read(ws)
    assert rest.close_code == 1000 and not rest.errors
    assert rest.closed("a")["reason"] == "immediate"
    closed_b = rest.closed("b")
    assert closed_b["reason"] == "closed" and closed_b["num_utterances"] == 4
    assert heard.samples["b"] + rest.samples["b"] == round(closed_b["audio_duration_s"] * RATE)


def test_barge_in_closes_a_context_now_and_the_next_one_speaks(url) -> None:
    with _socket(url) as ws:
        _send(ws, "turn-1", "text", text="A long answer that goes on. " * 4, flush=True)
        _read(ws, until=lambda h: h.samples["turn-1"] > 0)
        _send(ws, "turn-1", "close_context", immediate=True)
        opened = time.monotonic()
        _send(ws, "turn-2", "text", text="Sure, go ahead.", flush=True)
        _send(ws, "turn-2", "close_context")
        heard = _read(ws, until=lambda h: "context_closed" in h.kinds("turn-2"))
        ws.send(json.dumps({"type": "end"}))
        _read(ws)
    assert heard.closed("turn-1")["reason"] == "immediate"
    assert heard.samples["turn-2"] > 0 and heard.closed("turn-2")["reason"] == "closed"
    print(f"turn-2 closed {time.monotonic() - opened:.2f} s after it was opened")


def _errors_for(heard: Heard, context_id: object) -> list[dict]:
    return [e for e in heard.errors if e["context_id"] == context_id]


def test_errors_name_their_context_and_the_others_go_on(url) -> None:
    with _socket(url) as ws:
        _send(ws, "a", "text", text="Still here.")
        _send(ws, "bad", "config", voice="no-such-voice")
        _send(ws, "zz", "flush")  # never opened
        _send(ws, "a", "close_context", immediate="yes")
        for context_id in ("b", "c", "d"):  # d is one over --ws-max-contexts
            _send(ws, context_id, "text", text="Hello.")
        for context_id in ("a", "b", "c"):
            _send(ws, context_id, "close_context")
        ws.send(json.dumps({"type": "end"}))
        heard = _read(ws)
    assert heard.close_code == 1000
    assert _errors_for(heard, "bad")[0]["error"]["param"] == "config.voice"
    assert "no context 'zz' is open" in _errors_for(heard, "zz")[0]["error"]["message"]
    assert _errors_for(heard, "a")[0]["error"]["param"] == "immediate"
    assert _errors_for(heard, "d")[0]["error"]["code"] == "server_full"
    for context_id in ("a", "b", "c"):
        assert heard.closed(context_id)["reason"] == "closed" and heard.samples[context_id] > 0
    assert heard.samples.get("d", 0) == heard.samples.get("bad", 0) == 0


@pytest.mark.parametrize(
    "context_id, says",
    [
        ("x" * 65, "over 64 bytes"),
        ("é" * 33, "over 64 bytes"),
        ("", "non-empty string"),
        (5, "non-empty string"),
        (None, "non-empty string"),
        ({"id": "a"}, "non-empty string"),
        ("tab\there", "printable"),
    ],
)
def test_hostile_context_ids_are_refused_and_the_socket_goes_on(url, context_id, says) -> None:
    with _socket(url) as ws:
        _send(ws, context_id, "text", text="Nothing.")
        _send(ws, "ok", "text", text="Fine.")
        _send(ws, "ok", "close_context")
        ws.send(json.dumps({"type": "end"}))
        heard = _read(ws)
    (error,) = heard.errors
    assert error["context_id"] is None and error["error"]["param"] == "context_id"
    assert says in error["error"]["message"]
    assert heard.closed("ok")["reason"] == "closed"


def test_a_context_id_is_reused_once_its_context_has_closed(url) -> None:
    with _socket(url) as ws:
        _send(ws, "turn", "text", text="First.")
        _send(ws, "turn", "close_context")
        first = _read(ws, until=lambda h: "context_closed" in h.kinds("turn"))
        _send(ws, "turn", "config", voice="seed:9", audio_format="pcm")
        _send(ws, "turn", "text", text="Second.")
        _send(ws, "turn", "close_context")
        ws.send(json.dumps({"type": "end"}))
        second = _read(ws)
    assert not first.errors and not second.errors
    assert first.samples["turn"] > 0 and second.samples["turn"] > 0
    assert second.closed("turn")["reason"] == "closed"


def test_a_socket_may_open_with_a_context_message(url) -> None:
    """No socket config: the first message names a context, on the server's defaults."""
    headers = {"Authorization": f"Bearer {TOKEN}"}
    with connect(url, additional_headers=headers, open_timeout=30) as ws:
        _send(ws, "a", "config", audio_format="pcm", sampling=fixed(24)["sampling"])
        _send(ws, "a", "text", text="Hello there.")
        _send(ws, "a", "close_context")
        ws.send(json.dumps({"type": "end"}))
        heard = _read(ws)
    assert heard.close_code == 1000 and not heard.errors
    _assert_own_timeline(heard, "a")


def test_an_idle_context_finishes_what_was_sent_and_closes(tiny_model_dir, tmp_path) -> None:
    limits = {"ws_context_idle_s": 1.0}
    with http_server(tmp_path, max_streams=2, limits=limits) as server:
        url = ws_stream_url(server)
        with _socket(url) as ws:
            _send(ws, "a", "text", text="Then nothing more.")
            heard = _read(ws, until=lambda h: "context_closed" in h.kinds("a"))
            ws.send(json.dumps({"type": "end"}))
            _read(ws)
        wait_idle(server, "the server to be idle")
    closed = heard.closed("a")
    assert closed["reason"] == "idle" and heard.samples["a"] > 0
    assert round(closed["audio_duration_s"] * RATE) == heard.samples["a"]


@pytest.mark.parametrize("resumable", [False, True])
def test_a_context_closed_now_with_its_config_still_says_it_closed(url, resumable) -> None:
    """Config, text and an immediate close sent at once (before the context's task has run):
    the context closes `immediate` with nothing spoken, and the socket ends as asked."""
    with _socket(url) as ws:
        _send(ws, "a", "config", audio_format="pcm", resumable=resumable)
        _send(ws, "a", "text", text="A sentence that will not be spoken.")
        _send(ws, "a", "close_context", immediate=True)
        ws.send(json.dumps({"type": "end"}))
        heard = _read(ws)
    assert heard.close_code == 1000 and not heard.errors, heard.errors
    assert heard.closed("a")["reason"] == "immediate"
    assert heard.kinds("a")[-1] == "context_closed" and heard.samples["a"] == 0
