"""Pipecat TTS service over one ChatTTS StreamingSynthesize call per conversation.

Install with `pip install "chattts-stream[pipecat]"`. The service streams every LLM text frame
to the server as it comes (Pipecat's TOKEN aggregation: the server's text release policy decides
when speech starts), ends each turn's text with a mark, and on an interruption sends
`TextInput.clear` on the same stream: barge-in stops the utterance being generated within one
engine step and costs no reconnect.

Turn boundaries come from the stream itself. The stream is shared by all turns; the service
sends a mark after each turn's text (`TextInput.mark`), and the server answers it right after
the last audio of that text, so the events between two marks are exactly one turn's: its audio,
its word timings, then the mark, on which the turn ends (TTSStoppedFrame). A turn whose text
made no sound ends at once. An interruption clears the stream with a mark at the cut: the
cleared turns' events are dropped until that mark arrives, so none of their audio reaches the
next turn, whose text is sent at once behind it. No timer decides anything.

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
import uuid
from collections import deque
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
from chattts_client.client import AsyncTTSClient
from chattts_client.messages import (
    IF_STARTED,
    AudioChunkEvent,
    MarkEvent,
    SegmentEndEvent,
    WordTimingsEvent,
)
from chattts_client.options import DEFAULT_TARGET, ClientOptions, SynthesisOptions
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


@dataclass
class _Turn:
    """A stretch of the stream, in the order it was sent: one audio context's text, or (with no
    context) the rest of a cleared stream up to the clear's mark."""

    context_id: str | None
    mark: str | None = None  # the mark that ends it, once sent
    cancelled: bool = False  # interrupted: its events are dropped
    # Its timed words go to Pipecat: until a SegmentEnd in it, after which it speaks a prompt's
    # revision, whose text Pipecat's word tracker does not have (it holds the turn's first).
    words: bool = True


@dataclass
class _Prompt:
    """A named prompt on the stream (`ChatTTSSegmentFrame`)."""

    name: str  # the segment's name on the stream: the frames', or a new one after a barge-in
    turn: _Turn  # the turn of its latest revision (a barge-in cancels it with that revision)
    num_open: int = 0  # revisions sent whose SegmentEnd has not come back


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
        self._stream: PushStream | None = None
        self._words: CallerWords | None = None
        self._receive_task: asyncio.Task[None] | None = None
        self._turns: deque[_Turn] = deque()  # sent, not yet ended by their mark; oldest first
        self._num_marks = 0
        self._turn_start_s = 0.0  # stream time where the oldest turn's audio begins
        self._failed_context: str | None = None  # the turn whose stream failed
        self._interrupted: set[str] = set()  # contexts cleared: late text of theirs is dropped
        self._prompts: dict[str, _Prompt] = {}  # by the frames' segment name
        self._prompt_names: dict[str, str] = {}  # segment name on the stream -> the frames'
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

    def _stream_config(self) -> tts_pb2.SynthesisConfig:
        return self._synthesis.to_config(sample_rate_hz=self.sample_rate, word_timing=True)

    async def _open_stream(self) -> None:
        stream = self._stream = self._client.open_stream(config=self._stream_config())
        self._words = CallerWords(lambda: stream.timeline.text)
        self._turns.clear()
        self._prompts.clear()
        self._prompt_names.clear()
        self._turn_start_s = 0.0
        self._receive_task = self.create_task(self._receive(stream), "chattts-receive")

    async def _close_stream(self, cancel: bool) -> None:
        stream, task = self._stream, self._receive_task
        self._stream = self._receive_task = None
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
                    await asyncio.wait_for(asyncio.shield(task), CLOSE_TIMEOUT_S)
                except TimeoutError:
                    await self.cancel_task(task)

    # -- text in -------------------------------------------------------------------------------

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        if isinstance(frame, ChatTTSSegmentFrame):
            await self._on_prompt_frame(frame, direction)
            return
        await super().process_frame(frame, direction)
        if isinstance(frame, InterruptionFrame) and self._stream is not None:
            # Pipecat interrupts the audio contexts it holds (on_audio_context_interrupted); a
            # turn it holds none for (a revision not yet heard) is cleared here.
            held = self.audio_context_available
            if any(not t.cancelled and not held(t.context_id or "") for t in self._turns):
                self._clear()

    async def _on_prompt_frame(self, frame: ChatTTSSegmentFrame, direction: FrameDirection) -> None:
        prompt = self._prompts.get(frame.segment)
        if (
            prompt is not None
            and prompt.num_open
            and not prompt.turn.cancelled
            and self._stream is not None
        ):
            # A revision of a prompt that has not ended: heard in the prompt's turn. TTSService
            # would open a context of its own, which a revision never spoken would leave silent
            # (Pipecat reports those as failures), so only the processor's own handling
            # (observers) runs.
            await super(TTSService, self).process_frame(frame, direction)
            self._revise(prompt, frame)
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
        if self._stream is None:
            if context_id == self._failed_context:
                yield None  # this turn's stream failed; the error was reported once
                return
            await self._open_stream()
        assert self._stream is not None
        turn = self._turn_for(context_id)
        prompt_frame, self._prompt_frame = self._prompt_frame, None
        if prompt_frame is not None:
            self._send_prompt(prompt_frame, text, turn)
        else:
            self._stream.push(text)
        await self.start_tts_usage_metrics(text)
        yield None  # audio arrives through _receive

    async def flush_audio(self, context_id: str | None = None) -> None:
        """The end of a turn's text: its mark goes out now."""
        turn = self._open_turn()
        if turn is not None and (context_id is None or turn.context_id == context_id):
            self._end_text(turn)

    async def on_audio_context_interrupted(self, context_id: str) -> None:
        await self.stop_all_metrics()
        self._interrupted.add(context_id)
        if self._stream is not None and any(
            t.context_id == context_id and not t.cancelled for t in self._turns
        ):
            self._clear()
            logger.debug(f"{self}: barge-in, cleared turn {context_id}")
        await super().on_audio_context_interrupted(context_id)

    def _send_prompt(self, frame: ChatTTSSegmentFrame, text: str, turn: _Turn) -> None:
        """A prompt's first text, or a new text of one that has ended (the server queues it at
        the end): the turn's text, ended by its mark."""
        assert self._stream is not None
        prompt = self._prompts.get(frame.segment)
        if prompt is not None and (prompt.num_open == 0 or not prompt.turn.cancelled):
            self._stream.replace(prompt.name, text, frame.if_started, frame.expires_in_ms)
            prompt.turn = turn
        else:
            # New, or cleared by a barge-in whose end of it has not come back: the server may
            # still hold that one unfinished, so the prompt goes on under a name of its own.
            name = frame.segment if prompt is None else f"{frame.segment}#{uuid.uuid4().hex[:8]}"
            self._stream.segment(name, text, frame.expires_in_ms)
            prompt = self._prompts[frame.segment] = _Prompt(name, turn)
            self._prompt_names[name] = frame.segment
        prompt.num_open += 1
        self._end_text(turn)  # ends the segment's text, and the turn at the mark's answer

    def _revise(self, prompt: _Prompt, frame: ChatTTSSegmentFrame) -> None:
        """Replace the text of a prompt that has not ended. Its audio comes in the prompt's
        turn, before that turn's mark; if the old text ended on the server before the replace
        arrived, after everything sent before it: in a turn of its own, ended by a mark of its
        own, whose context opens at its first audio."""
        assert self._stream is not None
        open_turn = self._open_turn()
        if open_turn is not None:
            self._end_text(open_turn)  # the replace ends the text before it, as a mark does
        self._stream.replace(prompt.name, frame.text, frame.if_started, frame.expires_in_ms)
        prompt.num_open += 1
        turn = prompt.turn = _Turn(str(uuid.uuid4()), words=False)
        self._turns.append(turn)
        self._end_text(turn)
        logger.debug(f"{self}: revised prompt {frame.segment!r} ({frame.if_started})")

    def _turn_for(self, context_id: str) -> _Turn:
        """The open turn of `context_id`, opened now if need be (a turn still open for another
        context is ended first: its text is complete once another's begins)."""
        turn = self._open_turn()
        if turn is not None and turn.context_id == context_id:
            return turn
        if turn is not None:
            self._end_text(turn)
        turn = _Turn(context_id)
        self._turns.append(turn)
        return turn

    def _open_turn(self) -> _Turn | None:
        last = self._turns[-1] if self._turns else None
        return last if last is not None and last.mark is None else None

    def _end_text(self, turn: _Turn) -> None:
        self._num_marks += 1
        turn.mark = f"turn-{self._num_marks}"
        if self._stream is not None:
            self._stream.mark(turn.mark)

    def _clear(self) -> None:
        """Barge-in: the server drops every turn's unspoken text, so every turn sent is over;
        the clear's mark closes the stretch whose events are dropped."""
        assert self._stream is not None
        self._num_marks += 1
        name = f"clear-{self._num_marks}"
        for turn in self._turns:
            turn.cancelled = True
        open_turn = self._open_turn()
        if open_turn is not None:
            open_turn.mark = name
        else:
            self._turns.append(_Turn(None, mark=name, cancelled=True))
        self._stream.clear(mark=name)

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
            if error.code() == grpc.StatusCode.CANCELLED and self._stream is not stream:
                return  # we closed it
            await self._failed(error)

    def _speaking(self) -> str | None:
        """The audio context the stream's events are for now (None: they are dropped)."""
        turn = self._turns[0] if self._turns else None
        return None if turn is None or turn.cancelled else turn.context_id

    async def _on_audio(self, event: AudioChunkEvent) -> None:
        context_id = self._speaking()
        if context_id is None:
            return  # audio of a cleared turn
        if not self.audio_context_available(context_id):
            # Ended by Pipecat's idle timer while the server was slow (the audio is kept), or
            # a prompt revision's own turn (see _revise).
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
        context_id = self._speaking()
        if context_id is None or not words or not self._turns[0].words:
            return
        # Pipecat times words from the context's first audio frame, which is the first sample
        # after the previous turn's mark (the stream's audio is contiguous).
        timed = [(w.text.strip(), max(0.0, w.start_s - self._turn_start_s)) for w in words]
        await self.add_word_timestamps([(text, t) for text, t in timed if text], context_id)

    async def _on_mark(self, event: MarkEvent) -> None:
        self._turn_start_s = event.offset_s
        while self._turns:
            turn = self._turns.popleft()
            if not turn.cancelled and turn.context_id is not None:
                await self._end_turn(turn.context_id)
            if turn.mark == event.name:
                return
        logger.warning(f"{self}: mark {event.name!r} matches no turn")

    async def _on_segment_end(self, event: SegmentEndEvent) -> None:
        name = self._prompt_names.get(event.name, event.name)
        prompt = self._prompts.get(name)
        if prompt is not None and prompt.name == event.name:
            prompt.num_open -= 1
        if self._turns:
            self._turns[0].words = False  # what follows in this turn is a revision's
        logger.debug(f"{self}: prompt {name!r} revision {event.revision}: {event.outcome}")
        await self._call_event_handler("on_segment_end", name, event)

    async def _end_turn(self, context_id: str) -> None:
        """The turn's audio is complete: its stop frame, then its context is closed."""
        if self.audio_context_available(context_id):
            await self.append_to_audio_context(context_id, TTSStoppedFrame(context_id=context_id))
            await self.remove_audio_context(context_id)

    async def _failed(self, error: grpc.RpcError) -> None:
        exc = await self._client.explain(error, config=self._stream_config())
        await self.push_error(error_msg=_describe(exc, self._options.target), exception=exc)
        # The next turn opens a new stream; the rest of this one is not retried token by token
        # (each would fail the same way against a server that is down).
        failed = self._speaking()
        self._stream = None
        self._failed_context = failed
        self._turns.clear()
        self._prompts.clear()
        self._prompt_names.clear()
        if failed is not None:
            await self._end_turn(failed)


def _describe(exc: grpc.RpcError, target: str) -> str:
    code = exc.code() if hasattr(exc, "code") else None
    details = exc.details() if hasattr(exc, "details") else str(exc)
    if code == grpc.StatusCode.UNAVAILABLE:
        return f"ChatTTS server at {target} is unreachable or not serving: {details}"
    name = code.name if code is not None else "error"
    return f"ChatTTS server at {target}: {name}: {details}"
