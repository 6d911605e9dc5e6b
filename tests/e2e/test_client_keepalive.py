"""chattts_client finds a peer that stopped answering by its default keepalive, where the call
would otherwise hang until its deadline: a replica frozen with SIGSTOP keeps its
sockets open, as a lost node or a partitioned network does, and sends nothing."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from chattts_client import TTSClient
from chattts_client.resilience import KEEPALIVE_TIME_MS, KEEPALIVE_TIMEOUT_MS
from chattts_proto.chattts.v1 import tts_pb2
from serverutil import launch, wait_serving

pytestmark = pytest.mark.slow

# Pings start after KEEPALIVE_TIME_MS of silence; one unanswered for KEEPALIVE_TIMEOUT_MS ends
# the connection: long before the call's own deadline. What shows it is the status
# (UNAVAILABLE: the keepalive; DEADLINE_EXCEEDED: the deadline came first), not a stopwatch a
# loaded machine can stretch.
DEADLINE_S = (KEEPALIVE_TIME_MS + KEEPALIVE_TIMEOUT_MS) / 1000 + 60


def test_a_frozen_replica_fails_the_stream_unavailable_before_its_deadline(
    tiny_model_dir: Path, dev_model_cache: Path
) -> None:
    more_text = threading.Event()

    def texts() -> Iterator[str]:
        yield "Hello there."
        more_text.wait(60)  # the caller has more to say later: the stream stays open

    config = tts_pb2.SynthesisConfig(
        sampling=tts_pb2.Sampling(seed=1, min_new_tokens=12, max_new_tokens=12)
    )
    with launch(["--no-warmup"], cache=dev_model_cache) as srv, TTSClient(srv.target) as client:
        wait_serving(srv.target)
        events = client.stream(texts(), config=config, flush_each=True, timeout=DEADLINE_S)
        try:
            next(events)  # audio: the replica is speaking
            srv.proc.send_signal(signal.SIGSTOP)
            with pytest.raises(grpc.RpcError) as info:
                for _ in events:
                    pass
        finally:
            more_text.set()
            srv.proc.send_signal(signal.SIGCONT)
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE, info.value
