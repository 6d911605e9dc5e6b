"""A resume behind the shipped HAProxy files goes to the replica that holds the stream.

Three tiny replicas behind deploy/haproxy/haproxy.cfg and haproxy-plain.cfg, as shipped; a real
TCP relay between the client library and the proxy is cut several times a stream (the car's
connection; the proxy's own to the replica ends with it). Each resume must land on the replica
holding the stream (the proxy's stick table, on the `chattts-stream-id` header): anywhere else
it is refused NOT_FOUND and the stream fails. Without stickiness, leastconn over three idle
replicas sends each resume elsewhere two times in three.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from chattts_client import AsyncTTSClient, AudioChunkEvent, ResumedEvent, make_config
from chattts_devtools.replicas import CONFIGS, REPLICA_ARGS, HAProxy, Replicas, haproxy_missing
from chattts_devtools.tcp_relay import TcpRelay

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(haproxy_missing() is not None, reason=str(haproxy_missing())),
]

TEXT = (
    "In three hundred meters, turn left onto the ring road. Keep right at the fork, then take "
    "the second exit toward the airport. Your destination is on the left after the bridge."
)
CUTS = 4


@pytest.fixture(scope="module")
def replicas(dev_model_cache: Path, tiny_model_dir: Path) -> Iterator[Replicas]:
    with Replicas(3, dev_model_cache, REPLICA_ARGS) as replicas:
        replicas.start()
        yield replicas


async def _speak_through_cuts(target: str, relay: TcpRelay) -> tuple[int, float]:
    """One stream cut after every second audio chunk, CUTS times: its resumes, its audio."""
    resumes, audio_s, chunks = 0, 0.0, 0
    async with AsyncTTSClient(target) as client:
        stream = client.open_stream(config=make_config(seed=4), timeout=300)
        stream.flush(TEXT)
        stream.end_input()
        async for event in stream:
            if isinstance(event, ResumedEvent):
                resumes += 1
            elif isinstance(event, AudioChunkEvent):
                audio_s += event.duration_s
                chunks += 1
                if chunks % 2 == 0 and relay.cuts < CUTS:
                    relay.cut()
    return resumes, audio_s


@pytest.mark.parametrize("config", ["haproxy", "plain"])
def test_resumes_through_the_shipped_haproxy_reach_the_replica_holding_the_stream(
    replicas: Replicas, config: str
) -> None:
    with HAProxy(CONFIGS[config], replicas) as proxy, TcpRelay(proxy.grpc_port) as relay:
        resumes, audio_s = asyncio.run(_speak_through_cuts(relay.target, relay))
        log = "".join(proxy.log)
    assert relay.cuts == CUTS, f"the stream ended before it was cut {CUTS} times"
    assert 1 <= resumes <= CUTS, log[-3000:]
    assert audio_s > 0
