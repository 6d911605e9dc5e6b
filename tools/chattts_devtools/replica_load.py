"""Steady load on a set of replicas, each call's outcome kept: what the replica tests and
bench/bench_replicas.py judge a restart or a kill by.

Callers cycle through four kinds of call, as real traffic mixes them: `Synthesize` and a
`StreamingSynthesize` that sends its text in fragments (both on `chattts_client.TTSClient`, with
the library's default service config and keepalive), an OpenAI-style `POST /v1/audio/speech`
streamed back as PCM, and the WebSocket `/v1/audio/speech/stream` sent the same fragments. A
fifth kind, `resumable`, is the asyncio client library's resumable stream
(`AsyncTTSClient.open_stream`): a cut call resumes, or goes on elsewhere, by itself; its
outcome counts the resumes. A caller that fails backs off 0.2 s, then goes on.
"""

from __future__ import annotations

import asyncio
import json
import math
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import grpc
import httpx2
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus
from websockets.sync.client import connect as ws_connect

from chattts_client import AsyncTTSClient, ResumedEvent, TTSClient
from chattts_proto.chattts.v1 import tts_pb2

KINDS = ("synthesize", "stream", "post", "websocket")
"""The default mix; `RESUMABLE` may be added."""
RESUMABLE = "resumable"
FRAGMENTS = ("Replicas come ", "and go, ", "the call goes on.")
HTTP_KINDS = ("post", "websocket")
CALL_TIMEOUT_S = 60.0
BACKOFF_S = 0.2


@dataclass
class Outcome:
    """One call, timed on time.monotonic()."""

    kind: str
    started: float
    ended: float = 0.0
    first_audio: float | None = None
    status: str = "OK"  # "OK", a gRPC status name, "HTTP 503", "cut body", "close 1006", ...
    served_by: str | None = None  # the proxy's x-served-by (replica name), when behind one
    detail: str = ""  # the error's details, for reports
    resumes: int = 0  # a resumable stream's ResumedEvents
    new_streams: int = 0  # ...of which went on as a new stream (elsewhere)

    @property
    def ok(self) -> bool:
        return self.status == "OK"

    @property
    def ttfa_s(self) -> float | None:
        return None if self.first_audio is None else self.first_audio - self.started


def _sampling(num_tokens: int) -> dict[str, int]:
    return {"seed": 7, "min_new_tokens": num_tokens, "max_new_tokens": num_tokens}


def _served_by(call: grpc.Call) -> str | None:
    return dict(call.initial_metadata() or ()).get("x-served-by")  # type: ignore[return-value]


def _fragments() -> Iterator[str]:
    for text in FRAGMENTS:
        time.sleep(0.02)  # text arriving as an LLM writes it
        yield text


class Load:
    """`num_callers` threads calling until `stop`; `outcomes` grows as calls end."""

    def __init__(
        self,
        grpc_target: str,
        http_url: str | None,
        num_callers: int = 8,
        num_tokens: int = 24,
        kinds: tuple[str, ...] = KINDS,
    ) -> None:
        """`http_url` None: gRPC calls only (no balancer in front of the HTTP doors)."""
        self.grpc_target = grpc_target
        self.http_url = http_url or ""
        self.kinds = kinds if http_url else tuple(k for k in kinds if k not in HTTP_KINDS)
        self.num_callers = num_callers
        self.num_tokens = num_tokens
        self.outcomes: list[Outcome] = []
        self.in_flight: dict[int, Outcome] = {}
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._config = tts_pb2.SynthesisConfig(sampling=tts_pb2.Sampling(**_sampling(num_tokens)))

    def start(self) -> Load:
        for i in range(self.num_callers):
            thread = threading.Thread(target=self._caller, args=(i,), daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def stop(self, timeout_s: float = CALL_TIMEOUT_S + 10) -> list[Outcome]:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout_s)
        return list(self.outcomes)

    def _caller(self, index: int) -> None:
        kind = self.kinds[index % len(self.kinds)]
        if kind == RESUMABLE:
            asyncio.run(self._resumable_caller(index))
            return
        with TTSClient(self.grpc_target) as client, httpx2.Client(timeout=CALL_TIMEOUT_S) as http:
            while not self._stop.is_set():
                outcome = Outcome(kind, time.monotonic())
                self.in_flight[index] = outcome
                if kind == "post":
                    self._post(http, outcome)
                elif kind == "websocket":
                    self._websocket(outcome)
                else:
                    self._grpc(client, kind, outcome)
                outcome.ended = time.monotonic()
                del self.in_flight[index]
                self.outcomes.append(outcome)
                if not outcome.ok:
                    self._stop.wait(BACKOFF_S)

    async def _resumable_caller(self, index: int) -> None:
        async with AsyncTTSClient(self.grpc_target) as client:
            while not self._stop.is_set():
                outcome = Outcome(RESUMABLE, time.monotonic())
                self.in_flight[index] = outcome
                await self._resumable(client, outcome)
                outcome.ended = time.monotonic()
                del self.in_flight[index]
                self.outcomes.append(outcome)
                if not outcome.ok:
                    await asyncio.sleep(BACKOFF_S)

    async def _resumable(self, client: AsyncTTSClient, outcome: Outcome) -> None:
        stream = client.open_stream(config=self._config, timeout=CALL_TIMEOUT_S)
        try:
            for text in FRAGMENTS:
                stream.push(text)
                await asyncio.sleep(0.02)
            stream.end_input()
            async for event in stream:
                if isinstance(event, ResumedEvent):
                    outcome.resumes += 1
                    outcome.new_streams += event.new_stream
                elif outcome.first_audio is None and stream.stats.first_audio_at is not None:
                    outcome.first_audio = time.monotonic()
            if stream.stats.num_utterances == 0 or stream.stats.audio_s <= 0:
                outcome.status = "no audio"
        except grpc.RpcError as exc:
            outcome.status = exc.code().name
            outcome.detail = str(exc.details())[:120]

    def _grpc(self, client: TTSClient, kind: str, outcome: Outcome) -> None:
        if kind == "synthesize":
            events = client.synthesize(
                "Replicas come and go.", config=self._config, timeout=CALL_TIMEOUT_S
            )
        else:
            events = client.stream(_fragments(), config=self._config, timeout=CALL_TIMEOUT_S)
        try:
            for _ in events:
                if outcome.first_audio is None and events.stats.first_audio_at is not None:
                    outcome.first_audio = time.monotonic()
                    outcome.served_by = _served_by(events.call)
            if events.stats.num_utterances == 0 or events.stats.audio_s <= 0:
                outcome.status = "no audio"
        except grpc.RpcError as exc:
            outcome.status = exc.code().name
            outcome.detail = str(exc.details())[:120]

    def _post(self, http: httpx2.Client, outcome: Outcome) -> None:
        body = {
            "input": "Replicas come and go.",
            "voice": "alloy",
            "response_format": "pcm",
            "chattts": {"sampling": _sampling(self.num_tokens)},
        }
        try:
            with http.stream("POST", self.http_url + "/v1/audio/speech", json=body) as reply:
                outcome.served_by = reply.headers.get("x-served-by")
                if reply.status_code != 200:
                    reply.read()
                    outcome.status = f"HTTP {reply.status_code}"
                    return
                num_bytes = 0
                for chunk in reply.iter_bytes():
                    if chunk and outcome.first_audio is None:
                        outcome.first_audio = time.monotonic()
                    num_bytes += len(chunk)
            if num_bytes < self._min_bytes:
                outcome.status = "cut body"
        except httpx2.RemoteProtocolError:
            outcome.status = "cut body"
        except httpx2.HTTPError as exc:
            outcome.status = type(exc).__name__

    @property
    def _min_bytes(self) -> int:
        return 2 * (2 * self.num_tokens - 1) * 256  # int16, 2 frames a token

    def _websocket(self, outcome: Outcome) -> None:
        url = self.http_url.replace("http", "ws", 1) + "/v1/audio/speech/stream"
        config = {"type": "config", "sampling": _sampling(self.num_tokens)}
        try:
            with ws_connect(url, open_timeout=10, close_timeout=5) as ws:
                if ws.response is not None:
                    outcome.served_by = ws.response.headers.get("x-served-by")
                ws.send(json.dumps(config))
                for text in _fragments():
                    ws.send(json.dumps({"type": "text", "text": text}))
                ws.send(json.dumps({"type": "end"}))
                num_bytes, done = 0, False
                while not done:  # the server closes (1000) right after "done"
                    message = ws.recv(timeout=CALL_TIMEOUT_S)
                    if isinstance(message, bytes):
                        if outcome.first_audio is None:
                            outcome.first_audio = time.monotonic()
                        num_bytes += len(message)
                    else:
                        event = json.loads(message)
                        done = event["type"] == "done"
                        if event["type"] == "error":
                            outcome.detail = event["error"]["message"][:120]
            if num_bytes < self._min_bytes:
                outcome.status = "no audio"
        except InvalidStatus as exc:
            outcome.status = f"HTTP {exc.response.status_code}"
        except ConnectionClosed as exc:
            outcome.status = f"close {exc.rcvd.code if exc.rcvd else 1006}"
        except (InvalidHandshake, OSError, TimeoutError) as exc:
            outcome.status = type(exc).__name__


# --- judging a run ----------------------------------------------------------------------------


def p95(values: list[float]) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(0.95 * len(ordered)) - 1)]


@dataclass
class KillReport:
    """A kill -9 under load, judged: who failed, how, how fast; who was spared."""

    kill_at: float
    failed: list[Outcome] = field(default_factory=list)
    started_after: list[Outcome] = field(default_factory=list)
    ttfa_before: list[float] = field(default_factory=list)
    ttfa_during: list[float] = field(default_factory=list)  # survivors, 5 s from the kill

    @property
    def statuses(self) -> list[str]:
        """Each kind of call that failed, with the status it failed with: "stream:UNKNOWN"."""
        return sorted({f"{o.kind}:{o.status}" for o in self.failed})

    @property
    def max_time_to_error_s(self) -> float:
        return max((o.ended - self.kill_at for o in self.failed), default=0.0)


def judge_kill(outcomes: list[Outcome], kill_at: float, window_s: float = 5.0) -> KillReport:
    report = KillReport(kill_at)
    for o in outcomes:
        if not o.ok:
            report.failed.append(o)
        if o.started > kill_at:
            report.started_after.append(o)
        if o.ok and o.ttfa_s is not None:
            if o.started < kill_at:
                report.ttfa_before.append(o.ttfa_s)
            elif o.started < kill_at + window_s:
                report.ttfa_during.append(o.ttfa_s)
    return report
