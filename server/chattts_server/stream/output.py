"""A stream's one timeline of samples: the audio encoder, the offset of every event, and the
real-time listener's clock.

Offsets count the samples whose chunks were sent. The sample encodings end each utterance
with its last samples, so a mark's offset is exactly the audio before it; OGG_OPUS (and the
HTTP codecs) hold up to one frame (20 ms) across an utterance's end, sent with what follows.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator

import numpy as np

from ..audio.containers import CONTAINER_ENCODINGS, make_container_encoder
from ..audio.encoding import EncodedChunk, make_encoder
from .catch_up import PlayoutClock
from .events import AudioOut, MarkReached, SegmentEnded, SessionEvent
from .items import MarkAt, Silence
from .segments import Segment
from .settings import StreamSettings

_OFFLOADED_ENCODINGS = ("OGG_OPUS", "MP3", "AAC", "FLAC")
_SILENCE_CHUNK_S = 0.5
"""A silence is sent in chunks of at most this long, as audio is."""


class StreamOutput:
    def __init__(self, settings: StreamSettings, native_rate: int) -> None:
        self.encoding = settings.audio.encoding
        self.native_rate = native_rate
        self.sample_offset = 0
        """Samples (at the chunks' rate) of every chunk sent so far."""
        self.playout = PlayoutClock()
        """When a real-time listener hears what is sent: each utterance's lag."""
        self.heard_source_end = 0
        """Every word of the caller's text before this code point is in the audio sent so far
        (by the duration model's word ends, as a CUT finds them): where a client that lost
        the stream starts it again elsewhere. Stamped on each chunk; it never goes back."""
        # The HTTP front door's WAV, MP3, AAC and FLAC come from audio/containers.py.
        factory = make_container_encoder if self.encoding in CONTAINER_ENCODINGS else make_encoder
        self._encoder = factory(self.encoding, settings.audio.sample_rate_hz, native_rate)
        # Opus costs ~16 ms of CPU per second of audio, MP3 and AAC more: keep them off the
        # event loop. The sample encodings (well under 1 ms a chunk) are not worth a thread hop.
        self._offload = self.encoding in _OFFLOADED_ENCODINGS

    @property
    def sample_rate_hz(self) -> int:
        """The rate of the chunks and of every offset."""
        return self._encoder.sample_rate_hz

    async def audio(
        self, pcm: np.ndarray, utterance_index: int, silence: bool = False
    ) -> list[AudioOut]:
        """`pcm` (native rate) encoded and placed on the timeline (nothing while the encoder
        holds it)."""
        if self._offload:
            encoded = await asyncio.to_thread(self._encoder.encode, pcm)
        else:
            encoded = self._encoder.encode(pcm)
        return self._placed(encoded, utterance_index, silence)

    def end_utterance(self, utterance_index: int, silence: bool = False) -> list[AudioOut]:
        """What the encoder holds of an utterance that ends."""
        return self._placed(self._encoder.end_utterance(), utterance_index, silence)

    def finish(self, utterance_index: int) -> list[SessionEvent]:
        """End of stream: whatever the encoder still holds (e.g. the last Ogg page)."""
        return list(self._placed(self._encoder.flush(), utterance_index))

    async def silence(self, item: Silence, utterance_index: int) -> AsyncGenerator[AudioOut, None]:
        """`item.duration_s` of zeros at the model's rate, encoded like audio."""
        remaining = round(item.duration_s * self.native_rate)
        step = round(_SILENCE_CHUNK_S * self.native_rate)
        while remaining > 0:
            n = min(step, remaining)
            remaining -= n
            zeros = np.zeros(n, dtype=np.float32)
            for event in await self.audio(zeros, utterance_index, silence=True):
                yield event
        for event in self.end_utterance(utterance_index, silence=True):
            yield event

    def heard(self, source_end: int | None) -> None:
        """The caller's text up to `source_end` is heard once the audio sent so far is."""
        if source_end is not None:
            self.heard_source_end = max(self.heard_source_end, source_end)

    def mark(self, item: MarkAt) -> MarkReached:
        """A mark: where the audio sent so far ends (all of the text before it, or the cut)."""
        offset = self.sample_offset
        return MarkReached(item.name, offset, offset / self.sample_rate_hz, item.dropped)

    def segment_end(self, segment: Segment) -> SegmentEnded:
        """A segment's revision ends where the audio sent so far ends."""
        outcome = segment.report()
        offset = self.sample_offset
        return SegmentEnded(
            segment.name,
            segment.revision,
            outcome,
            offset,
            offset / self.sample_rate_hz,
            segment.text,
        )

    def _placed(
        self, encoded: EncodedChunk, utterance_index: int, silence: bool = False
    ) -> list[AudioOut]:
        if not encoded.data:
            return []
        event = AudioOut(
            data=encoded.data,
            sample_offset=self.sample_offset,
            num_samples=encoded.num_samples,
            utterance_index=utterance_index,
            sample_rate_hz=self.sample_rate_hz,
            encoding=self.encoding,
            silence=silence,
            heard_source_end=self.heard_source_end,
        )
        self.sample_offset += encoded.num_samples
        self.playout.sent(encoded.num_samples / self.sample_rate_hz, time.monotonic())
        return [event]
