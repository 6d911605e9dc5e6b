"""Stalled readers (issue 31): on a one-slot server with no queue, a client at any door that
stops reading frees the slot soon after the stall timeout (long before the stream would end), with the answer each
door documents (gRPC DEADLINE_EXCEEDED saying why, a cut HTTP body, WebSocket close 1008 with
the reason) and the stalled-streams metric counting it; a reader that keeps up with real time
is never cut, nor is a stream idle for want of text.

The clients are real (grpc stubs, a raw socket speaking HTTP/1.1, the `websockets` client),
each with a small receive window, so the server's writes wait soon after the client stops
reading: gRPC without BDP probing (the HTTP/2 window stays 64 KiB), the sockets with a 4 KiB
receive buffer.
"""

from __future__ import annotations

import asyncio
import json
import re
import socket
import threading
import time
from collections.abc import Iterator

import grpc
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from chattts_client import AsyncTTSClient, AudioChunkEvent, UtteranceEndEvent
from chattts_proto.chattts.v1 import tts_pb2, tts_pb2_grpc
from httputil import TOKEN, LogRecorder, engine_idle, http_server, wait_idle
from polling import wait_until

STALL_S = 2.0
RATE = 48000  # FLOAT32 at 48 kHz: 192 kB a second, so the windows fill at once
BYTES_PER_S = {"FLOAT32": 4 * RATE, "pcm": 2 * RATE}
MD = (("authorization", f"Bearer {TOKEN}"),)
LONG_TEXT = " ".join(f"Sentence number {n} goes on for a while." for n in range(6))
LONG = {"min_new_tokens": 380, "max_new_tokens": 380}  # 8 s of audio a sentence
REAL_TIME_TOKENS = 240  # 5.1 s of audio: over twice the stall timeout


@pytest.fixture(scope="module")
def srv(tiny_model_dir, tmp_path_factory):
    with http_server(
        tmp_path_factory.mktemp("stall"),
        max_streams=1,
        max_queue=0,
        limits={"stall_timeout_s": STALL_S},
    ) as server:
        yield server


@pytest.fixture
def log(srv):
    with LogRecorder() as recorder:
        yield recorder
        wait_idle(srv, "the server to be idle after the test")
    assert recorder.problems() == []


def _stalled(srv, method: str) -> float:
    value = srv.server.metrics.registry.get_sample_value(
        "chattts_stalled_streams_total", {"method": method}
    )
    return value or 0.0


FULL_AUDIO_S = 6 * LONG["max_new_tokens"] / 46.875
"""What LONG_TEXT's stream would speak if it ran to its end (48 s)."""
FREED_WAIT_S = 120
"""How long to wait for the slot (a bound on waiting, not a figure under test: how soon the slot
frees depends on how fast the server fills the transport's buffers, which a loaded machine
slows)."""


def _freed_by_the_stall(srv, log, method: str) -> None:
    """The one slot frees and the engine goes idle, and it was the stall that ended the stream:
    it spoke less than half of what it would have run to (a stream left to run would end with
    all of FULL_AUDIO_S spoken)."""
    wait_until(lambda: engine_idle(srv), FREED_WAIT_S, "the stalled stream's slot to be freed")
    ended = [
        r.getMessage() for r in log.records if r.getMessage().startswith(f"stream method={method} ")
    ]
    assert ended, log.lines()
    spoken = float(re.search(r"audio_s=(\d+\.\d+)", ended[-1]).group(1))  # type: ignore[union-attr]
    assert spoken < FULL_AUDIO_S / 2, ended[-1]


def _small_socket() -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connect: a small window
    return s


def _channel(srv) -> grpc.Channel:
    return grpc.insecure_channel(srv.target, options=[("grpc.http2.bdp_probe", 0)])


def _grpc_config(sampling: dict[str, int]) -> tts_pb2.SynthesisConfig:
    return tts_pb2.SynthesisConfig(
        audio_format=tts_pb2.AudioFormat(encoding=tts_pb2.FLOAT32, sample_rate_hz=RATE),
        sampling=tts_pb2.Sampling(seed=3, **sampling),
    )


def _short_synthesis_works(srv) -> None:
    """The slot is usable again: another stream is admitted and finishes."""
    with grpc.insecure_channel(srv.target) as channel:
        request = tts_pb2.SynthesizeRequest(
            text="Next please.", config=_grpc_config({"max_new_tokens": 8})
        )
        replies = list(
            tts_pb2_grpc.TextToSpeechStub(channel).Synthesize(request, timeout=30, metadata=MD)
        )
    assert replies[-1].HasField("utterance_end")


# -- a reader that stops ------------------------------------------------------------------------


def test_grpc_stalled_reader_is_cut_and_its_slot_freed(srv, log):
    before = _stalled(srv, "Synthesize")
    with _channel(srv) as channel:
        request = tts_pb2.SynthesizeRequest(text=LONG_TEXT, config=_grpc_config(LONG))
        call = tts_pb2_grpc.TextToSpeechStub(channel).Synthesize(request, timeout=60, metadata=MD)
        assert next(call).HasField("audio")
        # and reads nothing more
        _freed_by_the_stall(srv, log, "Synthesize")
        _short_synthesis_works(srv)
        with pytest.raises(grpc.RpcError) as info:
            for _ in call:  # reading again: what was sent, then the status that says why
                pass
    assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert "stalled: the client took no audio for 2 s" in (info.value.details() or "")
    assert _stalled(srv, "Synthesize") == before + 1
    assert any("status=DEADLINE_EXCEEDED" in line for line in log.lines())


def _post_head(body: bytes) -> bytes:
    return (
        "POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Authorization: Bearer {TOKEN}\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body


def _post_body(tokens: dict[str, int], text: str) -> bytes:
    chattts = {"sampling": {"seed": 3, **tokens}, "audio_format": {"sample_rate_hz": RATE}}
    return json.dumps({"input": text, "response_format": "pcm", "chattts": chattts}).encode()


def test_http_stalled_reader_gets_a_cut_body_and_its_slot_freed(srv, log):
    before = _stalled(srv, "HTTPSpeech")
    with _small_socket() as s:
        s.connect(("127.0.0.1", srv.server.http_port))
        s.sendall(_post_head(_post_body(LONG, LONG_TEXT)))
        received = s.recv(4096)
        assert received.startswith(b"HTTP/1.1 200")
        _freed_by_the_stall(srv, log, "HTTPSpeech")
        _short_synthesis_works(srv)
        s.settimeout(10)
        try:
            while chunk := s.recv(65536):
                received += chunk
        except ConnectionResetError:
            pass  # dropped: what the client had not read is gone
    assert not received.endswith(b"0\r\n\r\n")  # no last chunk: the body is cut
    assert _stalled(srv, "HTTPSpeech") == before + 1


def test_websocket_stalled_reader_gets_1008_and_its_slot_freed(srv, log):
    before = _stalled(srv, "HTTPSpeechStream")
    s = _small_socket()
    s.connect(("127.0.0.1", srv.server.http_port))
    url = f"ws://127.0.0.1:{srv.server.http_port}/v1/audio/speech/stream"
    # max_queue: the client stops reading its socket once a frame waits unread.
    with connect(url, sock=s, additional_headers=dict(MD), max_queue=1) as ws:
        config = {"audio_format": {"encoding": "FLOAT32", "sample_rate_hz": RATE}, "sampling": LONG}
        ws.send(json.dumps({"type": "config", **config}))
        ws.send(json.dumps({"type": "text", "text": LONG_TEXT, "flush": True}))
        assert isinstance(ws.recv(timeout=30), bytes)
        _freed_by_the_stall(srv, log, "HTTPSpeechStream")
        with pytest.raises(ConnectionClosed):
            while True:
                ws.recv(timeout=10)
        assert ws.close_code == 1008 and "stalled" in (ws.close_reason or "")
    _short_synthesis_works(srv)
    assert _stalled(srv, "HTTPSpeechStream") == before + 1


@pytest.mark.parametrize("text", ["still open", "ended"])
def test_client_library_stream_never_read_frees_the_slot(srv, log, text: str) -> None:
    """`open_stream`, a long text, and the events never read: while the text is open the
    server waits for read receipts that never come; once it has ended (half-closed), the
    library's 64 KiB window fills. Either way the stall timeout ends it."""
    before = _stalled(srv, "StreamingSynthesize")

    async def run() -> None:
        async with AsyncTTSClient(srv.target, token=TOKEN) as client:
            stream = client.open_stream(config=_grpc_config(LONG), timeout=120)
            stream.flush(LONG_TEXT)
            if text == "ended":
                stream.end_input()
            busy = lambda: not engine_idle(srv)  # noqa: E731
            await asyncio.to_thread(wait_until, busy, FREED_WAIT_S, "the stream admitted")
            await asyncio.to_thread(_freed_by_the_stall, srv, log, "StreamingSynthesize")

    asyncio.run(run())
    _short_synthesis_works(srv)
    assert _stalled(srv, "StreamingSynthesize") == before + 1


def test_grpc_stub_sending_receipts_that_stops_reading_frees_the_slot(srv, log) -> None:
    """A bare stub on a default channel (its window grows to megabytes: without receipts the
    whole stream's 24 kHz PCM fits) with `read_receipts`: it receipts its first chunk, then
    reads nothing more."""
    before = _stalled(srv, "StreamingSynthesize")
    first_read, done = threading.Event(), threading.Event()
    config = tts_pb2.SynthesisConfig(sampling=tts_pb2.Sampling(seed=3, **LONG), read_receipts=True)

    def requests() -> Iterator[tts_pb2.StreamingSynthesizeRequest]:
        yield tts_pb2.StreamingSynthesizeRequest(config=config)
        yield tts_pb2.StreamingSynthesizeRequest(text=tts_pb2.TextInput(text=LONG_TEXT, flush=True))
        first_read.wait(60)
        yield tts_pb2.StreamingSynthesizeRequest(receipt=tts_pb2.ReadReceipt(sample_offset=offset))
        done.wait(120)  # requests open: more receipts would be owed

    with grpc.insecure_channel(srv.target) as channel:
        call = tts_pb2_grpc.TextToSpeechStub(channel).StreamingSynthesize(
            requests(), timeout=120, metadata=MD
        )
        first = next(call)
        offset = first.audio.sample_offset + first.audio.num_samples
        first_read.set()
        try:
            _freed_by_the_stall(srv, log, "StreamingSynthesize")
            _short_synthesis_works(srv)
        finally:
            done.set()
            call.cancel()
    assert _stalled(srv, "StreamingSynthesize") == before + 1


# -- a reader that keeps up with real time --------------------------------------------------------


class Pace:
    """Sleeps so that `num_bytes` read take as long as their audio plays."""

    def __init__(self, bytes_per_s: int) -> None:
        self.bytes_per_s = bytes_per_s
        self.started: float | None = None
        self.num_bytes = 0

    def took(self, num_bytes: int) -> None:
        self.started = self.started or time.monotonic()
        self.num_bytes += num_bytes
        lag = self.started + self.num_bytes / self.bytes_per_s - time.monotonic()
        if lag > 0:
            time.sleep(lag)


def _expected_bytes(bytes_per_sample: int) -> int:
    return (2 * REAL_TIME_TOKENS - 1) * 256 * 2 * bytes_per_sample  # 24 kHz -> 48 kHz


def test_grpc_real_time_reader_is_never_cut(srv, log):
    pace = Pace(BYTES_PER_S["FLOAT32"])
    sampling = {"min_new_tokens": REAL_TIME_TOKENS, "max_new_tokens": REAL_TIME_TOKENS}
    request = tts_pb2.SynthesizeRequest(text="Played as it comes.", config=_grpc_config(sampling))
    with _channel(srv) as channel:
        for reply in tts_pb2_grpc.TextToSpeechStub(channel).Synthesize(
            request, timeout=60, metadata=MD
        ):
            pace.took(len(reply.audio.audio))
    assert pace.num_bytes == _expected_bytes(4)
    assert time.monotonic() - pace.started > 2 * STALL_S  # it did take that long


def test_client_library_real_time_reader_is_never_cut(srv, log):
    """Read receipts pace the server to the reader: one that reads as the audio plays (its
    text open until the first utterance ends, so receipts are what the server waits on) gets
    every sample."""
    pace = Pace(BYTES_PER_S["FLOAT32"])
    sampling = {"min_new_tokens": REAL_TIME_TOKENS, "max_new_tokens": REAL_TIME_TOKENS}

    async def run() -> None:
        async with AsyncTTSClient(srv.target, token=TOKEN) as client:
            stream = client.open_stream(config=_grpc_config(sampling), timeout=60)
            stream.flush("Played as it comes.")
            async for event in stream:
                if isinstance(event, AudioChunkEvent):
                    await asyncio.to_thread(pace.took, len(event.audio))
                elif isinstance(event, UtteranceEndEvent):
                    stream.end_input()

    asyncio.run(run())
    assert pace.num_bytes == _expected_bytes(4)
    assert time.monotonic() - pace.started > 2 * STALL_S  # it did take that long


def test_http_real_time_reader_is_never_cut(srv, log):
    pace = Pace(BYTES_PER_S["pcm"])
    tokens = {"min_new_tokens": REAL_TIME_TOKENS, "max_new_tokens": REAL_TIME_TOKENS}
    with _small_socket() as s:
        s.connect(("127.0.0.1", srv.server.http_port))
        s.sendall(_post_head(_post_body(tokens, "Played as it comes.")))
        received = b""
        while not received.endswith(b"0\r\n\r\n"):
            chunk = s.recv(2048)
            assert chunk, "the body was cut"
            received += chunk
            pace.took(len(chunk))
    head, _, body = received.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200")
    assert len(_unchunk(body)) == _expected_bytes(2)


def _unchunk(body: bytes) -> bytes:
    out, rest = b"", body
    while True:
        size_line, _, rest = rest.partition(b"\r\n")
        size = int(size_line, 16)
        if size == 0:
            return out
        out, rest = out + rest[:size], rest[size + 2 :]


def test_websocket_real_time_reader_is_never_cut(srv, log):
    pace = Pace(BYTES_PER_S["FLOAT32"])
    s = _small_socket()
    s.connect(("127.0.0.1", srv.server.http_port))
    url = f"ws://127.0.0.1:{srv.server.http_port}/v1/audio/speech/stream"
    sampling = {"min_new_tokens": REAL_TIME_TOKENS, "max_new_tokens": REAL_TIME_TOKENS}
    with connect(url, sock=s, additional_headers=dict(MD), max_queue=1) as ws:
        config = {
            "audio_format": {"encoding": "FLOAT32", "sample_rate_hz": RATE},
            "sampling": sampling,
        }
        ws.send(json.dumps({"type": "config", **config}))
        ws.send(json.dumps({"type": "text", "text": "Played as it comes.", "flush": True}))
        ws.send(json.dumps({"type": "end"}))
        kinds = []
        with pytest.raises(ConnectionClosed):
            while True:
                message = ws.recv(timeout=30)
                if isinstance(message, bytes):
                    pace.took(len(message))
                else:
                    kinds.append(json.loads(message)["type"])
        assert ws.close_code == 1000
    assert kinds == ["utterance_end", "done"] and pace.num_bytes == _expected_bytes(4)


# -- a stream with nothing to send --------------------------------------------------------------


def test_an_idle_stream_is_not_stalled(srv, log):
    """Text, a pause longer than the stall timeout with nothing to send, more text: both
    utterances are spoken, at the WebSocket and over gRPC."""
    short = {"min_new_tokens": 8, "max_new_tokens": 8}
    url = f"ws://127.0.0.1:{srv.server.http_port}/v1/audio/speech/stream"
    with connect(url, additional_headers=dict(MD)) as ws:
        ws.send(json.dumps({"type": "config", "sampling": short}))
        ws.send(json.dumps({"type": "text", "text": "First.", "flush": True}))
        while not isinstance(message := ws.recv(timeout=30), str):
            pass
        assert json.loads(message)["type"] == "utterance_end"
        time.sleep(STALL_S * 1.5)  # the pause under test, not a synchronisation
        ws.send(json.dumps({"type": "text", "text": "Second.", "flush": True}))
        ws.send(json.dumps({"type": "end"}))
        texts = []
        with pytest.raises(ConnectionClosed):
            while True:
                message = ws.recv(timeout=30)
                if isinstance(message, str):
                    texts.append(json.loads(message)["type"])
        assert ws.close_code == 1000 and texts == ["utterance_end", "done"]

    first_done = threading.Event()

    def requests() -> Iterator[tts_pb2.StreamingSynthesizeRequest]:
        yield tts_pb2.StreamingSynthesizeRequest(config=_grpc_config(short))
        yield tts_pb2.StreamingSynthesizeRequest(text=tts_pb2.TextInput(text="First.", flush=True))
        first_done.wait(30)
        time.sleep(STALL_S * 1.5)
        yield tts_pb2.StreamingSynthesizeRequest(text=tts_pb2.TextInput(text="Second.", flush=True))

    ends = 0
    with grpc.insecure_channel(srv.target) as channel:
        stub = tts_pb2_grpc.TextToSpeechStub(channel)
        for reply in stub.StreamingSynthesize(requests(), timeout=60, metadata=MD):
            if reply.HasField("utterance_end"):
                ends += 1
                first_done.set()
    assert ends == 2
