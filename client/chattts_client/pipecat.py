"""Pipecat TTS service over one ChatTTS StreamingSynthesize call per conversation.

Install with `pip install "chattts-stream[pipecat]"`. The service streams every LLM text frame
to the server as it comes (Pipecat's TOKEN aggregation: the server's text release policy decides
when speech starts), flushes at the end of the LLM turn, and on an interruption sends
`TextInput.clear` on the same stream: barge-in stops the utterance being generated within one
engine step and costs no reconnect.

Turn boundaries. The stream is shared by all turns, and the server numbers utterances, not
turns, so the service lets one turn at a time own the stream: text of the next turn waits (in
the service) until the previous one has *settled*. A turn settles when its end-of-turn flush is
sent, its last utterance has ended and no further utterance starts within a short window (about
twice the server's time to first audio, from `UtteranceEnd`); an interrupted turn settles at
its "cleared" `UtteranceEnd`, or after the same window when nothing was being spoken. Audio
that arrives for an interrupted turn is dropped here, and Pipecat drops what it still holds for
the interrupted audio context, so none of it leaks into the next turn. Frames: one
TTSStartedFrame when a turn's first text is sent (pushed by the base class, which also starts
the TTFB timer), TTSAudioRawFrames at the pipeline's output rate (the server resamples), and a
TTSStoppedFrame when the turn settles.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import Any

import grpc
from loguru import logger
from pipecat.frames.frames import (
    CancelFrame,
    EndFrame,
    Frame,
    StartFrame,
    TTSAudioRawFrame,
    TTSStartedFrame,
    TTSStoppedFrame,
)
from pipecat.services.settings import TTSSettings
from pipecat.services.tts_service import TextAggregationMode, TTSService

from chattts_client.client import AsyncTTSClient
from chattts_client.messages import AudioChunkEvent, UtteranceEndEvent
from chattts_client.options import DEFAULT_TARGET, ClientOptions, SynthesisOptions
from chattts_client.push_stream import PushStream

__all__ = ["ChatTTSTTSService"]

# A turn is over once no new utterance has started for this long after its last one ended:
# SETTLE_TTFA_FACTOR times the slowest time to first audio seen on the stream, within bounds.
SETTLE_TTFA_FACTOR = 2.0
SETTLE_MIN_S = 0.3
SETTLE_MAX_S = 2.0
# The time to first audio assumed before the stream has measured one (a cold first utterance).
INITIAL_TTFA_S = 1.0
# A flushed turn whose last text is in no utterance that has started yet waits this long for one
# (a busy CPU server can take seconds); a turn whose text makes no speech at all (only a code
# block, say) ends after it.
UNSPOKEN_TIMEOUT_S = 8.0


@dataclass
class _Turn:
    """The turn (a Pipecat audio context) that owns the stream, or one waiting for it."""

    context_id: str
    texts: list[str] = field(default_factory=list)  # held while another turn owns the stream
    flushed: bool = False  # the end-of-turn flush was asked for
    unspoken: bool = False  # text was sent after the last utterance we heard start


class ChatTTSTTSService(TTSService):  # type: ignore[misc]
    """Pipecat TTS service for a chattts-stream server.

    `client` says where the server is (a "host:port" target, or `ClientOptions` for TLS and
    tokens); `synthesis` the voice, speed and sampling of the conversation's stream (its
    `sample_rate_hz`, when set, is the service's output rate; otherwise the pipeline's).
    `connect_timeout_s` bounds the check at start that the server answers. `settle_s` fixes
    the end-of-turn window instead of deriving it from the server's time to first audio.
    Other keywords go to Pipecat's `TTSService`.
    """

    def __init__(
        self,
        client: ClientOptions | str = DEFAULT_TARGET,
        synthesis: SynthesisOptions | None = None,
        *,
        connect_timeout_s: float = 5.0,
        settle_s: float | None = None,
        **kwargs: Any,
    ) -> None:
        synthesis = synthesis or SynthesisOptions()
        # Pipecat ends an audio context that gets no audio for this long; our turns end by the
        # stream's events, and a loaded CPU server can take longer than the default 3 s to its
        # first audio, so the framework's timer is only a backstop here.
        kwargs.setdefault("stop_frame_timeout_s", 10.0)
        # The pipeline's output rate, unless the options name one.
        kwargs.setdefault("sample_rate", synthesis.sample_rate_hz or None)
        # The voice is part of the stream's config: it is fixed for the service's lifetime.
        voice = synthesis.voice
        settings = TTSSettings(
            model="ChatTTS", voice=None if voice is None else str(voice), language=None
        )
        # Tokens go to the server as they come; its release policy decides when speech starts.
        kwargs.setdefault("text_aggregation_mode", TextAggregationMode.TOKEN)
        super().__init__(
            push_start_frame=True,
            push_stop_frames=True,
            settings=settings,
            **kwargs,
        )
        self._options = ClientOptions.of(client)
        self._client = AsyncTTSClient.from_options(self._options)
        self._synthesis = synthesis
        self._connect_timeout_s = connect_timeout_s
        self._fixed_settle_s = settle_s
        self._max_ttfa_s = INITIAL_TTFA_S
        self._measured_ttfa = False
        self._stream: PushStream | None = None
        self._receive_task: asyncio.Task[None] | None = None
        self._settle_task: asyncio.Task[None] | None = None
        self._live: _Turn | None = None  # the turn whose events the stream carries
        self._waiting: list[_Turn] = []  # turns whose text waits for the stream
        self._draining = False  # a clear was sent; events of the cleared turn are dropped
        self._open_utterance: int | None = None  # audio seen, UtteranceEnd not yet
        self._failed_context: str | None = None  # the turn whose stream failed

    def can_generate_metrics(self) -> bool:
        return True

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self, frame: StartFrame) -> None:
        await super().start(frame)
        try:
            await self._client.list_voices(timeout=self._connect_timeout_s)
        except grpc.RpcError as exc:
            message = _describe(exc, self._options.target)
            await self.push_error(error_msg=message, exception=exc)
            await self._call_event_handler("on_connection_error", message)
            return
        await self._open_stream()
        await self._call_event_handler("on_connected")

    async def stop(self, frame: EndFrame) -> None:
        await super().stop(frame)  # returns once every audio context has played
        await self._close_stream(cancel=False)
        await self._client.close()

    async def cancel(self, frame: CancelFrame) -> None:
        await super().cancel(frame)
        await self._close_stream(cancel=True)
        await self._client.close()

    async def _open_stream(self) -> None:
        self._reset_turns()
        config = self._synthesis.to_config(sample_rate_hz=self.sample_rate)
        self._stream = self._client.open_stream(config=config)
        self._receive_task = self.create_task(self._receive(self._stream), "chattts-receive")

    async def _close_stream(self, cancel: bool) -> None:
        settle, self._settle_task = self._settle_task, None
        if settle is not None:
            await self.cancel_task(settle)
        if self._stream is not None:
            if cancel:
                self._stream.cancel()
            else:
                self._stream.end_input()  # half-close: the server ends the call
        if self._receive_task is not None:
            if cancel:
                await self.cancel_task(self._receive_task)
            else:
                try:
                    await asyncio.wait_for(asyncio.shield(self._receive_task), 5.0)
                except TimeoutError:
                    await self.cancel_task(self._receive_task)
        self._stream = self._receive_task = None

    def _reset_turns(self) -> None:
        self._cancel_settle()
        self._live = None
        self._waiting.clear()
        self._draining = False
        self._open_utterance = None

    # -- text in -------------------------------------------------------------------------------

    async def run_tts(self, text: str, context_id: str) -> AsyncGenerator[Frame | None, None]:
        if self._stream is None:
            if context_id == self._failed_context:
                yield None  # this turn's stream failed; the error was reported once
                return
            await self._open_stream()
        turn = self._turn(context_id)
        if turn is self._live:
            self._send_text(turn, text)
        else:
            turn.texts.append(text)
        await self.start_tts_usage_metrics(text)
        yield None  # audio arrives through _receive

    async def flush_audio(self, context_id: str | None = None) -> None:
        turn = self._find(context_id) if context_id else self._live
        if turn is None or turn.flushed:
            return
        turn.flushed = True
        if turn is self._live:
            self._send_flush()
            if self._open_utterance is None:
                self._arm_turn_end(turn)  # settle unless audio comes

    async def on_audio_context_interrupted(self, context_id: str) -> None:
        await self.stop_all_metrics()
        self._waiting = [t for t in self._waiting if t.context_id != context_id]
        live = self._live
        if live is not None and live.context_id == context_id:
            if self._stream is not None:
                self._stream.clear()
            self._live = None
            self._draining = True
            logger.debug(f"{self}: barge-in, cleared turn {context_id}")
            if self._open_utterance is None:
                self._arm_settle()  # nothing being spoken: no "cleared" end will come
        await super().on_audio_context_interrupted(context_id)

    def _turn(self, context_id: str) -> _Turn:
        turn = self._find(context_id)
        if turn is None:
            turn = _Turn(context_id)
            if self._live is None and not self._draining:
                self._live = turn
            else:
                self._waiting.append(turn)
        return turn

    def _find(self, context_id: str) -> _Turn | None:
        if self._live is not None and self._live.context_id == context_id:
            return self._live
        return next((t for t in self._waiting if t.context_id == context_id), None)

    def _send_text(self, turn: _Turn, text: str) -> None:
        if text.strip():
            turn.unspoken = True
        if self._stream is not None:
            self._stream.push(text)

    def _send_flush(self) -> None:
        if self._stream is not None:
            self._stream.flush()

    # -- events out ------------------------------------------------------------------------

    async def _receive(self, stream: PushStream) -> None:
        try:
            async for event in stream:
                if isinstance(event, AudioChunkEvent):
                    await self._on_audio(event)
                elif isinstance(event, UtteranceEndEvent):
                    await self._on_utterance_end(event)
        except grpc.RpcError as error:
            if error.code() == grpc.StatusCode.CANCELLED and self._stream is None:
                return  # we closed it
            exc = await self._client.explain(error)
            message = _describe(exc, self._options.target)
            await self.push_error(error_msg=message, exception=exc)
            # The next turn opens a new stream; the rest of this one is not retried token by
            # token (each would fail the same way against a server that is down).
            self._stream = None
            failed = self._live
            self._failed_context = None if failed is None else failed.context_id
            if failed is not None:
                await self._end_turn(failed)
            self._reset_turns()

    async def _on_audio(self, event: AudioChunkEvent) -> None:
        starts = event.utterance_index != self._open_utterance
        self._open_utterance = event.utterance_index
        if self._draining:
            return  # audio of a cleared turn
        self._cancel_settle()
        if self._live is None:
            # A turn settled too early (its next utterance was slower than the window): its
            # audio is kept, in a context of its own.
            self._live = _Turn(str(uuid.uuid4()), flushed=True)
        if starts:
            self._live.unspoken = False  # text sent before this start may be in it
        if not self.audio_context_available(self._live.context_id):
            # New, or ended by Pipecat's idle timer while the server was slow: audio is kept.
            await self.create_audio_context(self._live.context_id)
            await self.append_to_audio_context(
                self._live.context_id, TTSStartedFrame(context_id=self._live.context_id)
            )
        frame = TTSAudioRawFrame(
            audio=event.audio,
            sample_rate=event.sample_rate_hz,
            num_channels=1,
            context_id=self._live.context_id,
        )
        await self.append_to_audio_context(self._live.context_id, frame)

    async def _on_utterance_end(self, event: UtteranceEndEvent) -> None:
        self._open_utterance = None
        if event.finish_reason != "cleared":
            ttfa_s = event.time_to_first_audio_s
            self._max_ttfa_s = max(self._max_ttfa_s, ttfa_s) if self._measured_ttfa else ttfa_s
            self._measured_ttfa = True
        if self._draining:
            if event.finish_reason == "cleared":
                await self._drained()  # clear dropped everything queued after it
            else:
                self._arm_settle()
        elif self._live is not None and self._live.flushed:
            self._arm_turn_end(self._live)

    def _settle_s(self) -> float:
        if self._fixed_settle_s is not None:
            return self._fixed_settle_s
        return min(SETTLE_MAX_S, max(SETTLE_MIN_S, SETTLE_TTFA_FACTOR * self._max_ttfa_s))

    def _arm_settle(self, delay_s: float | None = None) -> None:
        self._cancel_settle()
        delay_s = self._settle_s() if delay_s is None else delay_s
        self._settle_task = self.create_task(self._settle(delay_s), "chattts-settle")

    def _arm_turn_end(self, turn: _Turn) -> None:
        """Arm the end of a flushed turn with nothing being spoken: the settle window, or longer
        while some of its text is in no utterance heard so far."""
        self._arm_settle(max(UNSPOKEN_TIMEOUT_S, self._settle_s()) if turn.unspoken else None)

    def _cancel_settle(self) -> None:
        task, self._settle_task = self._settle_task, None
        if task is not None and task is not asyncio.current_task():
            task.cancel()

    async def _settle(self, delay_s: float) -> None:
        await asyncio.sleep(delay_s)
        if self._open_utterance is not None:
            return  # an utterance started meanwhile; its end re-arms
        if self._draining:
            await self._drained()
        elif self._live is not None and self._live.flushed:
            await self._end_turn(self._live)

    async def _end_turn(self, turn: _Turn) -> None:
        """The turn's audio is complete: stop frame, close its context, hand the stream on."""
        if self._live is turn:
            self._live = None
        await self.append_to_audio_context(
            turn.context_id, TTSStoppedFrame(context_id=turn.context_id)
        )
        await self.remove_audio_context(turn.context_id)
        self._next_turn()

    async def _drained(self) -> None:
        self._cancel_settle()
        self._draining = False
        self._next_turn()

    def _next_turn(self) -> None:
        if self._live is not None or self._draining or not self._waiting:
            return
        turn = self._live = self._waiting.pop(0)
        for text in turn.texts:
            self._send_text(turn, text)
        turn.texts.clear()
        if turn.flushed:
            self._send_flush()
            self._arm_turn_end(turn)


def _describe(exc: grpc.RpcError, target: str) -> str:
    code = exc.code() if hasattr(exc, "code") else None
    details = exc.details() if hasattr(exc, "details") else str(exc)
    if code == grpc.StatusCode.UNAVAILABLE:
        return f"ChatTTS server at {target} is unreachable or not serving: {details}"
    name = code.name if code is not None else "error"
    return f"ChatTTS server at {target}: {name}: {details}"
