"""One client stream's synthesis state: settings, audio encoder, sample offsets, utterance count."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from typing import TypeAlias

import numpy as np

from chattts_client._proto.chattts.v1 import tts_pb2

from ..audio.encoding import EncodedChunk, make_encoder
from ..engine.types import AudioChunk, Engine, UtteranceDone, UtteranceRequest
from .convert import StreamSettings, audio_chunk_pb, utterance_end_pb

Reply: TypeAlias = tts_pb2.AudioChunk | tts_pb2.UtteranceEnd


class Session:
    """Turns sentences into engine requests and engine events into encoded response messages."""

    def __init__(self, engine: Engine, settings: StreamSettings, deadline: float | None) -> None:
        self.engine = engine
        self.settings = settings
        self.deadline = deadline
        self.stream_id = uuid.uuid4().hex[:12]
        self.utterance_index = 0
        self.sample_offset = 0
        self._encoder = make_encoder(
            settings.audio.encoding, settings.audio.sample_rate_hz, engine.sample_rate
        )

    def _request(self, sentence: str) -> UtteranceRequest:
        s = self.settings
        return UtteranceRequest(
            request_id=f"{self.stream_id}-{self.utterance_index}",
            text=sentence,
            voice=s.voice,
            speed=s.speed,
            refine=s.refine,
            sampling=s.sampling,
            chunking=s.chunking,
            deadline=self.deadline,
        )

    def _chunk(self, data: bytes, num_samples: int) -> tts_pb2.AudioChunk:
        pb = audio_chunk_pb(
            data, self.sample_offset, num_samples, self.utterance_index, self.settings.audio
        )
        pb.sample_rate_hz = self._encoder.sample_rate_hz
        self.sample_offset += num_samples
        return pb

    async def _encode(self, pcm: np.ndarray) -> EncodedChunk:
        # Opus costs ~16 ms of CPU per second of audio: keep it off the event loop. The cheap
        # sample encodings (well under 1 ms a chunk) are not worth a thread hop.
        if self.settings.audio.encoding == "OGG_OPUS":
            return await asyncio.to_thread(self._encoder.encode, pcm)
        return self._encoder.encode(pcm)

    async def speak(self, sentence: str) -> AsyncIterator[Reply]:
        """Synthesize one sentence: audio chunks as they come, then its UtteranceEnd."""
        started = time.monotonic()
        async for event in self.engine.synthesize(self._request(sentence)):
            if isinstance(event, AudioChunk):
                encoded = await self._encode(event.pcm)
                if encoded.data:
                    yield self._chunk(encoded.data, encoded.num_samples)
            elif isinstance(event, UtteranceDone):
                tail = self._encoder.end_utterance()
                if tail.data:
                    yield self._chunk(tail.data, tail.num_samples)
                event.generation_time_s = max(event.generation_time_s, time.monotonic() - started)
                yield utterance_end_pb(event, self.utterance_index, self.engine.sample_rate)
                self.utterance_index += 1

    def finish(self) -> list[tts_pb2.AudioChunk]:
        """End of stream: whatever the encoder still holds (e.g. the last Ogg page)."""
        tail = self._encoder.flush()
        if not tail.data:
            return []
        self.utterance_index = max(0, self.utterance_index - 1)
        return [self._chunk(tail.data, tail.num_samples)]
