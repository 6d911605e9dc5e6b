"""chattts_client's default service config against a replica that refuses (RELIABILITY.md
promise 12): one of two real servers is not accepting streams (the state a loading or draining
replica is in: UNAVAILABLE before any response), the other serves. With the default config every
call succeeds, streams included, its text sent again by grpc to the other replica; with
`service_config=None` (no retries, grpc's pick_first) the refusals reach the caller.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import grpc
import pytest

from chattts_client import TTSClient, make_config
from httputil import streams_total
from serverutil import DEV_MODEL_CACHE, InProcessServer, tiny_server_config

NUM_CALLS = 6
CONFIG = make_config(seed=2, min_new_tokens=4, max_new_tokens=4)


@pytest.fixture(scope="module")
def pair(tiny_model_dir) -> Iterator[tuple[InProcessServer, InProcessServer]]:
    with (
        InProcessServer(tiny_server_config(DEV_MODEL_CACHE)) as refusing,
        InProcessServer(tiny_server_config(DEV_MODEL_CACHE)) as serving,
    ):
        assert refusing.server is not None and refusing.server.admission is not None
        refusing.server.admission.ready = False  # as while loading (--no-listen-when-ready)
        yield refusing, serving


def _fragments() -> Iterator[str]:
    for text in ("Sent again ", "to the other ", "replica."):
        time.sleep(0.01)
        yield text


def _calls(client: TTSClient) -> list[str]:
    """The outcome of each call: alternately a Synthesize and a fragmented stream."""
    outcomes = []
    for i in range(NUM_CALLS):
        try:
            if i % 2:
                events = client.stream(_fragments(), config=CONFIG, timeout=30)
            else:
                events = client.synthesize("Said once.", config=CONFIG, timeout=30)
            for _ in events:
                pass
            outcomes.append("OK" if events.stats.audio_s > 0 else "no audio")
        except grpc.RpcError as exc:
            outcomes.append(exc.code().name)
    return outcomes


def _target(*servers: InProcessServer) -> str:
    return "ipv4:" + ",".join(s.target for s in servers)


def test_the_default_config_resends_a_refused_call_and_stream(pair) -> None:
    refusing, serving = pair
    methods = ("Synthesize", "StreamingSynthesize")
    refused = {m: streams_total(refusing, m, "UNAVAILABLE") for m in methods}
    with TTSClient(_target(refusing, serving)) as client:
        assert _calls(client) == ["OK"] * NUM_CALLS
    # Round robin sent some of each kind to the refusing replica first: they were resent.
    for method, before in refused.items():
        assert streams_total(refusing, method, "UNAVAILABLE") > before, method


def test_without_the_service_config_the_refusals_reach_the_caller(pair) -> None:
    refusing, serving = pair
    with TTSClient(_target(refusing, serving), service_config=None) as client:
        outcomes = _calls(client)
    # grpc's default balancer (pick_first) sends every call to the first address: all refused.
    assert outcomes == ["UNAVAILABLE"] * NUM_CALLS
