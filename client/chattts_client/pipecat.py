"""Pipecat TTS service over one ChatTTS StreamingSynthesize call per conversation.

Install with `pip install "chattts-stream[pipecat]"`. The service streams every LLM text frame
to the server as it comes (Pipecat's TOKEN aggregation: the server's text release policy decides
when speech starts), ends each turn's text with a mark, and on an interruption sends
`TextInput.clear` on the same stream: barge-in stops the utterance being generated within one
engine step and costs no reconnect.

Turn boundaries come from the stream itself: each turn's text is ended by a mark, whose answer
ends the turn (TTSStoppedFrame); an interruption clears the stream with a mark at the cut, and
the cleared turns' events are dropped until it comes back (chattts_client.pipecat_turns).

Words. The stream asks for word timing, and each word the server times is handed to Pipecat
(`add_word_timestamps`) in the caller's own text, timed from the turn's first audio sample: the
framework then emits TTSTextFrames as the words are played, and an interrupted turn keeps in the
LLM context only the words heard. Frames: one TTSStartedFrame when a turn's first text is sent
(pushed by the base class, which also starts the TTFB timer), TTSAudioRawFrames at the
pipeline's output rate (the server resamples), word TTSTextFrames, and a TTSStoppedFrame at the
turn's mark.

Prompts that change (navigation). A `ChatTTSSegmentFrame` is a TTSSpeakFrame with a name: its
text goes out as a named segment (`TextInput.segment`, then the turn's mark), and a later frame
of the same name revises it (`TextInput.replace`, with the frame's `if_started`), with no
InterruptionFrame: "In 300 m, turn left" becomes "In 100 m, turn left". A revision of a prompt
that has not ended (a SegmentEnd of it is still to come) is heard in the prompt's own turn and
audio context: the server puts the new text right after the old one, before the turn's mark,
so its audio comes inside that turn, after what the server still sent of the old text (up to
its next word boundary, for "cut"). No context is opened for the revision, so one never spoken
(replaced again, "drop_new", expired) adds no frames. Only where the old text ended on the
server before the replace reached it is the new text queued at the end: the revision's own
mark, sent after it, then ends the stretch its audio comes in, in a context opened at its first
audio. A revision of a prompt that has ended is a turn like any speak frame's. Each revision's
`SegmentEndEvent` goes to the `on_segment_end` event handler (service, name, event).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Any

import grpc
from loguru import logger
from pipecat.frames.frames import (
    CancelFrame,
    EndFrame,
    Frame,
    InterruptionFrame,
    StartFrame,
    TTSAudioRawFrame,
    TTSSpeakFrame,
    TTSStartedFrame,
    TTSStoppedFrame,
)
from pipecat.processors.frame_processor import FrameDirection
from pipecat.services.settings import TTSSettings
from pipecat.services.tts_service import TextAggregationMode, TTSService

from chattts_client.caller_words import CallerWords
from chattts_client.channel import DEFAULT_TARGET, ClientOptions
from chattts_client.client import AsyncTTSClient, describe_error
from chattts_client.config import SynthesisOptions
from chattts_client.messages import (
    IF_STARTED,
    AudioChunkEvent,
    MarkEvent,
    SegmentEndEvent,
    WordTimingsEvent,
)
from chattts_client.pipecat_turns import Turns
from chattts_client.push_stream import PushStream
from chattts_proto.chattts.v1 import tts_pb2

__all__ = ["ChatTTSSegmentFrame", "ChatTTSTTSService"]

# How long stop() waits for the server to finish the stream after the half-close (shutdown
# only: turns never wait on a clock).
CLOSE_TIMEOUT_S = 5.0


@dataclass(kw_only=True)
class ChatTTSSegmentFrame(TTSSpeakFrame):  # type: ignore[misc]
    """Speak `text` as the prompt named `segment`, or revise that prompt: a later frame of the
    same name replaces its text, without an InterruptionFrame (a navigation prompt's distance
    update, "In 300 m, turn left" then "In 100 m, turn left").

    `if_started` is what a revision does to a prompt already speaking: "cut" (the old text
    stops at its next word boundary, within one chunk, then the new text), "finish" (the old
    text ends, then the new) or "drop_new" (the new text is not spoken). A prompt not started
    yet is never spoken: only its latest text is. Empty text with "cut" silences a prompt.
    `expires_in_ms` (0: no limit) is the most the text may wait for its first audio, or it is
    not spoken. A revision's text is sent as it is (the service's text transforms apply to a
    prompt's first text only).

    `append_to_context` is False here: Pipecat's word tracker knows a turn's first text only, so
    the words it reports for a prompt revised in its turn are the first text's.
    """

    segment: str
    if_started: str = "cut"
    expires_in_ms: int = 0
    append_to_context: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.segment:
            raise ValueError("segment: a prompt needs a name")
        if self.if_started not in IF_STARTED:
            raise ValueError(f"if_started must be one of {', '.join(IF_STARTED)}")


class ChatTTSTTSService(TTSService):  # type: ignore[misc]
    """Pipecat TTS service for a chattts-stream server.

    `client` says where the server is (a "host:port" target, or `ClientOptions` for TLS and
    tokens); `synthesis` the voice, speed and sampling of the conversation's stream (its
    `sample_rate_hz`, when set, is the service's output rate; otherwise the pipeline's; word
    timing is always asked for). `connect_timeout_s` bounds the check at start that the server
    answers. Other keywords go to Pipecat's `TTSService`. Push a `ChatTTSSegmentFrame` to speak
    a prompt that later frames may revise; `on_segment_end` (service, name, SegmentEndEvent)
    says how each revision ended.
    """

    def __init__(
        self,
        client: ClientOptions | str = DEFAULT_TARGET,
        synthesis: SynthesisOptions | None = None,
        *,
        connect_timeout_s: float = 5.0,
        **kwargs: Any,
    ) -> None:
        synthesis = synthesis or SynthesisOptions()
        # Pipecat ends an audio context that gets no audio for this long; our turns end at
        # their marks, and a loaded CPU server can take longer than the default 3 s to its
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
            push_text_frames=False,  # word TTSTextFrames come from the word timestamps
            settings=settings,
            **kwargs,
        )
        self._options = ClientOptions.of(client)
        self._client = AsyncTTSClient.from_options(self._options)
        self._synthesis = synthesis
        self._connect_timeout_s = connect_timeout_s
        self._turns = Turns()  # the stream (None while closed) and what was sent on it
        self._words: CallerWords | None = None
        self._receive_task: asyncio.Task[None] | None = None
        self._failed_context: str | None = None  # the turn whose stream failed
        self._interrupted: set[str] = set()  # contexts cleared: late text of theirs is dropped
        self._prompt_frame: ChatTTSSegmentFrame | None = None  # whose text run_tts gets now
        self._register_event_handler("on_segment_end")

    def can_generate_metrics(self) -> bool:
        return True

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self, frame: StartFrame) -> None:
        await super().start(frame)
        try:
            await self._client.list_voices(timeout=self._connect_timeout_s)
        except grpc.RpcError as exc:
            message = describe_error(exc, self._options.target)
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

    def _stream_config(self) -> tts_pb2.SynthesisConfig:
        return self._synthesis.to_config(sample_rate_hz=self.sample_rate, word_timing=True)

    async def _open_stream(self) -> None:
        stream = self._client.open_stream(config=self._stream_config())
        self._turns.reset(stream)
        self._words = CallerWords(lambda: stream.timeline.text)
        self._receive_task = self.create_task(self._receive(stream), "chattts-receive")

    async def _close_stream(self, cancel: bool) -> None:
        stream, task = self._turns.stream, self._receive_task
        self._turns.stream = self._receive_task = None
        if stream is not None:
            if cancel:
                stream.cancel()
            else:
                stream.end_input()  # half-close: the server finishes and ends the call
        if task is not None:
            if cancel:
                await self.cancel_task(task)
            else:
                try:
                    async with asyncio.timeout(CLOSE_TIMEOUT_S):
                        await asyncio.shield(task)
                except TimeoutError:
                    await self.cancel_task(task)

    # -- text in -------------------------------------------------------------------------------

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        if isinstance(frame, ChatTTSSegmentFrame):
            await self._on_prompt_frame(frame, direction)
            return
        await super().process_frame(frame, direction)
        # Pipecat interrupts the audio contexts it holds (on_audio_context_interrupted); a turn
        # it holds none for (a revision not yet heard) is cleared here.
        held = self.audio_context_available
        if (
            isinstance(frame, InterruptionFrame)
            and self._turns.stream is not None
            and any(not held(context_id) for context_id in self._turns.live())
        ):
            self._turns.clear()

    async def _on_prompt_frame(self, frame: ChatTTSSegmentFrame, direction: FrameDirection) -> None:
        if self._turns.revisable(frame.segment):
            # A revision of a prompt that has not ended: heard in the prompt's turn. TTSService
            # would open a context of its own, which a revision never spoken would leave silent
            # (Pipecat reports those as failures), so only the processor's own handling
            # (observers) runs.
            await super(TTSService, self).process_frame(frame, direction)
            self._turns.revise(frame.segment, frame.text, frame.if_started, frame.expires_in_ms)
            logger.debug(f"{self}: revised prompt {frame.segment!r} ({frame.if_started})")
            await self.start_tts_usage_metrics(frame.text)
            return
        # A new prompt, or one that has ended: a turn like any speak frame's; run_tts sends it.
        self._prompt_frame = frame
        try:
            await super().process_frame(frame, direction)
        finally:
            self._prompt_frame = None

    async def run_tts(self, text: str, context_id: str) -> AsyncGenerator[Frame | None, None]:
        if context_id in self._interrupted:
            yield None  # a token of a reply that was interrupted: not spoken
            return
        if self._turns.stream is None:
            if context_id == self._failed_context:
                yield None  # this turn's stream failed; the error was reported once
                return
            await self._open_stream()
        frame, self._prompt_frame = self._prompt_frame, None
        if frame is not None:
            self._turns.send_prompt(
                context_id, frame.segment, text, frame.if_started, frame.expires_in_ms
            )
        else:
            self._turns.push(context_id, text)
        await self.start_tts_usage_metrics(text)
        yield None  # audio arrives through _receive

    async def flush_audio(self, context_id: str | None = None) -> None:
        """The end of a turn's text: its mark goes out now."""
        self._turns.end_text(context_id)

    async def on_audio_context_interrupted(self, context_id: str) -> None:
        await self.stop_all_metrics()
        self._interrupted.add(context_id)
        if self._turns.stream is not None and context_id in self._turns.live():
            self._turns.clear()
            logger.debug(f"{self}: barge-in, cleared turn {context_id}")
        await super().on_audio_context_interrupted(context_id)

    # -- events out ------------------------------------------------------------------------

    async def _receive(self, stream: PushStream) -> None:
        try:
            async for event in stream:
                if isinstance(event, AudioChunkEvent):
                    await self._on_audio(event)
                elif isinstance(event, WordTimingsEvent):
                    await self._on_words(event)
                elif isinstance(event, MarkEvent):
                    await self._on_mark(event)
                elif isinstance(event, SegmentEndEvent):
                    await self._on_segment_end(event)
        except grpc.RpcError as error:
            if error.code() == grpc.StatusCode.CANCELLED and self._turns.stream is not stream:
                return  # we closed it
            await self._failed(error)

    async def _on_audio(self, event: AudioChunkEvent) -> None:
        turn = self._turns.speaking()
        if turn is None or turn.context_id is None:
            return  # audio of a cleared turn
        context_id = turn.context_id
        if not self.audio_context_available(context_id):
            # Ended by Pipecat's idle timer while the server was slow (the audio is kept), or
            # a prompt revision's own turn (see Turns.revise).
            await self.create_audio_context(context_id)
            await self.append_to_audio_context(context_id, TTSStartedFrame(context_id=context_id))
        frame = TTSAudioRawFrame(
            audio=event.audio,
            sample_rate=event.sample_rate_hz,
            num_channels=1,
            context_id=context_id,
        )
        await self.append_to_audio_context(context_id, frame)

    async def _on_words(self, event: WordTimingsEvent) -> None:
        assert self._words is not None
        words = self._words.take(event)  # taken even when dropped: each word is given once
        turn = self._turns.speaking()
        if turn is None or turn.context_id is None or not words or not turn.words:
            return
        # Pipecat times words from the context's first audio frame, which is the first sample
        # after the previous turn's mark (the stream's audio is contiguous).
        start_s = self._turns.start_s
        timed = [(w.text.strip(), max(0.0, w.start_s - start_s)) for w in words]
        await self.add_word_timestamps([(text, t) for text, t in timed if text], turn.context_id)

    async def _on_mark(self, event: MarkEvent) -> None:
        ended, matched = self._turns.on_mark(event)
        for context_id in ended:
            await self._end_turn(context_id)
        if not matched:
            logger.warning(f"{self}: mark {event.name!r} matches no turn")

    async def _on_segment_end(self, event: SegmentEndEvent) -> None:
        name = self._turns.on_segment_end(event)
        logger.debug(f"{self}: prompt {name!r} revision {event.revision}: {event.outcome}")
        await self._call_event_handler("on_segment_end", name, event)

    async def _end_turn(self, context_id: str) -> None:
        """The turn's audio is complete: its stop frame, then its context is closed."""
        if self.audio_context_available(context_id):
            await self.append_to_audio_context(context_id, TTSStoppedFrame(context_id=context_id))
            await self.remove_audio_context(context_id)

    async def _failed(self, error: grpc.RpcError) -> None:
        exc = await self._client.explain(error, config=self._stream_config())
        await self.push_error(error_msg=describe_error(exc, self._options.target), exception=exc)
        # The next turn opens a new stream; the rest of this one is not retried token by token
        # (each would fail the same way against a server that is down).
        turn = self._turns.speaking()
        failed = None if turn is None else turn.context_id
        self._turns.reset(None)
        self._failed_context = failed
        if failed is not None:
            await self._end_turn(failed)
