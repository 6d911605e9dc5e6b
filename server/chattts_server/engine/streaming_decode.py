"""Streaming decode: GPT hidden states in, PCM chunks out, at a flat cost per chunk.

Each stream buffers the hidden states the GPT produced for it. A chunk of new tokens
[t0, t1) is decoded once `lookahead_tokens` more exist (up to tb = t1 + lookahead), and only the
samples that the new tokens' frames determine are kept. The plan (`chunk_plan.py`), the seams
(`seams.py`) and what the decode carries between chunks are the stream's (`decode_stream.py`).

The Decoder keeps per-layer state between chunks (`streaming_conv.py`): each chunk feeds only
the tokens since the last one, and the Decoder emits the mel frames its receptive field has seen
in full (final, kept) plus, with short lookahead, the frames it still holds back, computed from a
copy of the state as if the stream ended at tb (provisional, never kept). With the left context
at the receptive field (the default), a chunk's samples are those of an offline decode of the
tokens before tb (the oracle of tests/model/test_streaming_decode.py). In exact mode a vocoder that
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
around each seam and are crossfaded (`seams.py`). (A left context below the receptive field
limits only the vocoder's window: the Decoder state always holds the full left context.)

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
from collections.abc import Mapping
from typing import TypeVar

import numpy as np
import torch
from torch import Tensor, nn

from ..model.mel_decoder import decoder_receptive_field, decoder_stack
from ..model.receptive_field import ReceptiveField, combined_receptive_field_tokens
from ..model.streaming_conv import StreamingStack
from ..model.vocoders import MelWindow, Vocoder, VocoderStreamInput, right_frames_needed
from .chunk_plan import Chunk, ChunkGeometry, StreamChunking
from .chunking import ChunkSchedule
from .decode_stream import DecodeStream

K = TypeVar("K")
"""A stream's key in a decode step (the runner uses slot ids)."""


def chunk_geometry(decoder_field: ReceptiveField, vocoder: Vocoder) -> ChunkGeometry:
    """What chunk planning needs from a Decoder (its receptive field, frames) and `vocoder`."""
    return ChunkGeometry(
        hop_length=vocoder.hop_length,
        end_trim_samples=vocoder.end_trim_samples,
        vocoder_left=vocoder.receptive_field[0],
        vocoder_right=right_frames_needed(vocoder),
        receptive_field_tokens=combined_receptive_field_tokens(
            decoder_field, vocoder.receptive_field
        ),
    )


class StreamingDecoder:
    """Chunked Decoder+vocoder over many streams, batched across streams per engine step, the
    Decoder (and in exact mode Vocos) keeping state between a stream's chunks."""

    def __init__(
        self,
        decoder: nn.Module,
        vocoder: Vocoder,
        config: ChunkSchedule | None = None,
        device: torch.device | str | None = None,
    ) -> None:
        param = next(decoder.parameters())
        self.decoder = decoder
        self.vocoder = vocoder
        self.default_config = config or ChunkSchedule()
        self.device = torch.device(device) if device is not None else param.device
        self.dtype = param.dtype
        self.decoder_receptive_field: ReceptiveField = decoder_receptive_field(decoder)
        self.geometry = chunk_geometry(self.decoder_receptive_field, vocoder)
        # (left, right) tokens of context under which streamed output equals offline output.
        self.receptive_field_tokens: ReceptiveField = self.geometry.receptive_field_tokens
        self.hop_length = vocoder.hop_length

    @functools.cached_property
    def decoder_stack(self) -> StreamingStack:
        """The Decoder's layers as a stack that keeps per-stream state."""
        return decoder_stack(self.decoder)

    def open(self, config: ChunkSchedule | None = None) -> DecodeStream:
        """A new stream under `config` (the default config if None); raises ValueError for a
        config whose seams could not overlap."""
        chunking = StreamChunking.resolve(config or self.default_config, self.geometry)
        # Short lookahead: the vocoder decodes a window of mel frames per chunk, since a
        # stateful one could fold in only final mel, which lags the Decoder's delay behind the
        # samples a chunk emits (more frames per chunk than the window's).
        vocoder_state = self.vocoder.open_stream_state() if chunking.exact else None
        return DecodeStream(chunking, vocoder_state)

    def total_samples(self, num_tokens: int) -> int:
        """Samples an offline decode of `num_tokens` tokens returns (and a stream emits)."""
        return self.geometry.total_samples(num_tokens)

    def step(self, streams: Mapping[K, DecodeStream]) -> dict[K, np.ndarray]:
        """Decode every ready chunk of `streams` (batched, by any key: the runner's slot ids);
        PCM for each stream that had one, under its key.

        A stream is ready when `lookahead_tokens` exist past its next chunk, or it has ended
        with tokens left (then everything left is decoded, in chunks of at most the cap).
        """
        planned = [
            (key, stream, chunk) for key, stream in streams.items() for chunk in stream.plan()
        ]
        out: dict[K, list[np.ndarray]] = {}
        if planned:
            with torch.inference_mode():
                decoded = self._decode([(stream, chunk) for _, stream, chunk in planned])
            # Per stream in plan order: each seam needs the previous chunk's tail.
            for (key, stream, chunk), (audio, origin) in zip(planned, decoded, strict=True):
                out.setdefault(key, []).append(stream.emit(chunk, audio, origin))
        for stream in streams.values():
            stream.trim()
        return {key: np.concatenate(parts) for key, parts in out.items()}

    def finish(self, streams: Mapping[K, DecodeStream]) -> dict[K, np.ndarray]:
        """End `streams` and flush them: one entry per key (empty PCM if nothing was left)."""
        for stream in streams.values():
            stream.end()
        flushed = self.step(streams)
        empty = np.zeros(0, dtype=np.float32)
        return {key: flushed.get(key, empty) for key in streams}

    # -- batched decode ----------------------------------------------------------------------

    def _decode(self, planned: list[tuple[DecodeStream, Chunk]]) -> list[tuple[np.ndarray, int]]:
        """Per planned (stream, chunk): its samples and the stream's index of the first one.
        Each stream's new tokens go through the Decoder state, then the vocoder: its state
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
            stream.decoder_input(chunk, self.decoder_stack, self.device, self.dtype)
            for stream, chunk in last
        ]
        self.decoder_stack.run(items)
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
            decoded, _ = self.vocoder.decode_windows([w for _, w in windows])
            for (i, _), (audio, origin) in zip(windows, decoded, strict=True):
                out[i] = (audio.numpy(), origin)
        return [out[i] for i in range(len(planned))]
