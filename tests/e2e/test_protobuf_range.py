"""The client works on every protobuf runtime it declares: the lowest in a venv of its own, the
highest in the dev venv, each against the real server (tiny dev model, loopback).

The stubs are protobuf 6.30.0 gencode (tools/gen_proto.py); protobuf's cross-version guarantee
lets runtimes of the same major and of the next major load it, and the runtime checks that it is
not older than the gencode. pyproject declares `protobuf>=6.30.0,<8` and `grpcio>=1.72.1`.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from clientvenv import PIPECAT_AI, REPO, client_floor_pins, client_venv, run_in

pytestmark = pytest.mark.slow

# Runs in the client venv: both clients, a Synthesize and a stream with flush and barge-in.
_USE_CLIENT = r"""
import asyncio, sys, warnings
warnings.simplefilter("error")  # a gencode/runtime version warning fails the run
import google.protobuf, grpc
from chattts_client import AsyncTTSClient, AudioChunkEvent, Clear, TTSClient, UtteranceEndEvent, make_config

target, want_protobuf, want_grpcio = sys.argv[1:4]
assert google.protobuf.__version__ == want_protobuf, google.protobuf.__version__
assert grpc.__version__ == want_grpcio, grpc.__version__
config = make_config(voice=7, seed=1, max_new_tokens=24, top_k=1)
with TTSClient(target) as client:
    events = list(client.synthesize("Hello there.", config=config, timeout=60))
    audio = [e for e in events if isinstance(e, AudioChunkEvent)]
    ends = [e for e in events if isinstance(e, UtteranceEndEvent)]
    assert audio and len(ends) == 1 and ends[0].finish_reason in ("eos", "max_tokens"), events
    assert sum(e.num_samples for e in audio) * 2 == sum(len(e.audio) for e in audio)
    print("sync", len(audio), "chunks", sum(e.num_samples for e in audio), "samples")

async def stream():
    async with AsyncTTSClient(target) as client:
        texts = ["One two", " three four.", Clear("Five six.")]
        reasons = [e.finish_reason async for e in client.stream(texts, config=config, timeout=60)
                   if isinstance(e, UtteranceEndEvent)]
        assert reasons and all(r in ("eos", "max_tokens", "cleared") for r in reasons), reasons
        print("async", reasons)
        voices = await client.list_voices(timeout=10)
        print("voices", len(voices))

asyncio.run(stream())
"""


def test_client_on_the_lowest_declared_runtime(server):
    pins = client_floor_pins()
    assert pins == ["protobuf==6.30.0", "grpcio==1.72.1"], pins  # the gencode's own versions
    # The same venv serves the Pipecat tests (pipecat-ai needs protobuf<7): one build, not two.
    python = client_venv("pipecat", [*pins, PIPECAT_AI])
    out = run_in(python, _USE_CLIENT, server.target, "6.30.0", "1.72.1")
    assert "sync" in out and "async" in out, out


def test_client_on_the_dev_runtime_without_warnings(server):
    import google.protobuf
    import grpc

    assert int(google.protobuf.__version__.split(".")[0]) == 7  # the newest major of the range
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            _USE_CLIENT,
            server.target,
            google.protobuf.__version__,
            grpc.__version__,
        ],
        cwd=REPO,
        env={"PYTHONPATH": str(REPO / "client"), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    assert "sync" in out and "async" in out, out
