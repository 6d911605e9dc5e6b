"""One client stream's synthesis state: settings, audio encoder, sample offsets, utterance count.

A `Session` turns sentences into engine requests and engine events into encoded domain events
(`AudioOut`, `UtteranceEnded`); the servicer converts those to protobuf, once (`events.to_pb`).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import numpy as np

from ..audio.encoding import EncodedChunk, make_encoder
from ..engine.types import AudioChunk, Engine, UtteranceDone, UtteranceRequest
from .convert import StreamSettings
from .events import AudioOut, SessionEvent, UtteranceEnded


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
        self.native_rate = engine.model_info.sample_rate
        self._encoder = make_encoder(
            settings.audio.encoding,
            settings.audio.sample_rate_hz or self.native_rate,
            self.native_rate,
        )

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
        # Opus costs ~16 ms of CPU per second of audio: keep it off the event loop. The cheap
        # sample encodings (well under 1 ms a chunk) are not worth a thread hop.
        if self.settings.audio.encoding == "OGG_OPUS":
            return await asyncio.to_thread(self._encoder.encode, pcm)
        return self._encoder.encode(pcm)

    async def speak(self, sentence: str) -> AsyncIterator[SessionEvent]:
        """Synthesize one sentence: audio as it comes, then its `UtteranceEnded`."""
        index = self.num_utterances
        self.num_utterances += 1
        async for event in self.engine.synthesize(self._request(sentence)):
            if isinstance(event, AudioChunk):
                encoded = await self._encode(event.pcm)
                if encoded.data:
                    yield self._audio(encoded, index)
            elif isinstance(event, UtteranceDone):
                tail = self._encoder.end_utterance()
                if tail.data:
                    yield self._audio(tail, index)
                yield UtteranceEnded(index, event, event.num_samples / self.native_rate)

    def finish(self) -> list[SessionEvent]:
        """End of stream: whatever the encoder still holds (e.g. the last Ogg page), which
        belongs to the last utterance."""
        tail = self._encoder.flush()
        if not tail.data:
            return []
        return [self._audio(tail, max(0, self.num_utterances - 1))]
