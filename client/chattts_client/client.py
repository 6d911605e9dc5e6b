"""Sync and asyncio clients for the chattts.v1.TextToSpeech service.

Responses are converted once, in `event_from_pb`, into thin dataclasses; errors are left as
`grpc.RpcError` (for the asyncio client `grpc.aio.AioRpcError`, a subclass) so callers see the
real status code.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterable, AsyncIterator, Iterable, Iterator, Mapping
from dataclasses import fields
from typing import Any, TypeVar

import grpc

from chattts_client.calls import AsyncEventStream, EventStream, SynthesisStats
from chattts_client.channel import (
    DEFAULT_MAX_MESSAGE_BYTES,
    DEFAULT_TARGET,
    ClientOptions,
    PathOrBytes,
    channel_spec,
)
from chattts_client.messages import StreamItem, VoiceInfo, text_input
from chattts_client.push_stream import PushStream
from chattts_client.resilience import SERVICE_CONFIG
from chattts_client.resuming import ResumingEventStream
from chattts_proto.chattts.v1 import tts_pb2, tts_pb2_grpc


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
        self._spec = channel_spec(self.options)
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

    The keywords are the fields of `ClientOptions` (TLS, token, retries, keepalive: see there).
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
        self._cancelling: set[asyncio.Future[None]] = set()

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
        resumable: bool = True,
    ) -> PushStream:
        """Open a StreamingSynthesize call to push text into (`PushStream.push`, `flush`,
        `clear`, `end_input`) while iterating its events. Call from inside the event loop.

        `resumable` (the default): when the connection drops, the stream is resumed on a new
        call from what was received, with a `ResumedEvent` and nothing lost or repeated; where
        its server is gone, it goes on as a new stream from the first word not wholly heard
        (chattts_client/resuming.py); `timeout` bounds the whole stream, over its calls."""
        if not resumable:
            return PushStream(lambda items: self.stream(items, config=config, timeout=timeout))
        stub = self._get_stub()
        deadline = None if timeout is None else time.monotonic() + timeout

        def start_call(
            requests: AsyncIterator[tts_pb2.StreamingSynthesizeRequest], resuming: str, retry: bool
        ) -> Any:
            left = None if deadline is None else max(deadline - time.monotonic(), 0.001)
            metadata = tuple(self._spec.metadata or ())
            if resuming:
                metadata += (("chattts-stream-id", resuming),)
            return stub.StreamingSynthesize(
                requests, timeout=left, metadata=metadata or None, wait_for_ready=retry
            )

        def open_call(items: AsyncIterable[StreamItem]) -> ResumingEventStream:
            stats = SynthesisStats(started_at=time.perf_counter())
            config_ = config or tts_pb2.SynthesisConfig()
            return ResumingEventStream(start_call, config_, items, stats, self._track_cancel)

        return PushStream(open_call)

    def _track_cancel(self, ending: asyncio.Future[None]) -> None:
        """A resumable stream's cancel on its way to the server, kept until it lands."""
        self._cancelling.add(ending)
        ending.add_done_callback(self._cancelling.discard)

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
        """Close the channel, once every resumable stream cancelled on it has told its server
        (`CancelStream`: else the server would keep its slot for the resume window)."""
        await asyncio.gather(*self._cancelling)
        if self._channel is not None:
            await self._channel.close()
            self._channel = None
            self._stub = None

    async def __aenter__(self) -> AsyncTTSClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def describe_error(exc: grpc.RpcError, target: str) -> str:
    """A failed call's error in a sentence that names the server (what the adapters report)."""
    code = exc.code() if hasattr(exc, "code") else None
    details = exc.details() if hasattr(exc, "details") else str(exc)
    if code == grpc.StatusCode.UNAVAILABLE:
        return f"ChatTTS server at {target} is unreachable or not serving: {details}"
    name = code.name if code is not None else "UNKNOWN"
    return f"ChatTTS server at {target}: {name}: {details}"
