"""A real server with its HTTP front door on for the HTTP tests, and helpers to read it back."""

from __future__ import annotations

import gc
import io
import json
import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import openai

from chattts_server.config import SecurityConfig, ServerConfig
from polling import wait_until
from serverutil import DEV_MODEL_CACHE, InProcessServer, free_port, tiny_server_config

TOKEN = "http-test-token"


def samples_for(num_tokens: int) -> int:
    """Offline length: one GPT token -> 2 mel frames; Vocos's centred iSTFT gives (frames - 1) hops."""
    return (2 * num_tokens - 1) * 256


def fixed(num_tokens: int, seed: int = 7) -> dict[str, object]:
    """The `chattts` extension fixing the audio tokens (and so the length) of every sentence."""
    return {"sampling": {"seed": seed, "min_new_tokens": num_tokens, "max_new_tokens": num_tokens}}


def engine_idle(srv: InProcessServer) -> bool:
    assert srv.server is not None
    return srv.server.engine.stats().active_requests == 0 and srv.server.admission.active == 0


IDLE_WAIT_S = 60
"""How long a slot may take to be released. Generous on purpose: on a loaded machine a release is
slow, not wrong, so what a test asserts is the ending's status and the engine idle, never how fast."""


def wait_idle(srv: InProcessServer, what: str) -> None:
    """Return once no request holds a KV slot or an admission place (AssertionError after
    IDLE_WAIT_S, naming `what`)."""
    wait_until(lambda: engine_idle(srv), IDLE_WAIT_S, what)


def stalled_total(srv: InProcessServer) -> float:
    """Streams the server has cancelled for --stall-timeout-s, all methods together."""
    assert srv.server is not None
    return sum(
        sample.value
        for metric in srv.server.metrics.registry.collect()
        if metric.name == "chattts_stalled_streams"
        for sample in metric.samples
        if sample.name.endswith("_total")
    )


def wait_freed_by_the_call(srv: InProcessServer, stalled_before: float, what: str) -> None:
    """`wait_idle`, then: the slot was freed by how the call ended (its cancel, deadline or death),
    not by --stall-timeout-s, which a wait as long as IDLE_WAIT_S would also reach."""
    wait_idle(srv, what)
    assert stalled_total(srv) == stalled_before, f"{what}: freed by the stall timeout, not the call"


def streams_total(srv: InProcessServer, method: str, status: str) -> float:
    assert srv.server is not None
    value = srv.server.metrics.registry.get_sample_value(
        "chattts_streams_total", {"method": method, "status": status}
    )
    return value or 0.0


@contextmanager
def http_server(
    folder: Path,
    *,
    max_streams: int = 1,
    max_queue: int = 0,
    limits: dict[str, object] | None = None,
    runner_factory: Callable[[ServerConfig], Any] | None = None,
    listen_when_ready: bool = True,
    lexicons: tuple[Path, ...] = (),
    **security: object,
) -> Iterator[InProcessServer]:
    """An in-process server (tiny model) with HTTP on, bearer tokens on (TOKEN) and one voice
    preset ("anna"); `security` adds TLS settings, `limits` overrides LimitsConfig fields,
    `runner_factory` builds the engine's runner (e.g. a FaultyRunner), `listen_when_ready`
    False opens the ports while the model loads, `lexicons` are its --lexicon files."""
    tokens = folder / "tokens.txt"
    tokens.write_text(f"# test tokens\n{TOKEN}\n")
    voices = folder / "voices"
    voices.mkdir(exist_ok=True)
    (voices / "anna.json").write_text(json.dumps({"description": "test voice", "seed": 4321}))
    base = tiny_server_config(DEV_MODEL_CACHE, max_streams=max_streams, max_queue=max_queue)
    config = replace(
        base,
        network=replace(base.network, http_port=free_port(), listen_when_ready=listen_when_ready),
        limits=replace(base.limits, **(limits or {})),  # type: ignore[arg-type]
        security=SecurityConfig(auth_token_file=tokens, **security),  # type: ignore[arg-type]
        voices_dir=voices,
        lexicon=lexicons,
    ).validate()
    factory = None if runner_factory is None else lambda: runner_factory(config)
    with InProcessServer(config, wait=not security, runner_factory=factory) as srv:
        yield srv


def http_url(srv: InProcessServer, scheme: str = "http") -> str:
    assert srv.server is not None
    return f"{scheme}://127.0.0.1:{srv.server.http_port}"


def ws_stream_url(srv: InProcessServer) -> str:
    """The server's WebSocket stream route, `ws://.../v1/audio/speech/stream`."""
    return http_url(srv, "ws") + "/v1/audio/speech/stream"


def sdk_sse_events(srv: InProcessServer, text: str, chattts: dict, timeout: float) -> list[dict]:
    """POST /v1/audio/speech through the openai SDK with `stream_format="sse"` (voice "alloy",
    PCM, `chattts` as the extra body): the events, in order, once the response is 200."""
    with (
        openai.OpenAI(
            base_url=http_url(srv) + "/v1", api_key=TOKEN, max_retries=0, timeout=timeout
        ) as client,
        client.audio.speech.with_streaming_response.create(
            model="tts-1",
            voice="alloy",
            input=text,
            response_format="pcm",
            stream_format="sse",
            extra_body={"chattts": chattts},
        ) as response,
    ):
        assert response.status_code == 200
        return [
            json.loads(line[len("data: ") :])
            for line in response.iter_lines()
            if line.startswith("data: ")
        ]


def decode(data: bytes, response_format: str) -> tuple[np.ndarray, int]:
    """Decode a response body with a real decoder: (int16 samples, sample rate)."""
    if response_format == "pcm":
        return np.frombuffer(data, dtype="<i2"), 24000
    if response_format == "wav":
        import soundfile as sf

        audio, rate = sf.read(io.BytesIO(data), dtype="int16")
        return np.asarray(audio), int(rate)
    import av

    container = {"opus": "ogg", "mp3": "mp3", "aac": "aac", "flac": "flac"}[response_format]
    parts, rate = [], 0
    with av.open(io.BytesIO(data), format=container) as f:
        stream = f.streams.audio[0]
        for frame in f.decode(stream):
            rate = frame.sample_rate
            pcm = frame.to_ndarray()
            if pcm.dtype.kind == "f":
                pcm = np.rint(np.clip(pcm, -1, 1) * 32767).astype(np.int16)
            parts.append(pcm.reshape(-1))
    return (np.concatenate(parts) if parts else np.zeros(0, np.int16)), rate


class LogRecorder(logging.Handler):
    """Every log record while installed (the in-process server logs in this process), with
    chattts_server at INFO; `problems()` are the records no client input may cause."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def __enter__(self) -> LogRecorder:
        self._level = logging.getLogger("chattts_server").level
        logging.getLogger("chattts_server").setLevel(logging.INFO)
        logging.getLogger().addHandler(self)
        return self

    def __exit__(self, *exc: object) -> None:
        logging.getLogger().removeHandler(self)
        logging.getLogger("chattts_server").setLevel(self._level)

    def lines(self) -> list[str]:
        return [f"{r.levelname} {r.name}: {r.getMessage()}" for r in self.records]

    def problems(self) -> list[str]:
        """ERROR records, tracebacks, ASGI exceptions, and asyncio's unretrieved exceptions
        (collected first, so they are logged now)."""
        gc.collect()
        return [
            f"{r.levelname} {r.name}: {r.getMessage()}"
            for r in self.records
            if r.levelno >= logging.ERROR or r.exc_info or "Exception in ASGI" in r.getMessage()
        ]
