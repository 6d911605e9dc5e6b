"""LiveKit Agents TTS over a chattts-stream server.

Install with `pip install "chattts-stream[livekit]"`, then `session = AgentSession(tts=
chattts_client.livekit.TTS("localhost:50051", SynthesisOptions(voice="seed:1234")), ...)`.

`TTS.stream()` follows the framework's current model, one SynthesizeStream per segment: the
stream opens one StreamingSynthesize call (a `PushStream`) at its first text; `push_text` sends
each fragment as it comes (the server's text release policy decides when speech starts),
`flush` sends `TextInput.flush`, `end_input` half-closes the call, and the segment ends when the
server ends the call. Closing the stream early (`aclose`, or the agent being interrupted)
cancels the call, which frees the server's slot within one engine step. `TTS.synthesize()` uses
Synthesize.

Aligned transcripts: every call asks for word timing, and each timed word goes to the framework
as a `TimedString` of the caller's own text (with its punctuation), in seconds from the
segment's start. With `AgentSession(use_tts_aligned_transcript=True)` the agent's transcript
then follows its voice word by word, and an interrupted reply keeps only the words played.

Prompts that change (navigation). LiveKit Agents has no notion of revising text already handed
to a TTS: its `SynthesizeStream` takes `push_text`, `flush` and `end_input`, and an agent changes
what it says by interrupting a speech and starting another. For an app that drives `TTS.stream()`
itself, this adapter's stream adds `segment(name, text)` and `replace(name, text, if_started)`
(`TextInput.segment` / `TextInput.replace`: "In 300 m, turn left" becomes "In 100 m, turn left"
with no interruption, the audio staying one stream); `AgentSession` never calls them. Each
revision's `SegmentEndEvent` is kept in the stream's `segment_ends`. Lexicons
(`SynthesisOptions.lexicons`) go with every call, streamed or not.

Audio is raw 16-bit PCM at `SynthesisOptions.sample_rate_hz` (the server resamples; the model's
own rate by default). gRPC failures become the framework's API errors, so its retry and
FallbackAdapter logic applies: UNAVAILABLE is an `APIConnectionError`, DEADLINE_EXCEEDED an
`APITimeoutError`, the rest `APIStatusError`s with the HTTP status of the same meaning (400,
401, 403, 429, 500).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any, cast

import grpc
from livekit.agents import (
    DEFAULT_API_CONNECT_OPTIONS,
    APIConnectionError,
    APIConnectOptions,
    APIError,
    APIStatusError,
    APITimeoutError,
    tts,
    utils,
)
from livekit.agents.types import TimedString

from chattts_client.caller_words import CallerWord, CallerWords
from chattts_client.channel import DEFAULT_TARGET, ClientOptions
from chattts_client.client import AsyncTTSClient, describe_error
from chattts_client.config import SynthesisOptions
from chattts_client.messages import (
    MODEL_SAMPLE_RATE_HZ,
    AudioChunkEvent,
    Replace,
    Segment,
    SegmentEndEvent,
    WordTimingsEvent,
)
from chattts_client.push_stream import PushStream

__all__ = ["TTS", "api_error"]

# HTTP statuses of the same meaning, so the framework's retry rules (4xx but 408/429/499 are
# final) read them right.
_HTTP_STATUS = {
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.FAILED_PRECONDITION: 400,
    grpc.StatusCode.OUT_OF_RANGE: 400,
    grpc.StatusCode.UNAUTHENTICATED: 401,
    grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.CANCELLED: 499,
    grpc.StatusCode.UNIMPLEMENTED: 501,
}


def api_error(exc: grpc.RpcError, target: str) -> APIError:
    """The LiveKit API error for a failed call."""
    code = exc.code() if hasattr(exc, "code") else grpc.StatusCode.UNKNOWN
    message = describe_error(exc, target)
    if code == grpc.StatusCode.UNAVAILABLE:
        return APIConnectionError(message)
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return APITimeoutError(message)
    details = exc.details() if hasattr(exc, "details") else str(exc)
    return APIStatusError(message, status_code=_HTTP_STATUS.get(code, 500), body=details)


def _push_words(emitter: tts.AudioEmitter, words: list[CallerWord]) -> None:
    """The words as the framework's aligned transcript: the caller's text, in seconds from the
    segment's start (a segment is one call, whose audio starts at sample 0)."""
    if words:
        emitter.push_timed_transcript(
            [TimedString(w.text, start_time=w.start_s, end_time=w.end_s) for w in words]
        )


class TTS(tts.TTS):
    """ChatTTS for LiveKit Agents, streaming.

    `client` says where the server is (a "host:port" target, or `ClientOptions` for TLS and
    tokens); `synthesis` the voice (a seed, "seed:N", "emb:..." or a preset name), speed,
    sampling and `sample_rate_hz` (0: the model's own rate) of every call.
    """

    def __init__(
        self,
        client: ClientOptions | str = DEFAULT_TARGET,
        synthesis: SynthesisOptions | None = None,
    ) -> None:
        synthesis = synthesis or SynthesisOptions()
        sample_rate = synthesis.sample_rate_hz or MODEL_SAMPLE_RATE_HZ
        super().__init__(
            # Word timing is always asked for: the agent's transcript can follow the voice.
            capabilities=tts.TTSCapabilities(streaming=True, aligned_transcript=True),
            sample_rate=sample_rate,
            num_channels=1,
        )
        self._options = ClientOptions.of(client)
        self._config = synthesis.to_config(sample_rate_hz=sample_rate, word_timing=True)
        # One channel per event loop: grpc.aio channels belong to the loop that made them.
        self._clients: dict[asyncio.AbstractEventLoop, AsyncTTSClient] = {}

    @property
    def _target(self) -> str:
        return self._options.target

    @property
    def model(self) -> str:
        return "ChatTTS"

    @property
    def provider(self) -> str:
        return "chattts-stream"

    def _client(self) -> AsyncTTSClient:
        loop = asyncio.get_running_loop()
        client = self._clients.get(loop)
        if client is None:
            client = self._clients[loop] = AsyncTTSClient.from_options(self._options)
        return client

    def synthesize(
        self, text: str, *, conn_options: APIConnectOptions = DEFAULT_API_CONNECT_OPTIONS
    ) -> ChunkedStream:
        return ChunkedStream(tts=self, input_text=text, conn_options=conn_options)

    def stream(
        self, *, conn_options: APIConnectOptions = DEFAULT_API_CONNECT_OPTIONS
    ) -> SynthesizeStream:
        return SynthesizeStream(tts=self, conn_options=conn_options)

    async def aclose(self) -> None:
        clients, self._clients = self._clients, {}
        for client in clients.values():
            await client.close()


class ChunkedStream(tts.ChunkedStream):
    """One text through Synthesize."""

    def __init__(self, *, tts: TTS, input_text: str, conn_options: APIConnectOptions) -> None:
        super().__init__(tts=tts, input_text=input_text, conn_options=conn_options)
        self._chattts = tts

    async def _run(self, output_emitter: tts.AudioEmitter) -> None:
        owner = self._chattts
        output_emitter.initialize(
            request_id=utils.shortuuid(),
            sample_rate=owner.sample_rate,
            num_channels=1,
            mime_type="audio/pcm",
        )
        events = owner._client().synthesize(self.input_text, config=owner._config)
        words = CallerWords(lambda: self.input_text)
        try:
            async for event in events:
                if isinstance(event, AudioChunkEvent):
                    output_emitter.push(event.audio)
                elif isinstance(event, WordTimingsEvent):
                    _push_words(output_emitter, words.take(event))
        except grpc.RpcError as exc:
            raise api_error(
                await owner._client().explain(exc, config=owner._config), owner._target
            ) from None
        finally:
            events.cancel()  # no-op once the call has ended; cancels it when we are cancelled
        # No flush here: the framework's end_input flushes and marks the last frame final (a
        # flush first would make it append 10 ms of silence as the final marker).


class SynthesizeStream(tts.SynthesizeStream):
    """One segment: one StreamingSynthesize call.

    Besides LiveKit's interface, `segment` and `replace` send a named prompt and its
    revisions (see the module's docstring); `segment_ends` holds each revision's
    `SegmentEndEvent` as it comes.
    """

    def __init__(self, *, tts: TTS, conn_options: APIConnectOptions) -> None:
        super().__init__(tts=tts, conn_options=conn_options)
        self._chattts = tts
        self.segment_ends: list[SegmentEndEvent] = []

    def segment(self, name: str, text: str, expires_in_ms: int = 0) -> None:
        """Speak `text` as the prompt `name` (`TextInput.segment`, then a flush: text pushed
        after it is not part of it), which `replace` may revise; `expires_in_ms` (0: no limit)
        is the most it may wait for its first audio, or it is not spoken."""
        self._send_item(Segment(name, text, expires_in_ms))

    def replace(
        self, name: str, text: str, if_started: str = "finish", expires_in_ms: int = 0
    ) -> None:
        """The prompt `name` now says `text` (`TextInput.replace`). Not started yet: only
        `text` is spoken, in its place. Speaking: `if_started` "finish" (it ends, then `text`),
        "cut" (it stops at its next word boundary, then `text`) or "drop_new" (`text` is not
        spoken). Ended, or a name never sent: `text` is spoken after what was sent before."""
        self._send_item(Replace(name, text, if_started, expires_in_ms))

    def _send_item(self, item: Segment | Replace) -> None:
        if self._input_ch.closed:
            return  # as push_text: input has ended
        # In LiveKit's input channel, in order with the text and flushes, and kept with them for
        # the framework to replay when it retries the stream.
        self._input_ch.send_nowait(cast(Any, item))
        self._input_buffer.append(cast(Any, item))

    async def _run(self, output_emitter: tts.AudioEmitter) -> None:
        owner = self._chattts
        request_id = utils.shortuuid()
        output_emitter.initialize(
            request_id=request_id,
            sample_rate=owner.sample_rate,
            num_channels=1,
            mime_type="audio/pcm",
            stream=True,
        )
        first = await self._next_text()
        if first is None:
            return  # input ended with no text: no call, no segment
        stream = owner._client().open_stream(config=owner._config)
        words = CallerWords(lambda: stream.timeline.text)
        self.segment_ends.clear()  # a retry replays the whole input on a new call
        self._send(stream, first)
        self._mark_started()  # the first text goes to the server now (TTFB counts from here)

        async def send() -> None:
            async for data in self._input_ch:
                self._send(stream, data)
            stream.end_input()  # the server finishes and ends the call

        output_emitter.start_segment(segment_id=request_id)
        sender = asyncio.create_task(send(), name="chattts-send")
        try:
            async for event in stream:
                if isinstance(event, AudioChunkEvent):
                    output_emitter.push(event.audio)
                elif isinstance(event, WordTimingsEvent):
                    _push_words(output_emitter, words.take(event))
                elif isinstance(event, SegmentEndEvent):
                    self.segment_ends.append(event)
        except grpc.RpcError as exc:
            raise api_error(
                await owner._client().explain(exc, config=owner._config), owner._target
            ) from None
        finally:
            stream.cancel()  # closed early (aclose, interruption): the server sees CANCELLED
            sender.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sender
        output_emitter.end_segment()

    def _send(self, stream: PushStream, data: object) -> None:
        """One item of the input channel onto the call."""
        if isinstance(data, self._FlushSentinel):
            stream.flush()
        elif isinstance(data, Segment):
            stream.segment(data.name, data.text, data.expires_in_ms)
            stream.flush()  # the prompt is its text alone
        elif isinstance(data, Replace):
            stream.replace(data.name, data.text, data.if_started, data.expires_in_ms)
        elif isinstance(data, str) and data:
            stream.push(data)

    async def _next_text(self) -> str | Segment | Replace | None:
        """The segment's first text or prompt (flushes before it have nothing to flush); None
        when the input ends without any."""
        data: object
        async for data in self._input_ch:
            if isinstance(data, Segment | Replace) or (isinstance(data, str) and data):
                return data
        return None  # flushes alone: nothing buffered to flush
