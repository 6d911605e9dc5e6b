"""Sync and asyncio clients for the chattts.v1.TextToSpeech service.

Responses are converted once, in `event_from_pb`, into thin dataclasses; errors are left as
`grpc.RpcError` (for the asyncio client `grpc.aio.AioRpcError`, a subclass) so callers see the
real status code.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterable, AsyncIterator, Iterable, Iterator, Mapping
from dataclasses import dataclass, fields
from typing import Any, TypeVar

import grpc

from chattts_client.messages import (
    AudioChunkEvent,
    Event,
    StreamItem,
    UtteranceEndEvent,
    VoiceInfo,
    event_from_pb,
    text_input,
)
from chattts_client.options import (
    DEFAULT_MAX_MESSAGE_BYTES,
    DEFAULT_TARGET,
    ClientOptions,
    PathOrBytes,
)
from chattts_client.push_stream import PushStream
from chattts_client.resilience import (
    KEEPALIVE_TIME_MS,
    KEEPALIVE_TIMEOUT_MS,
    SERVICE_CONFIG,
    channel_options,
)
from chattts_proto.chattts.v1 import tts_pb2, tts_pb2_grpc

__all__ = [
    "DEFAULT_MAX_MESSAGE_BYTES",
    "DEFAULT_TARGET",
    "AsyncEventStream",
    "AsyncTTSClient",
    "EventStream",
    "KEEPALIVE_TIME_MS",
    "KEEPALIVE_TIMEOUT_MS",
    "SERVICE_CONFIG",
    "PathOrBytes",
    "SynthesisStats",
    "TTSClient",
]


def _stream_requests(
    config: tts_pb2.SynthesisConfig | None, texts: Iterable[StreamItem], flush_each: bool
) -> Iterator[tts_pb2.StreamingSynthesizeRequest]:
    yield tts_pb2.StreamingSynthesizeRequest(config=config or tts_pb2.SynthesisConfig())
    for text in texts:
        yield text_input(text, flush_each)


async def _stream_requests_async(
    config: tts_pb2.SynthesisConfig | None,
    texts: Iterable[StreamItem] | AsyncIterable[StreamItem],
    flush_each: bool,
) -> AsyncIterator[tts_pb2.StreamingSynthesizeRequest]:
    yield tts_pb2.StreamingSynthesizeRequest(config=config or tts_pb2.SynthesisConfig())
    if isinstance(texts, AsyncIterable):
        async for text in texts:
            yield text_input(text, flush_each)
    else:
        for text in texts:
            yield text_input(text, flush_each)


# --- measurement ----------------------------------------------------------------------------


@dataclass
class SynthesisStats:
    """Client-side figures of one call, updated as its events are iterated."""

    started_at: float  # time.perf_counter() when the call was started
    first_audio_at: float | None = None  # perf_counter() at the first audio chunk
    finished_at: float | None = None  # perf_counter() when the response stream ended or failed
    num_chunks: int = 0
    num_utterances: int = 0
    num_audio_bytes: int = 0
    audio_s: float = 0.0  # seconds of audio received

    def observe(self, event: Event, now: float | None = None) -> None:
        if isinstance(event, AudioChunkEvent):
            if self.first_audio_at is None:
                self.first_audio_at = time.perf_counter() if now is None else now
            self.num_chunks += 1
            self.num_audio_bytes += len(event.audio)
            self.audio_s += event.duration_s
        elif isinstance(event, UtteranceEndEvent):
            self.num_utterances += 1

    def finish(self, now: float | None = None) -> None:
        if self.finished_at is None:
            self.finished_at = time.perf_counter() if now is None else now

    @property
    def ttfa_ms(self) -> float | None:
        """Milliseconds from call start to the first audio chunk; None before it."""
        if self.first_audio_at is None:
            return None
        return (self.first_audio_at - self.started_at) * 1000.0

    @property
    def total_s(self) -> float:
        """Seconds from call start to the end of the stream (or to now, while it runs)."""
        end = time.perf_counter() if self.finished_at is None else self.finished_at
        return end - self.started_at

    @property
    def rtf(self) -> float | None:
        """Real-time factor: wall time / audio seconds (below 1 is faster than real time)."""
        return self.total_s / self.audio_s if self.audio_s > 0 else None


class EventStream(Iterator[Event]):
    """The events of one sync call, with `stats` and `cancel()`.

    Leaving a `with` block (or calling `cancel`) before the end cancels the call.
    """

    def __init__(self, call: Any, stats: SynthesisStats) -> None:
        self._call = call
        self.stats = stats

    def __iter__(self) -> EventStream:
        return self

    def __next__(self) -> Event:
        try:
            response = next(self._call)
        except BaseException:  # StopIteration at the end, grpc.RpcError on failure
            self.stats.finish()
            raise
        event = event_from_pb(response)
        self.stats.observe(event)
        return event

    def cancel(self) -> None:
        self._call.cancel()

    @property
    def call(self) -> Any:
        """The underlying grpc call (for metadata, code, details)."""
        return self._call

    def __enter__(self) -> EventStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self._call.cancel()  # no-op once the call has finished


class AsyncEventStream(AsyncIterator[Event]):
    """The events of one asyncio call, with `stats` and `cancel()`."""

    def __init__(self, call: Any, stats: SynthesisStats) -> None:
        self._call = call
        self._responses: AsyncIterator[Any] | None = None
        self.stats = stats

    def __aiter__(self) -> AsyncEventStream:
        return self

    async def __anext__(self) -> Event:
        if self._responses is None:
            self._responses = self._call.__aiter__()
        try:
            response = await self._responses.__anext__()
        except BaseException:  # StopAsyncIteration, grpc.aio.AioRpcError, CancelledError
            self.stats.finish()
            raise
        event = event_from_pb(response)
        self.stats.observe(event)
        return event

    def cancel(self) -> None:
        self._call.cancel()

    @property
    def call(self) -> Any:
        return self._call

    async def __aenter__(self) -> AsyncEventStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._call.cancel()


# --- channel --------------------------------------------------------------------------------


def _read(data: PathOrBytes | None) -> bytes | None:
    if data is None or isinstance(data, bytes):
        return data
    with open(data, "rb") as f:
        return f.read()


@dataclass(frozen=True)
class _ChannelSpec:
    """What both clients need to open a channel and authorise calls."""

    target: str
    options: tuple[tuple[str, Any], ...]
    credentials: grpc.ChannelCredentials | None  # None: plaintext
    metadata: tuple[tuple[str, str], ...] | None  # per-call metadata (token on plaintext)


def _channel_spec(opts: ClientOptions) -> _ChannelSpec:
    options: list[tuple[str, Any]] = [
        ("grpc.max_send_message_length", opts.max_message_bytes),
        ("grpc.max_receive_message_length", opts.max_message_bytes),
        *channel_options(opts.service_config, opts.keepalive),
    ]
    if opts.tls_server_name:
        options.append(("grpc.ssl_target_name_override", opts.tls_server_name))
    if not opts.tls:
        metadata = (("authorization", f"Bearer {opts.token}"),) if opts.token else None
        return _ChannelSpec(opts.target, tuple(options), None, metadata)
    credentials = grpc.ssl_channel_credentials(
        root_certificates=_read(opts.ca_cert),
        private_key=_read(opts.client_key),
        certificate_chain=_read(opts.client_cert),
    )
    if opts.token:
        # Call credentials travel only on secure channels; this sends
        # "authorization: Bearer <token>" through grpc.metadata_call_credentials.
        credentials = grpc.composite_channel_credentials(
            credentials, grpc.access_token_call_credentials(opts.token)
        )
    return _ChannelSpec(opts.target, tuple(options), credentials, None)


# --- clients --------------------------------------------------------------------------------


_Client = TypeVar("_Client", bound="_ClientBase")


class _ClientBase:
    """The constructor both clients share: it validates the options into a channel spec, then
    `_connect` makes (or defers) the channel. The keywords are the fields of `ClientOptions`;
    `from_options` takes the object."""

    def __init__(
        self,
        target: str = DEFAULT_TARGET,
        *,
        tls: bool = False,
        ca_cert: PathOrBytes | None = None,
        client_cert: PathOrBytes | None = None,
        client_key: PathOrBytes | None = None,
        token: str | None = None,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        tls_server_name: str | None = None,
        service_config: Mapping[str, Any] | None = SERVICE_CONFIG,
        keepalive: bool = True,
    ) -> None:
        self.options = ClientOptions(
            target,
            tls=tls,
            ca_cert=ca_cert,
            client_cert=client_cert,
            client_key=client_key,
            token=token,
            max_message_bytes=max_message_bytes,
            tls_server_name=tls_server_name,
            service_config=service_config,
            keepalive=keepalive,
        )
        self._spec = _channel_spec(self.options)
        self._connect()

    @classmethod
    def from_options(cls: type[_Client], options: ClientOptions | str) -> _Client:
        """A client for `options` (or for a plain "host:port" target)."""
        opts = ClientOptions.of(options)
        return cls(**{f.name: getattr(opts, f.name) for f in fields(opts)})

    def _connect(self) -> None:
        raise NotImplementedError


class TTSClient(_ClientBase):
    """Blocking client. Thread-safe; one channel for all calls.

    `ca_cert`, `client_cert` and `client_key` are PEM file paths or bytes; `ca_cert=None` with
    `tls=True` uses the system roots. `token` is sent as `authorization: Bearer <token>`.
    `tls_server_name` overrides the name checked against the server certificate.
    `service_config` (default `SERVICE_CONFIG`: round robin over the target's addresses, retry of
    UNAVAILABLE, UNKNOWN or CANCELLED before the first response, streams included) is the channel's gRPC
    service config; None turns retries off. `keepalive=False` sends no pings (see
    chattts_client.resilience).
    """

    def _connect(self) -> None:
        spec = self._spec
        if spec.credentials is None:
            self._channel = grpc.insecure_channel(spec.target, options=spec.options)
        else:
            self._channel = grpc.secure_channel(spec.target, spec.credentials, options=spec.options)
        self._stub = tts_pb2_grpc.TextToSpeechStub(self._channel)

    @property
    def channel(self) -> grpc.Channel:
        return self._channel

    def synthesize(
        self,
        text: str,
        *,
        config: tts_pb2.SynthesisConfig | None = None,
        timeout: float | None = None,
    ) -> EventStream:
        """Speak one text (Synthesize); iterate the result for audio and utterance ends."""
        request = tts_pb2.SynthesizeRequest(text=text, config=config)
        stats = SynthesisStats(started_at=time.perf_counter())
        call = self._stub.Synthesize(request, timeout=timeout, metadata=self._spec.metadata)
        return EventStream(call, stats)

    def stream(
        self,
        texts: Iterable[StreamItem],
        *,
        config: tts_pb2.SynthesisConfig | None = None,
        flush_each: bool = False,
        timeout: float | None = None,
    ) -> EventStream:
        """Speak text as it arrives (StreamingSynthesize).

        Sends `config`, then each text as `texts` yields it (grpc reads the iterable in its own
        thread, so it may block, e.g. on stdin), then half-closes. Responses can be iterated
        while texts are still being sent. `flush_each` asks the server to synthesize each text
        at once instead of waiting for a sentence end. A `Clear(text)` item is barge-in: the
        utterance being spoken stops (finish_reason "cleared") and `text` is spoken instead. A
        `Flush(text)` item sends `text` and synthesizes everything buffered at once.
        """
        stats = SynthesisStats(started_at=time.perf_counter())
        call = self._stub.StreamingSynthesize(
            _stream_requests(config, texts, flush_each),
            timeout=timeout,
            metadata=self._spec.metadata,
        )
        return EventStream(call, stats)

    def list_voices(self, *, timeout: float | None = None) -> list[VoiceInfo]:
        response = self._stub.ListVoices(
            tts_pb2.ListVoicesRequest(), timeout=timeout, metadata=self._spec.metadata
        )
        return [VoiceInfo(v.name, v.description) for v in response.voices]

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> TTSClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncTTSClient(_ClientBase):
    """asyncio client; same constructor as `TTSClient`.

    The channel is created on first use inside the running loop, so the client may be built
    outside it; use one client from one event loop only.
    """

    def _connect(self) -> None:
        # The channel is made on first use, inside the running loop (see _get_stub).
        self._channel: grpc.aio.Channel | None = None
        self._stub: tts_pb2_grpc.TextToSpeechStub | None = None

    def _get_stub(self) -> tts_pb2_grpc.TextToSpeechStub:
        if self._stub is None:
            asyncio.get_running_loop()  # fail here, not deep in grpc, when called outside a loop
            spec = self._spec
            if spec.credentials is None:
                self._channel = grpc.aio.insecure_channel(spec.target, options=spec.options)
            else:
                self._channel = grpc.aio.secure_channel(
                    spec.target, spec.credentials, options=spec.options
                )
            self._stub = tts_pb2_grpc.TextToSpeechStub(self._channel)
        return self._stub

    def synthesize(
        self,
        text: str,
        *,
        config: tts_pb2.SynthesisConfig | None = None,
        timeout: float | None = None,
    ) -> AsyncEventStream:
        """Speak one text; `async for` over the result. Call from inside the event loop."""
        stub = self._get_stub()
        request = tts_pb2.SynthesizeRequest(text=text, config=config)
        stats = SynthesisStats(started_at=time.perf_counter())
        call = stub.Synthesize(request, timeout=timeout, metadata=self._spec.metadata)
        return AsyncEventStream(call, stats)

    def stream(
        self,
        texts: Iterable[StreamItem] | AsyncIterable[StreamItem],
        *,
        config: tts_pb2.SynthesisConfig | None = None,
        flush_each: bool = False,
        timeout: float | None = None,
    ) -> AsyncEventStream:
        """Speak text as it arrives; see `TTSClient.stream`.

        A plain iterable is read on the event loop, so pass an async iterable for a source that
        blocks.
        """
        stub = self._get_stub()
        stats = SynthesisStats(started_at=time.perf_counter())
        call = stub.StreamingSynthesize(
            _stream_requests_async(config, texts, flush_each),
            timeout=timeout,
            metadata=self._spec.metadata,
        )
        return AsyncEventStream(call, stats)

    def open_stream(
        self,
        *,
        config: tts_pb2.SynthesisConfig | None = None,
        timeout: float | None = None,
    ) -> PushStream:
        """Open a StreamingSynthesize call to push text into (`PushStream.push`, `flush`,
        `clear`, `end_input`) while iterating its events. Call from inside the event loop."""
        return PushStream(lambda items: self.stream(items, config=config, timeout=timeout))

    async def list_voices(self, *, timeout: float | None = None) -> list[VoiceInfo]:
        response = await self._get_stub().ListVoices(
            tts_pb2.ListVoicesRequest(), timeout=timeout, metadata=self._spec.metadata
        )
        return [VoiceInfo(v.name, v.description) for v in response.voices]

    async def explain(
        self,
        error: grpc.RpcError,
        *,
        config: tts_pb2.SynthesisConfig | None = None,
        timeout: float = 5.0,
    ) -> grpc.RpcError:
        """The error a failed stream really ended with.

        When the server ends a streaming call while a request is being written (a refused
        token, a bad config, a full server), grpc.aio reports INTERNAL "Internal error from
        Core" in place of the server's status (grpc/grpc#36066). Two cheap probes on the same
        channel and credentials then show the real refusal: ListVoices (reachability, auth),
        and a stream of the failed call's `config` alone (validation and admission: it is
        checked, then admitted or refused like any stream, and ends at once without
        synthesizing; its one write precedes any refusal). Any other error, or one the probes
        do not reproduce, is returned as it is.
        """
        if not (
            isinstance(error, grpc.aio.AioRpcError)
            and error.code() == grpc.StatusCode.INTERNAL
            and error.details() == "Internal error from Core"
        ):
            return error
        try:
            await self.list_voices(timeout=timeout)
            async for _ in self.stream([], config=config, timeout=timeout):
                pass
        except grpc.RpcError as probe:
            return probe
        return error

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close()
            self._channel = None
            self._stub = None

    async def __aenter__(self) -> AsyncTTSClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
