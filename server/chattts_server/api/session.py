"""One client stream's synthesis state: settings, audio encoder, sample offsets, utterance count.

A `Session` turns sentences into engine requests and engine events into encoded domain events
(`AudioOut`, `UtteranceEnded`); the servicer converts those to protobuf, once (`events.to_pb`).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator

import numpy as np

from ..audio.containers import CONTAINER_ENCODINGS, make_container_encoder
from ..audio.encoding import EncodedChunk, make_encoder
from ..engine.types import AudioChunk, Engine, EngineEvent, UtteranceDone, UtteranceRequest
from .convert import StreamSettings
from .events import AudioOut, SessionEvent, UtteranceEnded

_OFFLOADED_ENCODINGS = ("OGG_OPUS", "MP3", "AAC", "FLAC")


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

    def _request(self, sentence: str) -> UtteranceRequest:
        s = self.settings
        return UtteranceRequest(
            request_id=f"{self.stream_id}-{self.num_utterances}",
            text=sentence,
            voice=s.voice,
            speed=s.speed,
            refine=s.refine,
            sampling=s.sampling,
            chunking=s.chunking,
            deadline=self.deadline,
            priority=s.priority,
        )

    def _audio(self, encoded: EncodedChunk, utterance_index: int) -> AudioOut:
        event = AudioOut(
            data=encoded.data,
            sample_offset=self.sample_offset,
            num_samples=encoded.num_samples,
            utterance_index=utterance_index,
            sample_rate_hz=self._encoder.sample_rate_hz,
            encoding=self.settings.audio.encoding,
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

    async def speak(self, sentence: str) -> AsyncGenerator[SessionEvent, None]:
        """Synthesize one sentence: audio as it comes, then its `UtteranceEnded`."""
        index = self.num_utterances
        request = self._request(sentence)
        self.num_utterances += 1
        started = time.monotonic()
        first_audio_s: float | None = None
        native_samples = 0
        interrupted = self._speaking = asyncio.Event()
        events = aiter(self.engine.synthesize(request))
        try:
            while True:
                event = await _next_or_interrupted(events, interrupted)
                if event is None:
                    break
                if isinstance(event, AudioChunk):
                    first_audio_s = first_audio_s or time.monotonic() - started
                    native_samples += len(event.pcm)
                    encoded = await self._encode(event.pcm)
                    if encoded.data:
                        yield self._audio(encoded, index)
                elif isinstance(event, UtteranceDone):
                    tail = self._encoder.end_utterance()
                    if tail.data:
                        yield self._audio(tail, index)
                    yield UtteranceEnded(index, event, event.num_samples / self.native_rate)
                    return
        finally:
            self._speaking = None
            await events.aclose()  # type: ignore[attr-defined]
        # Cleared: what was sent is the utterance.
        tail = self._encoder.end_utterance()
        if tail.data:
            yield self._audio(tail, index)
        now_s = time.monotonic() - started
        cleared = UtteranceDone(
            text=sentence,
            num_tokens=native_samples // self.engine.model_info.samples_per_token,
            num_samples=native_samples,
            time_to_first_audio_s=now_s if first_audio_s is None else first_audio_s,
            generation_time_s=now_s,
            finish_reason="cleared",
        )
        yield UtteranceEnded(index, cleared, native_samples / self.native_rate)

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
