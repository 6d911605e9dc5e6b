"""Streaming decode: GPT hidden states in, PCM chunks out, at a flat cost per chunk.

Each stream buffers the hidden states the GPT produced for it. A chunk of new tokens
[t0, t1) is decoded once `lookahead_tokens` more exist (up to tb = t1 + lookahead), and only the
samples that the new tokens' frames determine are kept. The plan and the seams are the stream's
(`chunked_stream.py`); what the decode carries between chunks is too (`decode_stream.py`).

The Decoder keeps per-layer state between chunks (`streaming_conv.py`): each chunk feeds only
the tokens since the last one, and the Decoder emits the mel frames its receptive field has seen
in full (final, kept) plus, with short lookahead, the frames it still holds back, computed from a
copy of the state as if the stream ended at tb (provisional, never kept). Those are the values a
re-decode of the window [t0 - left_context, tb) gives (the window path, kept as the test oracle
`chattts_devtools/window_decoder.py`), so streamed audio is the same. In exact mode a vocoder that
can keep state (Vocos: `Vocoder.open_stream_state`) does, and emits final samples only; with
short lookahead, or a vocoder that keeps none (HiFi-GAN: its transposed convolutions would need a
state per upsampling phase), the vocoder decodes a window of mel frames per chunk
(`Vocoder.decode_windows`: the frames the kept samples need, final and provisional), since a
stateful vocoder could fold in only final mel, which lags the samples a chunk emits by the
Decoder's delay.

With left context and lookahead at least the combined Decoder+vocoder receptive field
(`StreamingDecoder.receptive_field_tokens`, 52 tokens each at the official shapes with Vocos)
the concatenated chunks equal an offline decode of all tokens. With less (the usual choice for
lookahead, which costs time to first audio), consecutive chunks overlap by `crossfade_samples`
around each seam and are crossfaded with a raised-cosine (Hann) ramp whose gains sum to one:
both sides approximate the same signal, so they are correlated and an equal-gain fade keeps the
level, where an equal-power fade would bump it by up to 3 dB. (A left context below the
receptive field limits only the vocoder's window: the Decoder state always holds the full left
context, which is more accurate than the window path.)

Batching: `step` decodes every ready chunk of every given stream with one Decoder call and one
vocoder call when it can. The stateful stacks pack the streams end to end (no padding); so do
Vocos's windows. Windows through a plain `decode` (HiFi-GAN) are zero-padded on the right to a
common length only when their kept samples lie further than the receptive field from their
right edge (padding then cannot reach them); other windows are grouped by exact length, one call
per group. In steady state every stream with the same config has the same window length, so
that is one call.

Runs on the engine thread only; nothing here locks.
"""

from __future__ import annotations

import functools

import numpy as np
import torch
from torch import Tensor

from ..model.mel_decoder import decoder_stack
from ..model.streaming_conv import StreamingStack
from ..model.vocoders import MelWindow, VocoderStreamInput
from .chunked_stream import Chunk, ChunkedDecoder
from .chunking import ChunkSchedule
from .decode_stream import DecodeStream

__all__ = ["DecodeStream", "StreamingDecoder"]


class StreamingDecoder(ChunkedDecoder[DecodeStream]):
    """Chunked Decoder+vocoder over many streams, batched across streams per engine step, the
    Decoder (and in exact mode Vocos) keeping state between a stream's chunks."""

    @functools.cached_property
    def _decoder_stack(self) -> StreamingStack:
        """The Decoder's layers as a stack that keeps per-stream state."""
        return decoder_stack(self.decoder)

    def _new_stream(self, config: ChunkSchedule, left: int, exact: bool) -> DecodeStream:
        # Short lookahead: the vocoder decodes a window of mel frames per chunk, since a
        # stateful one could fold in only final mel, which lags the Decoder's delay behind the
        # samples a chunk emits (more frames per chunk than the window's).
        vocoder_state = self.vocoder.open_stream_state() if exact else None
        return DecodeStream(config, self.geometry, left, exact, vocoder_state)

    # -- batched decode ----------------------------------------------------------------------

    def _decode(self, planned: list[tuple[DecodeStream, Chunk]]) -> list[tuple[np.ndarray, int]]:
        """Each stream's new tokens through the Decoder state, then the vocoder: its state
        (exact mode) or a window per chunk over final and provisional mel."""
        last: dict[int, tuple[DecodeStream, Chunk]] = {}  # per stream, its last chunk planned
        for stream, chunk in planned:
            last[id(stream)] = (stream, chunk)
        provisional = self._feed_decoder(list(last.values()))
        return self._vocode(planned, provisional)

    def _feed_decoder(self, last: list[tuple[DecodeStream, Chunk]]) -> dict[int, Tensor]:
        """One Decoder call over every stream's tokens up to its last chunk's window end: final
        mel frames go to the stream (or one vocoder call over their states), provisional ones
        are returned, by stream id."""
        items = [
            stream.decoder_input(chunk, self._decoder_stack, self.device, self.dtype)
            for stream, chunk in last
        ]
        self._decoder_stack.run(items)
        self.num_decoder_calls += 1
        provisional: dict[int, Tensor] = {}
        vocoder_items: list[tuple[DecodeStream, VocoderStreamInput]] = []
        for (stream, chunk), item in zip(last, items, strict=True):
            assert item.committed is not None and item.provisional is not None
            if chunk.final:  # nothing follows: the flush is final
                mel = torch.cat([item.committed, item.provisional])
            else:
                mel = item.committed
                provisional[id(stream)] = item.provisional
            vocoder_input = stream.take_mel(mel, chunk.final)
            if vocoder_input is not None:
                vocoder_items.append((stream, vocoder_input))
        if vocoder_items:
            self.vocoder.stream([v for _, v in vocoder_items])
            self.num_vocoder_calls += 1
            for stream, v in vocoder_items:
                stream.take_audio(v)
        return provisional

    def _vocode(
        self, planned: list[tuple[DecodeStream, Chunk]], provisional: dict[int, Tensor]
    ) -> list[tuple[np.ndarray, int]]:
        """Each chunk's samples: from its stream's vocoder state, or a vocoder window."""
        out: dict[int, tuple[np.ndarray, int]] = {}  # by index in `planned`
        windows: list[tuple[int, MelWindow]] = []
        for i, (stream, chunk) in enumerate(planned):
            if stream.keeps_vocoder_state:
                out[i] = stream.state_audio()
            else:
                windows.append((i, stream.mel_window(chunk, provisional.get(id(stream)))))
        if windows:
            decoded, num_calls = self.vocoder.decode_windows([w for _, w in windows])
            self.num_vocoder_calls += num_calls
            for (i, _), (audio, origin) in zip(windows, decoded, strict=True):
                out[i] = (audio.numpy(), origin)
        return [out[i] for i in range(len(planned))]
