"""One client stream's synthesis state: settings, audio encoder, sample offsets, utterance count.

A `Session` plays the stream's items (api/stream_items.py) on one timeline of samples: an
utterance becomes an engine request and its engine events become encoded domain events
(`AudioOut`, then `WordTimingsOut` when asked for, then `UtteranceEnded`), a mark a
`MarkReached` at the samples sent so far, a silence `AudioOut` of zeros. The servicer converts
those to protobuf, once (`events.to_pb`); the HTTP doors to JSON (`events.to_json`).

Offsets count the samples whose chunks were sent. The sample encodings end each utterance
with its last samples, so a mark's offset is exactly the audio before it; OGG_OPUS (and the
HTTP codecs) hold up to one frame (20 ms) across an utterance's end, sent with what follows.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator

import numpy as np

from ..audio.containers import CONTAINER_ENCODINGS, make_container_encoder
from ..audio.encoding import EncodedChunk, make_encoder
from ..engine.events import AudioChunk, EngineEvent, Spoken, UtteranceDone
from ..engine.protocol import Engine
from ..engine.utterance import UtteranceRequest
from ..text.spans import Traced
from .convert import StreamSettings
from .events import AudioOut, MarkReached, SessionEvent, UtteranceEnded
from .stream_items import MarkAt, Silence, Speak, StreamItem
from .timeline import own_text, word_timings

_OFFLOADED_ENCODINGS = ("OGG_OPUS", "MP3", "AAC", "FLAC")
_SILENCE_CHUNK_S = 0.5
"""A silence is sent in chunks of at most this long, as audio is."""


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

    def _request(self, item: Speak) -> UtteranceRequest:
        s = self.settings
        return UtteranceRequest(
            request_id=f"{self.stream_id}-{self.num_utterances}",
            text=item.text.text,
            voice=s.voice,
            speed=s.speed if item.speed is None else item.speed,
            refine=s.refine,
            sampling=s.sampling,
            chunking=s.chunking,
            deadline=self.deadline,
            source=item.text,
            priority=s.priority,
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
        return event

    async def _encode(self, pcm: np.ndarray) -> EncodedChunk:
        if self._offload:
            return await asyncio.to_thread(self._encoder.encode, pcm)
        return self._encoder.encode(pcm)

    def interrupt(self) -> None:
        """Barge-in: stop the utterance being spoken, if any. Its engine request is cancelled
        (the slot is free within one engine step) and it ends with finish_reason 'cleared'."""
        if self._speaking is not None:
            self._speaking.set()

    def play(self, item: StreamItem) -> AsyncGenerator[SessionEvent, None]:
        """The events of one stream item, in order."""
        if isinstance(item, Speak):
            return self.speak(item)
        if isinstance(item, MarkAt):
            return self._one(self.mark(item))
        return self.silence(item)

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
        interrupted = self._speaking = asyncio.Event()
        events = aiter(self.engine.synthesize(request))
        try:
            while True:
                event = await _next_or_interrupted(events, interrupted)
                if event is None:
                    break
                if isinstance(event, Spoken):
                    spoken = event.text
                elif isinstance(event, AudioChunk):
                    first_audio_s = first_audio_s or time.monotonic() - started
                    pcm.append(event.pcm)
                    encoded = await self._encode(event.pcm)
                    if encoded.data:
                        yield self._audio(encoded, index)
                elif isinstance(event, UtteranceDone):
                    tail = self._encoder.end_utterance()
                    if tail.data:
                        yield self._audio(tail, index)
                    said = event.spoken or spoken
                    if self.settings.word_timing and said is not None:
                        yield self._timings(
                            index, item, said, pcm, start_offset, cut=False, done=event
                        )
                    yield self._ended(index, item, event, start_offset)
                    return
        finally:
            self._speaking = None
            await events.aclose()  # type: ignore[attr-defined]
        # Cleared: what was sent is the utterance.
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
            finish_reason="cleared",
        )
        yield self._ended(index, item, cleared, start_offset)

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
            speed=self.settings.speed if item.speed is None else item.speed,
            stream_offset=start_offset,
            stream_samples=self.sample_offset - start_offset,
            stream_rate=self.sample_rate_hz,
            alignment=done.alignment if done is not None else None,
            samples_per_token=self.engine.model_info.samples_per_token,
        )

    def _ended(
        self, index: int, item: Speak, done: UtteranceDone, start_offset: int
    ) -> UtteranceEnded:
        return UtteranceEnded(
            index,
            done,
            done.num_samples / self.native_rate,
            sample_offset=start_offset,
            num_samples=self.sample_offset - start_offset,
            source_text=own_text(item),
            source_span=item.text.span(),
        )

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
