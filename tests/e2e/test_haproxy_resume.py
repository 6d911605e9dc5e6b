"""A resume behind the shipped HAProxy files goes to the replica that holds the stream.

Three tiny replicas behind deploy/haproxy/haproxy.cfg and haproxy-plain.cfg, as shipped; a real
TCP relay between the client library and the proxy is cut several times a stream (the car's
connection; the proxy's own to the replica ends with it). Each resume must land on the replica
holding the stream (the proxy's stick table, on the `chattts-stream-id` header): anywhere else
it is refused NOT_FOUND and the stream fails. Without stickiness, leastconn over three idle
replicas sends each resume elsewhere two times in three.

And a replica killed (SIGKILL) under 8 callers: the proxy sends each resume of its streams to
another replica, which answers NOT_FOUND, and the client library goes on there as a new stream
from the first word not wholly heard. No call fails, and each caller's word timings show every
word of its text spoken once.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import statistics
from collections.abc import Iterator
from pathlib import Path

import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from chattts_client import AsyncTTSClient, AudioChunkEvent, ResumedEvent, make_config
from chattts_devtools.replicas import CONFIGS, REPLICA_ARGS, HAProxy, Replicas, haproxy_missing
from chattts_devtools.tcp_relay import TcpRelay
from heard_words import assert_each_word_heard_once

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


def _websocket_through_cuts(port: int, relay: TcpRelay) -> list[str]:
    """One resumable WebSocket stream cut at each audio frame, up to CUTS times, resumed
    with `?stream_id=` in the URL (as the playground does): the first message of each socket."""
    firsts: list[str] = []
    stream: dict = {}
    samples = since_audio = 0
    first = {"type": "config", "voice": "seed:4", "audio_format": "pcm", "resumable": True}
    done = False
    while not done:
        query = f"?stream_id={stream['stream_id']}" if stream else ""
        url = f"ws://127.0.0.1:{port}/v1/audio/speech/stream{query}"
        with connect(url, open_timeout=30) as ws:
            ws.send(json.dumps(first))
            answer = json.loads(ws.recv(timeout=120))
            firsts.append(answer["type"])
            if answer["type"] == "error":
                return firsts
            stream = stream or answer
            # A stream that had all its text may end and close before the last of these.
            with contextlib.suppress(ConnectionClosed):
                for message in ({"type": "text", "text": TEXT, "seq": 1}, {"type": "end"}):
                    ws.send(json.dumps(message))
            try:
                while True:
                    message = ws.recv(timeout=120)
                    if isinstance(message, bytes):
                        samples, since_audio = samples + len(message) // 2, 0
                        if relay.cuts < CUTS:  # each frame: a short stream still gets cut
                            relay.cut()
                    elif json.loads(message)["type"] == "done":
                        done = True
                    else:
                        since_audio += 1
            except ConnectionClosed:
                pass
        first = {
            "type": "resume",
            "stream_id": stream["stream_id"],
            "resume_token": stream["resume_token"],
            "sample_offset": samples,
            "events_received": since_audio,
        }
    return firsts


@pytest.mark.parametrize("config", ["haproxy", "plain"])
def test_websocket_resumes_through_the_shipped_haproxy_reach_the_replica_holding_the_stream(
    replicas: Replicas, config: str
) -> None:
    with HAProxy(CONFIGS[config], replicas) as proxy, TcpRelay(proxy.http_port) as relay:
        firsts = _websocket_through_cuts(relay.port, relay)
        log = "".join(proxy.log)
    # How many frames the random-weight model speaks varies: at least two cuts, each resumed
    # on the replica holding the stream.
    assert relay.cuts >= 2, f"the stream ended after {relay.cuts} cuts"
    assert firsts == ["stream"] + ["resumed"] * relay.cuts, (firsts, log[-3000:])


CALLERS = 8
SENTENCES = [
    "Continue on the ring road for two kilometers. ",
    "Keep right at the fork toward the airport. ",
    "Take the second exit at the next roundabout. ",
    "Stay in the left lane past the bridge. ",
    "Your destination is on the right after the school. ",
]


async def _caller(target: str, index: int, all_heard: asyncio.Event, heard: list[int]) -> list:  # type: ignore[type-arg]
    """One caller's whole stream: its events (the kill comes once every caller has audio)."""
    config = make_config(seed=index, word_timing=True)
    config.sampling.min_new_tokens = 40
    config.sampling.max_new_tokens = 60
    events: list[object] = []
    async with AsyncTTSClient(target) as client:
        stream = client.open_stream(config=config, timeout=300)
        for sentence in SENTENCES:
            stream.push(sentence)
        stream.end_input()
        async for event in stream:
            events.append(event)
            if isinstance(event, AudioChunkEvent) and index not in heard:
                heard.append(index)
                if len(heard) == CALLERS:
                    all_heard.set()
    return events


async def _kill_under_load(target: str, replicas: Replicas) -> list[list]:  # type: ignore[type-arg]
    all_heard, heard = asyncio.Event(), []
    callers = [asyncio.ensure_future(_caller(target, i, all_heard, heard)) for i in range(CALLERS)]
    await all_heard.wait()
    replicas.kill(replicas.members[0])
    return list(await asyncio.gather(*callers))


def test_a_replica_killed_under_load_fails_no_call_and_no_word_is_heard_twice(
    replicas: Replicas,
) -> None:
    with HAProxy(CONFIGS["haproxy"], replicas) as proxy:
        try:
            results = asyncio.run(_kill_under_load(proxy.grpc_target, replicas))
        finally:
            replicas.revive(replicas.members[0])
    text = "".join(SENTENCES)
    went_on = [e for events in results for e in events if isinstance(e, ResumedEvent)]
    for events in results:
        assert_each_word_heard_once(text, events)
    assert went_on, "no caller was on the killed replica"
    assert all(e.new_stream for e in went_on), went_on
    gaps = sorted(e.gap_s for e in went_on)
    print(
        f"{len(went_on)} of {CALLERS} calls went on elsewhere; gap p50 "
        f"{statistics.median(gaps) * 1000:.0f} ms, max {gaps[-1] * 1000:.0f} ms"
    )
