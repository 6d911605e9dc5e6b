"""chattts_client finds a peer that stopped answering within seconds (its default keepalive),
where the call would otherwise hang until its deadline: a replica frozen with SIGSTOP keeps its
sockets open, as a lost node or a partitioned network does, and sends nothing."""

from __future__ import annotations

import signal
import threading
import time
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
# the connection. The slack covers a loaded 2-core machine's scheduling.
BOUND_S = (KEEPALIVE_TIME_MS + KEEPALIVE_TIMEOUT_MS) / 1000 + 5


def test_a_frozen_replica_fails_the_stream_unavailable_within_seconds(
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
        events = client.stream(texts(), config=config, flush_each=True, timeout=60)
        try:
            next(events)  # audio: the replica is speaking
            srv.proc.send_signal(signal.SIGSTOP)
            frozen_at = time.monotonic()
            with pytest.raises(grpc.RpcError) as info:
                for _ in events:
                    pass
            took_s = time.monotonic() - frozen_at
        finally:
            more_text.set()
            srv.proc.send_signal(signal.SIGCONT)
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE, info.value
        assert took_s < BOUND_S, f"{took_s:.1f} s to find the frozen peer"
