"""One client stream's synthesis state: settings, audio encoder, sample offsets, utterance count.

A `Session` plays the stream's items (api/stream_items.py) on one timeline of samples: an
utterance becomes an engine request and its engine events become encoded domain events
(`AudioOut`, then `WordTimingsOut` when asked for, then `UtteranceEnded`), a mark a
`MarkReached` at the samples sent so far, a silence `AudioOut` of zeros. The servicer converts
those to protobuf, once (`events.to_pb`); the HTTP doors to JSON (`events.to_json`).

Named segments (api/segments.py): an utterance of a segment moves it to TAKEN, its first chunk
to SPEAKING (or, past its `expires_in_ms`, ends it EXPIRED with no audio: checked when it is
taken, by the engine before its prefill, and before its first chunk is sent); the reader may
stop it (`stop_segment`: a replace), at once when it has sent nothing, else at the next word
boundary within one chunk (a CUT). A `SegmentDone` becomes a `SegmentEnded` at the samples
sent so far. A stream with `max_lag_s` (api/catch_up.py) speeds up or skips utterances whose
text waits too long; every utterance reports its lag.

Offsets count the samples whose chunks were sent. The sample encodings end each utterance
with its last samples, so a mark's offset is exactly the audio before it; OGG_OPUS (and the
HTTP codecs) hold up to one frame (20 ms) across an utterance's end, sent with what follows.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator

import numpy as np

from ..api.convert import StreamSettings
from ..api.events import AudioOut, MarkReached, SegmentEnded, SessionEvent, UtteranceEnded
from ..audio.containers import CONTAINER_ENCODINGS, make_container_encoder
from ..audio.encoding import EncodedChunk, make_encoder
from ..engine.events import AudioChunk, EngineEvent, Spoken, UtteranceDone
from ..engine.protocol import Engine
from ..engine.utterance import UtteranceRequest
from ..errors import ExpiredError
from ..text.spans import Traced
from ..timing.timeline import own_text, word_ends, word_timings
from .catch_up import PlayoutClock
from .items import MarkAt, SegmentDone, Silence, Speak, StreamItem
from .segments import Outcome, Segment, State

_OFFLOADED_ENCODINGS = ("OGG_OPUS", "MP3", "AAC", "FLAC")
_SILENCE_CHUNK_S = 0.5
"""A silence is sent in chunks of at most this long, as audio is."""
_CUT_FADE_S = 0.005
"""A chunk cut at a word boundary fades out over its last 5 ms, so the stop makes no click."""


class Session:
    def __init__(
        self,
        engine: Engine,
        settings: StreamSettings,
        deadline: float | None,
    ) -> None:
        self.engine = engine
        self.settings = settings
        self.deadline = deadline
        self.stream_id = uuid.uuid4().hex[:12]
        self.num_utterances = 0
        """Utterances begun; the next one gets this index."""
        self.sample_offset = 0
        """Samples (at the chunks' rate) of every chunk sent so far."""
        self._speaking: asyncio.Event | None = None
        """Set to interrupt the utterance being spoken (None between utterances)."""
        self._stop_reason = "cleared"
        """The finish_reason of an interrupted utterance: cleared, replaced, expired."""
        self._current: Speak | None = None
        """The utterance being spoken."""
        self._current_sent = False
        """Audio of the utterance being spoken has been sent."""
        self._cut_at_word = False
        """Stop the utterance being spoken at its next word boundary (a CUT replace)."""
        self.playout = PlayoutClock()
        """When a real-time listener hears what is sent: each utterance's lag."""
        self.native_rate = engine.model_info.sample_rate
        # The HTTP front door's WAV, MP3, AAC and FLAC come from audio/containers.py.
        encoding = settings.audio.encoding
        factory = make_container_encoder if encoding in CONTAINER_ENCODINGS else make_encoder
        self._encoder = factory(encoding, settings.audio.sample_rate_hz, self.native_rate)
        # Opus costs ~16 ms of CPU per second of audio, MP3 and AAC more: keep them off the
        # event loop. The sample encodings (well under 1 ms a chunk) are not worth a thread hop.
        self._offload = encoding in _OFFLOADED_ENCODINGS

    @property
    def sample_rate_hz(self) -> int:
        """The rate of the chunks and of every offset."""
        return self._encoder.sample_rate_hz

    def _speed(self, item: Speak) -> int:
        return self.settings.speed if item.speed is None else item.speed

    def _request(self, item: Speak) -> UtteranceRequest:
        s = self.settings
        segment = item.segment
        waiting = segment is not None and segment.state is State.TAKEN
        return UtteranceRequest(
            request_id=f"{self.stream_id}-{self.num_utterances}",
            text=item.text.text,
            voice=s.voice,
            speed=self._speed(item),
            refine=s.refine,
            sampling=s.sampling,
            chunking=s.chunking,
            deadline=self.deadline,
            source=item.text,
            priority=s.priority,
            expires_at=segment.expires_at if waiting and segment is not None else None,
            word_timing=s.word_timing,
        )

    def _audio(
        self, encoded: EncodedChunk, utterance_index: int, silence: bool = False
    ) -> AudioOut:
        event = AudioOut(
            data=encoded.data,
            sample_offset=self.sample_offset,
            num_samples=encoded.num_samples,
            utterance_index=utterance_index,
            sample_rate_hz=self._encoder.sample_rate_hz,
            encoding=self.settings.audio.encoding,
            silence=silence,
        )
        self.sample_offset += encoded.num_samples
        self.playout.sent(encoded.num_samples / self.sample_rate_hz, time.monotonic())
        return event

    async def _encode(self, pcm: np.ndarray) -> EncodedChunk:
        if self._offload:
            return await asyncio.to_thread(self._encoder.encode, pcm)
        return self._encoder.encode(pcm)

    def interrupt(self, reason: str = "cleared") -> None:
        """Barge-in: stop the utterance being spoken, if any. Its engine request is cancelled
        (the slot is free within one engine step) and it ends with finish_reason `reason`."""
        if self._speaking is not None and not self._speaking.is_set():
            self._stop_reason = reason
            self._speaking.set()

    def stop_segment(self, segment: Segment, at_word: bool) -> None:
        """A replace: stop the utterance being spoken if it is `segment`'s, at its next word
        boundary (`at_word`) or at once (it has sent no audio: "replaced")."""
        if self._current is None or self._current.segment is not segment:
            return
        if at_word and self._current_sent:
            self._cut_at_word = True
        else:
            self.interrupt("cut" if at_word else "replaced")

    def play(self, item: StreamItem) -> AsyncGenerator[SessionEvent, None]:
        """The events of one stream item, in order."""
        if isinstance(item, Speak):
            return self.speak_item(item)
        if isinstance(item, MarkAt):
            return self._one(self.mark(item))
        if isinstance(item, SegmentDone):
            return self._one(self.segment_end(item.segment))
        return self.silence(item)

    def segment_end(self, segment: Segment) -> SegmentEnded:
        """A segment's revision ends where the audio sent so far ends."""
        segment.state = State.ENDED
        offset = self.sample_offset
        return SegmentEnded(
            segment.name,
            segment.revision,
            segment.final_outcome(),
            offset,
            offset / self.sample_rate_hz,
            segment.text,
        )

    async def speak_item(self, item: Speak) -> AsyncGenerator[SessionEvent, None]:
        """An utterance as its segment and the stream's lag limits decide: skipped (its segment
        is done or expired; over the hard lag limit), sped up, or spoken."""
        segment = item.segment
        now = time.monotonic()
        if segment is not None:
            if not segment.open:
                return  # replaced, cut or expired: nothing more of it is said
            if segment.state is State.PENDING:
                if segment.expired(now):
                    segment.finish(Outcome.EXPIRED)
                    return
                segment.state = State.TAKEN
        limits = self.settings.lag_limits
        if limits is not None and segment is None:
            lag_s = self.playout.heard_at(now) - (item.received_at or now)
            speed = limits.speed_for(lag_s, self._speed(item))
            if speed is None:
                yield self._skipped(item, lag_s)
                return
            if speed != self._speed(item):
                item = dataclasses.replace(item, speed=speed)
        async for event in self.speak(item):
            yield event

    def _skipped(self, item: Speak, lag_s: float) -> UtteranceEnded:
        """An utterance over the hard lag limit: it ends at once, its text kept, no audio."""
        index = self.num_utterances
        self.num_utterances += 1
        done = UtteranceDone(item.text.text, 0, 0, 0.0, 0.0, "skipped")
        return self._ended(index, item, done, self.sample_offset, lag_s)

    @staticmethod
    async def _one(event: SessionEvent) -> AsyncGenerator[SessionEvent, None]:
        yield event

    def mark(self, item: MarkAt) -> MarkReached:
        """A mark: where the audio sent so far ends (all of the text before it, or the cut)."""
        offset = self.sample_offset
        return MarkReached(item.name, offset, offset / self.sample_rate_hz, item.dropped)

    async def silence(self, item: Silence) -> AsyncGenerator[SessionEvent, None]:
        """`item.duration_s` of zeros at the model's rate, encoded like audio; it belongs to the
        last utterance begun (0 before any)."""
        index = max(0, self.num_utterances - 1)
        remaining = round(item.duration_s * self.native_rate)
        step = round(_SILENCE_CHUNK_S * self.native_rate)
        while remaining > 0:
            n = min(step, remaining)
            remaining -= n
            encoded = await self._encode(np.zeros(n, dtype=np.float32))
            if encoded.data:
                yield self._audio(encoded, index, silence=True)
        tail = self._encoder.end_utterance()
        if tail.data:
            yield self._audio(tail, index, silence=True)

    async def speak(self, item: Speak) -> AsyncGenerator[SessionEvent, None]:
        """Synthesize one utterance: audio as it comes, its word timings if asked for, then its
        `UtteranceEnded`."""
        index = self.num_utterances
        request = self._request(item)
        self.num_utterances += 1
        started = time.monotonic()
        first_audio_s: float | None = None
        start_offset = self.sample_offset
        spoken: Traced | None = None
        pcm: list[np.ndarray] = []
        segment = item.segment
        lag_s: float | None = None
        interrupted = self._speaking = asyncio.Event()
        self._stop_reason = "cleared"
        self._current, self._current_sent, self._cut_at_word = item, False, False
        events = aiter(self.engine.synthesize(request))
        try:
            while True:
                try:
                    event = await _next_or_interrupted(events, interrupted)
                except ExpiredError:
                    self._expire(segment)
                    break
                if event is None:
                    break
                if isinstance(event, Spoken):
                    spoken = event.text
                elif isinstance(event, AudioChunk):
                    if interrupted.is_set():
                        break  # stopped while this chunk was on its way: it is not sent
                    chunk = event.pcm
                    if not await self._paced(interrupted):
                        break  # stopped while waiting for the listener: not sent
                    if lag_s is None:  # the first chunk
                        if segment is not None and segment.state is State.TAKEN:
                            if segment.expired():
                                self._expire(segment)
                                break
                            segment.state = State.SPEAKING
                        now = time.monotonic()
                        lag_s = self.playout.heard_at(now) - (item.received_at or started)
                        first_audio_s = now - started
                    cut = self._cut_at_word
                    if cut:
                        chunk = self._up_to_word_end(chunk, sum(len(p) for p in pcm), spoken, item)
                    pcm.append(chunk)
                    self._current_sent = True
                    encoded = await self._encode(chunk)
                    if encoded.data:
                        yield self._audio(encoded, index)
                    if cut:
                        self._stop_reason = "cut"
                        break
                elif isinstance(event, UtteranceDone):
                    tail = self._encoder.end_utterance()
                    if tail.data:
                        yield self._audio(tail, index)
                    said = event.spoken or spoken
                    if self.settings.word_timing and said is not None:
                        yield self._timings(
                            index, item, said, pcm, start_offset, cut=False, done=event
                        )
                    yield self._ended(index, item, event, start_offset, lag_s)
                    return
        finally:
            self._speaking = None
            self._current = None
            await events.aclose()  # type: ignore[attr-defined]
        # Stopped (cleared, cut, replaced, expired): what was sent is the utterance.
        tail = self._encoder.end_utterance()
        if tail.data:
            yield self._audio(tail, index)
        if self.settings.word_timing:
            said = spoken if spoken is not None else item.text
            yield self._timings(index, item, said, pcm, start_offset, cut=True)
        now_s = time.monotonic() - started
        native_samples = sum(len(p) for p in pcm)
        cleared = UtteranceDone(
            text=spoken.text if spoken is not None else item.text.text,
            num_tokens=native_samples // self.engine.model_info.samples_per_token,
            num_samples=native_samples,
            time_to_first_audio_s=now_s if first_audio_s is None else first_audio_s,
            generation_time_s=now_s,
            finish_reason=self._stop_reason,
        )
        if lag_s is None:  # no audio: its lag is the wait until now
            lag_s = self.playout.heard_at(time.monotonic()) - (item.received_at or started)
        yield self._ended(index, item, cleared, start_offset, lag_s)

    async def _paced(self, interrupted: asyncio.Event) -> bool:
        """Wait until the audio sent so far runs at most `pace_lead_s` ahead of a real-time
        listener (no wait without it); False if the utterance was stopped meanwhile. The
        engine pauses the request once its output buffer is full, as for a slow reader."""
        lead = self.settings.pace_lead_s
        if lead is not None:
            wait_s = self.playout.ahead_s(time.monotonic()) - lead
            if wait_s > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(interrupted.wait(), wait_s)
        return not interrupted.is_set()

    def _expire(self, segment: Segment | None) -> None:
        """The utterance's segment could not start in time: no audio of it is sent."""
        self._stop_reason = "expired"
        if segment is not None:
            segment.finish(Outcome.EXPIRED)

    def _timings(
        self,
        index: int,
        item: Speak,
        spoken: Traced,
        pcm: list[np.ndarray],
        start_offset: int,
        cut: bool,
        done: UtteranceDone | None = None,
    ) -> SessionEvent:
        audio = np.concatenate(pcm) if pcm else np.zeros(0, dtype=np.float32)
        return word_timings(
            index,
            item,
            spoken,
            audio,
            cut=cut,
            native_rate=self.native_rate,
            speed=self._speed(item),
            stream_offset=start_offset,
            stream_samples=self.sample_offset - start_offset,
            stream_rate=self.sample_rate_hz,
            alignment=done.alignment if done is not None else None,
            samples_per_token=self.engine.model_info.samples_per_token,
        )

    def _ended(
        self,
        index: int,
        item: Speak,
        done: UtteranceDone,
        start_offset: int,
        lag_s: float | None = None,
    ) -> UtteranceEnded:
        return UtteranceEnded(
            index,
            done,
            done.num_samples / self.native_rate,
            sample_offset=start_offset,
            num_samples=self.sample_offset - start_offset,
            source_text=own_text(item),
            source_span=item.text.span(),
            lag_s=max(0.0, lag_s or 0.0),
            speed=self._speed(item),
        )

    def _up_to_word_end(
        self, chunk: np.ndarray, sent: int, spoken: Traced | None, item: Speak
    ) -> np.ndarray:
        """The part of `chunk` (native samples; `sent` of the utterance went before it) up to
        the utterance's next word boundary: the whole chunk when none falls inside it, nothing
        when the words (as the duration model places them) are all said already."""
        text = spoken if spoken is not None else item.text
        ends = word_ends(text, sent + len(chunk), self.native_rate, self._speed(item))
        after = [e for e in ends if e > sent]
        if not after:
            return chunk[:0]
        keep = min(len(chunk), after[0] - sent)
        out = chunk[:keep].astype(np.float32, copy=True)
        fade = min(keep, round(_CUT_FADE_S * self.native_rate))
        if fade:
            out[keep - fade :] *= np.linspace(1.0, 0.0, fade, dtype=np.float32)
        return out

    def finish(self) -> list[SessionEvent]:
        """End of stream: whatever the encoder still holds (e.g. the last Ogg page), which
        belongs to the last utterance."""
        tail = self._encoder.flush()
        if not tail.data:
            return []
        return [self._audio(tail, max(0, self.num_utterances - 1))]


async def _next_or_interrupted(
    events: AsyncIterator[EngineEvent], interrupted: asyncio.Event
) -> EngineEvent | None:
    """The next engine event, or None once `interrupted` is set (the pending read is then
    cancelled, which cancels the engine request)."""
    if interrupted.is_set():
        return None
    next_event = asyncio.ensure_future(anext(events))
    waiter = asyncio.ensure_future(interrupted.wait())
    try:
        await asyncio.wait({next_event, waiter}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        # Interrupted, or this call itself cancelled: the pending read must end before the
        # engine's iterator can be closed.
        waiter.cancel()
        if not next_event.done():
            next_event.cancel()
            await asyncio.gather(next_event, return_exceptions=True)
    if next_event.cancelled():
        return None
    return next_event.result()
