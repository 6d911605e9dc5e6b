"""Resumable contexts on one WebSocket (api/http/ws_contexts.py), with the `websockets` client
through a real TCP relay cut mid-audio: each context is resumed on a new socket from the samples
its listener has, its PCM joined over the cuts equal to an uncut run's and every message of it
once; a refused resume is an error naming its context, and the socket goes on."""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import struct
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect

from chattts_client.ws_contexts import ContextAudio, ContextSocket
from chattts_devtools.tcp_relay import TcpRelay
from httputil import TOKEN, http_server, wait_idle

WAIT_S = 120  # a generous bound on one message: a loaded machine is slow, not wrong
PIECES = ["Turn left onto Main Street, ", "then keep right at the fork. ", "Take the exit."]
_TIMINGS = ("time_to_first_audio_s", "generation_time_s", "lag_s")


@pytest.fixture(scope="module")
def srv(tiny_model_dir, tmp_path_factory):
    # Its own server (audio is compared with an uncut run's: no other test's streams in its
    # batches), a long window (a loaded machine is slow between a park and a resume).
    folder = tmp_path_factory.mktemp("ws-context-resume")
    limits = {"resume_window_s": 600.0, "ws_context_idle_s": 600.0}
    with http_server(folder, max_streams=2, max_queue=2, limits=limits) as server:
        yield server


@pytest.fixture
def port(srv) -> Iterator[int]:
    yield srv.server.http_port
    wait_idle(srv, "the server to be idle after the test")


@contextmanager
def _socket(port: int) -> Iterator[ClientConnection]:
    url = f"ws://127.0.0.1:{port}/v1/audio/speech/stream"
    headers = {"Authorization": f"Bearer {TOKEN}"}
    with connect(url, additional_headers=headers, open_timeout=30) as ws:
        yield ws


def _config(context_id: str, n: int, resumable: bool) -> dict:
    sampling = {"seed": 11 + n, "max_new_tokens": 50, "min_new_tokens": 40}
    return {"type": "config", "context_id": context_id, "voice": f"seed:{n + 1}",
            "audio_format": "pcm", "sampling": sampling, "resumable": resumable}  # fmt: skip


def _texts(context_id: str) -> list[dict]:
    """Its text, numbered, a mark after each piece; then its close."""
    texts = [
        {
            "type": "text",
            "context_id": context_id,
            "text": f"{context_id}: {text}",
            "mark": f"m{seq}",
            "seq": seq,
        }  # fmt: skip
        for seq, text in enumerate(PIECES, start=1)
    ]
    return [*texts, {"type": "close_context", "context_id": context_id}]


class Listener:
    """Per context: the samples it has, its messages, those since its last audio, and its
    `stream` message."""

    def __init__(self) -> None:
        self.pcm: dict[str, bytearray] = defaultdict(bytearray)
        self.messages: dict[str, list[dict]] = defaultdict(list)
        self.since_audio: dict[str, int] = defaultdict(int)
        self.stream: dict[str, dict] = {}
        self.closed: dict[str, dict] = {}
        self.errors: list[dict] = []

    def take(self, frame: bytes | str) -> None:
        if isinstance(frame, bytes):
            header, n = struct.unpack_from("<HB", frame)
            cid = frame[3 : 3 + n].decode()
            self.pcm[cid] += frame[header:]
            self.since_audio[cid] = 0
            return
        event = json.loads(frame)
        cid = event.get("context_id")
        if event["type"] == "error":
            self.errors.append(event)
        elif event["type"] in ("stream", "resumed"):
            self.stream.setdefault(cid, event)
        elif event["type"] == "context_closed":
            self.closed[cid] = event
        else:
            self.since_audio[cid] += 1
            for name in _TIMINGS:
                event.pop(name, None)
            self.messages[cid].append(event)

    def resume(self, cid: str) -> dict:
        stream = self.stream[cid]
        return {"type": "resume", "context_id": cid, "stream_id": stream["stream_id"],
                "resume_token": stream["resume_token"], "sample_offset": len(self.pcm[cid]) // 2,
                "events_received": self.since_audio[cid]}  # fmt: skip


def _run(port: int, ids: list[str], resumable: bool, cuts: int, seed: int = 3) -> Listener:
    """Each context's text on one socket (through a relay cut `cuts` times mid-audio, each
    cut followed by a socket that resumes every context not closed), until all have closed."""
    rng, listener, made = random.Random(seed), Listener(), 0
    with TcpRelay(port) as relay:
        while len(listener.closed) < len(ids):
            with _socket(relay.port) as ws:
                ws.send(json.dumps({"type": "config", "contexts": True, "audio_format": "pcm"}))
                for n, cid in enumerate(ids):
                    if cid in listener.closed:
                        continue
                    first = listener.resume(cid) if cid in listener.stream else None
                    ws.send(json.dumps(first or _config(cid, n, resumable)))
                    with contextlib.suppress(ConnectionClosed):  # all sent again: each seq once
                        for message in _texts(cid):
                            ws.send(json.dumps(message))
                with contextlib.suppress(ConnectionClosed):
                    ws.send(json.dumps({"type": "end"}))
                cut_after = rng.randint(2, 6)
                try:
                    for n in range(100_000):
                        listener.take(ws.recv(timeout=WAIT_S))
                        if n == cut_after and made < cuts:
                            relay.cut()
                            made += 1
                except ConnectionClosed:
                    pass
    assert made == cuts and not listener.errors, listener.errors
    return listener


def test_a_cut_context_resumes_on_a_new_socket_and_hears_every_sample_once(port) -> None:
    want = _run(port, ["nav"], resumable=False, cuts=0)
    got = _run(port, ["nav"], resumable=True, cuts=3)
    assert len(want.pcm["nav"]) > 2 * 24000, "the uncut run spoke too little to cut it"
    assert bytes(got.pcm["nav"]) == bytes(want.pcm["nav"])
    assert got.messages["nav"] == want.messages["nav"]
    assert got.closed["nav"]["reason"] == "closed"


def test_two_contexts_cut_together_each_resume_with_their_own_timeline(port) -> None:
    got = _run(port, ["left", "right"], resumable=True, cuts=3, seed=5)
    for cid in ("left", "right"):
        samples = len(got.pcm[cid]) // 2
        assert samples == round(got.closed[cid]["audio_duration_s"] * 24000) > 0
        ends = [m for m in got.messages[cid] if m["type"] == "utterance_end"]
        assert [e["sample_offset"] for e in ends] == [
            sum(e["num_samples"] for e in ends[:i]) for i in range(len(ends))
        ]
        assert sum(e["num_samples"] for e in ends) == samples
        marks = [m["name"] for m in got.messages[cid] if m["type"] == "mark"]
        assert marks == ["m1", "m2", "m3"], (cid, marks)


def test_a_refused_resume_names_its_context_and_the_socket_goes_on(port) -> None:
    with _socket(port) as ws:
        ws.send(json.dumps({"type": "config", "contexts": True, "audio_format": "pcm"}))
        ws.send(json.dumps({"type": "resume", "context_id": "old", "stream_id": "x-" + "0" * 24,
                            "resume_token": "0" * 32}))  # fmt: skip
        ws.send(json.dumps(_config("new", 0, resumable=True)))
        for message in _texts("new"):
            ws.send(json.dumps(message))
        ws.send(json.dumps({"type": "end"}))
        listener = Listener()
        with contextlib.suppress(ConnectionClosed):
            while True:
                listener.take(ws.recv(timeout=WAIT_S))
    (error,) = listener.errors
    assert error["context_id"] == "old" and error["error"]["code"] == "not_found"
    assert (
        listener.stream["new"]["type"] == "stream" and listener.closed["new"]["reason"] == "closed"
    )
    assert len(listener.pcm["new"]) > 0


def test_the_client_library_resumes_its_contexts_by_itself(port) -> None:
    """chattts_client.ws_contexts with `resumable=True`, through a relay cut twice mid-audio:
    the context's iteration sees `resumed` twice and otherwise exactly an uncut run's events."""

    async def run(url: str, resumable: bool, relay: TcpRelay | None) -> list:
        events: list = []
        ws = await ContextSocket.connect(url, api_key=TOKEN, resumable=resumable)
        async with ws:
            config = _config("nav", 0, resumable)
            turn = await ws.open(
                "nav", **{k: v for k, v in config.items() if k not in ("type", "context_id")}
            )
            for message in _texts("nav")[:-1]:
                await turn.send(message["text"], mark=message["mark"])
            await turn.close()
            async for event in turn:
                events.append(event)
                audio = [e for e in events if isinstance(e, ContextAudio)]
                if relay is not None and len(audio) in (3, 9) and isinstance(event, ContextAudio):
                    relay.cut()
        return events

    def heard(events: list) -> tuple[bytes, list]:
        pcm = b"".join(e.audio for e in events if isinstance(e, ContextAudio))
        messages = [
            {k: v for k, v in e.items() if k not in _TIMINGS}
            for e in events
            if isinstance(e, dict) and e["type"] not in ("stream", "resumed")
        ]
        return pcm, messages

    url = f"ws://127.0.0.1:{port}/v1/audio/speech/stream"
    want = asyncio.run(run(url, False, None))
    with TcpRelay(port) as relay:
        got = asyncio.run(run(f"ws://127.0.0.1:{relay.port}/v1/audio/speech/stream", True, relay))
    assert [e["type"] for e in got if isinstance(e, dict) and e["type"] == "resumed"] == [
        "resumed"
    ] * 2
    assert heard(got) == heard(want)


def test_a_context_closed_now_across_a_cut_ends_closed(port) -> None:
    """Barge-in as the socket drops (the close is sent while the socket is down): the stopped
    context is resumed with its close sent again and ends `immediate`; the other context
    resumes and finishes."""

    async def run(relay: TcpRelay) -> tuple[dict | None, dict | None]:
        url = f"ws://127.0.0.1:{relay.port}/v1/audio/speech/stream"
        async with await ContextSocket.connect(url, api_key=TOKEN, resumable=True) as ws:
            config = {
                k: v for k, v in _config("x", 0, True).items() if k not in ("type", "context_id")
            }
            stopped, other = await ws.open("stopped", **config), await ws.open("other", **config)
            for context in (stopped, other):
                await context.send("A long answer that goes on and on. " * 3)
            async for event in stopped:
                if isinstance(event, ContextAudio):
                    break
            relay.cut()
            await stopped.close(immediate=True)
            await other.close()
            rest = [e async for e in stopped]
            async for _ in other:
                pass
            assert rest[-1] is stopped.closed
            return stopped.closed, other.closed

    with TcpRelay(port) as relay:
        stopped, other = asyncio.run(run(relay))
    assert stopped is not None and stopped["reason"] == "immediate"
    assert other is not None and other["reason"] == "closed"
