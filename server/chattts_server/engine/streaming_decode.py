"""Streaming decode: GPT hidden states in, PCM chunks out, at a flat cost per chunk.

Each stream buffers the hidden states the GPT produced for it. A chunk of new tokens
[t0, t1) is decoded once `lookahead_tokens` more exist (up to tb = t1 + lookahead), and only the
samples that the new tokens' frames determine are kept.

Stateful (the default): the Decoder keeps per-layer state between chunks (`streaming_conv.py`):
each chunk feeds only the tokens since the last one, and the Decoder emits the mel frames its
receptive field has seen in full (final, kept) plus, with short lookahead, the frames it still
holds back, computed from a copy of the state as if the stream ended at tb (provisional, never
kept). Those are the values the window path below computes, so streamed audio is the same.
In exact mode the vocoder (Vocos) keeps state too and emits final samples only; with short
lookahead it decodes a window of mel frames per chunk (the frames the kept samples need, final
and provisional), since a stateful vocoder could fold in only final mel, which lags the samples
a chunk emits by the Decoder's delay. HiFi-GAN always takes the window (its transposed
convolutions would need a state per upsampling phase). `stateful=False`: each chunk re-decodes
the window [t0 - left_context, tb) through the Decoder, as before; kept as the reference.

With left context and lookahead at least the combined Decoder+vocoder receptive field
(`StreamingDecoder.receptive_field_tokens`, 52 tokens each at the official shapes with Vocos)
the concatenated chunks equal an offline decode of all tokens. With less (the usual choice for
lookahead, which costs time to first audio), consecutive chunks overlap by `crossfade_samples`
around each seam and are crossfaded with a raised-cosine (Hann) ramp whose gains sum to one:
both sides approximate the same signal, so they are correlated and an equal-gain fade keeps the
level, where an equal-power fade would bump it by up to 3 dB. (A left context below the
receptive field limits only the vocoder's window in the stateful path: the Decoder state always
holds the full left context, which is more accurate than the window path.)

Batching: `step` decodes every ready chunk of every given stream with one Decoder call and one
vocoder call when it can. The stateful stacks pack the streams end to end (no padding). Vocoder
windows (and the window path's Decoder windows) are zero-padded on the right to a common length
only when their kept outputs lie further than the receptive field from their right edge (padding
then cannot reach them); other windows are grouped by exact length, one call per group. In
steady state every stream with the same config has the same window length, so that is one call.

Runs on the engine thread only; nothing here locks.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
import torch
from torch import Tensor, nn

from ..model.mel_decoder import decode_mel, decoder_receptive_field, decoder_stack, hidden_frames
from ..model.receptive_field import (
    FRAMES_PER_TOKEN,
    ReceptiveField,
    combined_receptive_field_tokens,
)
from ..model.streaming_conv import StackInput, StackState
from ..model.vocoders import Vocoder, num_samples
from ..model.vocos import VocosStreamInput, VocosStreamState, VocosVocoder
from .chunking import ChunkingConfig

K = TypeVar("K")
"""A stream's key in `StreamingDecoder.step` (the runner uses slot ids)."""


class DecodeStream:
    """One utterance's decode state: pushed hidden states, chunk schedule, seam tail, counters."""

    def __init__(
        self,
        config: ChunkingConfig,
        left_context_tokens: int,
        exact: bool,
        stateful: bool = False,
        vocoder_state: VocosStreamState | None = None,
    ) -> None:
        self.config = config
        self.left_context_tokens = left_context_tokens
        # Left context and lookahead cover the receptive field: output equals an offline decode.
        self.exact = exact
        # The Decoder keeps per-layer state instead of re-decoding left context; the vocoder
        # too when `vocoder_state` is set (exact mode), else it decodes a window of mel frames.
        self.stateful = stateful
        self._decoder_state: StackState | None = None
        self._fed = 0  # tokens fed to the Decoder state
        self._mel: Tensor | None = None  # (frames, n_mels) final mel frames from _mel_start on
        self._mel_start = 0
        self._vocoder_state = vocoder_state
        self._audio = np.zeros(0, dtype=np.float32)  # final samples from _audio_start on
        self._audio_start = 0
        self._buf: Tensor | None = None  # (capacity, D) hidden states, row 0 is token _buf_start
        self._buf_start = 0
        self._num_tokens = 0  # tokens pushed so far
        self._ended = False
        self._final_planned = False  # the chunk ending at the last sample has been planned
        self._next_token = 0  # first token not yet covered by a chunk
        self._chunk_tokens_f = float(config.first_chunk_tokens)
        # Last planned seam: samples [start, end) are the tail crossfaded into the next chunk;
        # everything before start has been (or is being) emitted.
        self._seam = (0, 0)
        self._tail = np.zeros(0, dtype=np.float32)  # samples [_emitted, _emitted + len)
        self._emitted = 0  # samples returned so far
        # Cost counters, per chunk (windows never grow with position).
        self.num_chunks = 0
        # Tokens the Decoder read for the last chunk: its window, or (stateful) the new tokens.
        self.last_window_tokens = 0
        self.max_window_tokens = 0
        self.last_vocoder_frames = 0  # mel frames the vocoder read for the last chunk

    @property
    def num_tokens(self) -> int:
        return self._num_tokens

    @property
    def ended(self) -> bool:
        return self._ended

    @property
    def done(self) -> bool:
        """Input ended and every sample emitted."""
        return self._ended and (self._num_tokens == 0 or self._final_planned)

    @property
    def buffered_tokens(self) -> int:
        """Rows of hidden states held (left context plus not yet decoded tokens)."""
        return 0 if self._buf is None else self._num_tokens - self._buf_start

    def push(self, hidden: Tensor) -> None:
        """Append hidden states (n, D) in generation order."""
        if self._ended:
            raise RuntimeError("push after end of stream")
        if hidden.dim() != 2:
            raise ValueError(f"expected (n, D) hidden states, got shape {tuple(hidden.shape)}")
        n = hidden.shape[0]
        if self._buf is None:
            capacity = max(64, 2 * n)
            self._buf = hidden.new_empty((capacity, hidden.shape[1]))
        used = self._num_tokens - self._buf_start
        if used + n > self._buf.shape[0]:
            self._compact()
            used = self._num_tokens - self._buf_start
            if used + n > self._buf.shape[0]:
                grown = self._buf.new_empty(
                    (max(2 * self._buf.shape[0], used + n), self._buf.shape[1])
                )
                grown[:used] = self._buf[:used]
                self._buf = grown
        self._buf[used : used + n] = hidden.to(device=self._buf.device, dtype=self._buf.dtype)
        self._num_tokens += n

    def end(self) -> None:
        """No more hidden states: the tail is decoded without lookahead at the next step."""
        self._ended = True

    def _compact(self) -> None:
        # Drop tokens no chunk will read again (before the next chunk's left context).
        assert self._buf is not None
        if self.stateful:  # the Decoder state holds the left context
            keep_from = self._fed
        else:
            keep_from = max(self._buf_start, self._next_token - self.left_context_tokens)
        drop = keep_from - self._buf_start
        if drop > 0:
            used = self._num_tokens - keep_from
            self._buf[:used] = self._buf[drop : drop + used].clone()
            self._buf_start = keep_from

    def _window(self, ta: int, tb: int) -> Tensor:
        assert self._buf is not None
        return self._buf[ta - self._buf_start : tb - self._buf_start]


@dataclass
class _Chunk:
    stream: DecodeStream
    ta: int  # Decoder window [ta, tb), tokens
    tb: int
    va: int  # vocoder window [va, vb), mel frames
    vb: int
    emit_lo: int  # samples [emit_lo, seam_start) are emitted, crossfading the previous tail first
    seam_start: int
    seam_end: int  # samples [seam_start, seam_end) become the tail for the next chunk
    decoder_right_safe: bool  # right zero-padding cannot reach the mel frames kept
    vocoder_right_safe: bool  # right zero-padding cannot reach the samples kept
    final: bool  # the stream's last chunk
    mel: Tensor | None = None  # (n_mels, vb - va)
    audio: np.ndarray | None = None  # samples [audio_origin, ...)
    audio_origin: int = 0


_T = TypeVar("_T")


def _length_groups(
    items: Sequence[_T], length: Callable[[_T], int], right_safe: Callable[[_T], bool]
) -> list[tuple[int, list[_T]]]:
    """Batches: the longest length takes every right-safe item; the rest group by exact length."""
    groups: list[tuple[int, list[_T]]] = []
    pending = sorted(items, key=length, reverse=True)
    while pending:
        size = length(pending[0])
        groups.append((size, [i for i in pending if length(i) == size or right_safe(i)]))
        pending = [i for i in pending if not (length(i) == size or right_safe(i))]
    return groups


def _fade_in(n: int) -> np.ndarray:
    # Raised cosine: fade_in + fade_out == 1 at every sample.
    return (np.sin(0.5 * np.pi * (np.arange(n) + 0.5) / n) ** 2).astype(np.float32)


class StreamingDecoder:
    """Chunked Decoder+vocoder over many streams, batched across streams per engine step."""

    def __init__(
        self,
        decoder: nn.Module,
        vocoder: Vocoder,
        config: ChunkingConfig | None = None,
        device: torch.device | str | None = None,
        stateful: bool = True,
    ) -> None:
        param = next(decoder.parameters())
        self.decoder = decoder
        self.vocoder = vocoder
        self.default_config = config or ChunkingConfig()
        self.device = torch.device(device) if device is not None else param.device
        self.dtype = param.dtype
        self.decoder_receptive_field: ReceptiveField = decoder_receptive_field(decoder)
        # (left, right) tokens of context under which streamed output equals offline output.
        self.receptive_field_tokens: ReceptiveField = combined_receptive_field_tokens(
            self.decoder_receptive_field, vocoder.receptive_field
        )
        self.hop_length = vocoder.hop_length
        # stateful=False: re-decode each chunk's window (left context and all), as before the
        # per-layer state; kept as the reference the stateful path is tested and timed against.
        self.stateful = stateful
        self._decoder_stack = decoder_stack(decoder) if stateful else None
        self.num_decoder_calls = 0
        self.num_vocoder_calls = 0

    def open(self, config: ChunkingConfig | None = None) -> DecodeStream:
        config = config or self.default_config
        rf_left, rf_right = self.receptive_field_tokens
        left = rf_left if config.left_context_tokens is None else config.left_context_tokens
        exact = left >= rf_left and config.lookahead_tokens >= rf_right
        if not exact:
            samples_per_token = FRAMES_PER_TOKEN * self.hop_length
            # The next chunk must start early enough to cover what this one could not produce.
            if left * samples_per_token < self.vocoder.end_trim_samples:
                raise ValueError("left_context_tokens too small for this vocoder; use at least 1")
            if config.crossfade_samples // 2 + self.vocoder.end_trim_samples > (
                config.first_chunk_tokens * samples_per_token
            ):
                raise ValueError("crossfade_samples too long for first_chunk_tokens")
        vocoder_state = None
        # Short lookahead: the vocoder decodes a window of mel frames per chunk, since a
        # stateful one could fold in only final mel, which lags the Decoder's delay behind the
        # samples a chunk emits (more frames per chunk than the window's).
        vocoder = self.vocoder
        if self.stateful and exact and isinstance(vocoder, VocosVocoder) and vocoder.can_stream:
            vocoder_state = vocoder.open_stream()
        return DecodeStream(config, left, exact, self.stateful, vocoder_state)

    def total_samples(self, num_tokens: int) -> int:
        """Samples an offline decode of `num_tokens` tokens returns (and a stream emits)."""
        return num_samples(self.vocoder, FRAMES_PER_TOKEN * num_tokens)

    # -- chunk planning --------------------------------------------------------------------

    def _plan(self, stream: DecodeStream) -> list[_Chunk]:
        config = stream.config
        hop = self.hop_length
        dec_left, dec_right = self.decoder_receptive_field
        voc_left, voc_right = self.vocoder.receptive_field
        voc_right = max(voc_right, -(-self.vocoder.end_trim_samples // hop))
        crossfade = 0 if stream.exact else config.crossfade_samples
        total = stream._num_tokens
        chunks = []
        # After the last token, one more chunk may be needed (with no new tokens) to flush the
        # samples a short lookahead held back.
        while stream._next_token < total or (stream._ended and total and not stream._final_planned):
            size = min(config.max_chunk_tokens, round(stream._chunk_tokens_f))
            t0 = stream._next_token
            t1 = t0 + size
            if t1 + config.lookahead_tokens > total:
                if not stream._ended:
                    break
                t1 = min(t1, total)
            ta = max(0, t0 - stream.left_context_tokens)
            tb = min(total, t1 + config.lookahead_tokens)
            emit_lo = stream._seam[0]
            if stream._ended and t1 == total:
                seam_start = seam_end = self.total_samples(total)
                stream._final_planned = True
            else:
                produced_end = num_samples(self.vocoder, FRAMES_PER_TOKEN * tb)
                boundary = FRAMES_PER_TOKEN * hop * t1
                seam_end = min(boundary + crossfade // 2, produced_end)
                next_start = FRAMES_PER_TOKEN * hop * max(0, t1 - stream.left_context_tokens)
                seam_start = max(seam_end - crossfade, stream._seam[1], next_start)
                assert seam_start <= seam_end, "open() rejects configs whose seams cannot overlap"
            block_lo, block_hi = emit_lo // hop, -(-seam_end // hop)
            va = max(FRAMES_PER_TOKEN * ta, block_lo - voc_left)
            vb = min(FRAMES_PER_TOKEN * tb, block_hi + voc_right)
            chunks.append(
                _Chunk(
                    stream=stream,
                    ta=ta,
                    tb=tb,
                    va=va,
                    vb=vb,
                    emit_lo=emit_lo,
                    seam_start=seam_start,
                    seam_end=seam_end,
                    decoder_right_safe=vb + dec_right <= FRAMES_PER_TOKEN * tb,
                    vocoder_right_safe=block_hi + voc_right <= vb,
                    final=stream._final_planned,
                )
            )
            stream._next_token = t1
            stream._seam = (seam_start, seam_end)
            stream._chunk_tokens_f = min(
                float(config.max_chunk_tokens), stream._chunk_tokens_f * config.growth
            )
            stream.num_chunks += 1
            if not stream.stateful:
                stream.last_window_tokens = tb - ta
                stream.max_window_tokens = max(stream.max_window_tokens, tb - ta)
            stream.last_vocoder_frames = vb - va
        return chunks

    # -- batched decode --------------------------------------------------------------------

    def _run_decoder(self, chunks: list[_Chunk]) -> None:
        groups = _length_groups(chunks, lambda c: c.tb - c.ta, lambda c: c.decoder_right_safe)
        for length, group in groups:
            first = group[0].stream._window(group[0].ta, group[0].tb)
            x = first.new_zeros((len(group), length, first.shape[1]))  # (B, tokens, D)
            for row, chunk in enumerate(group):
                x[row, : chunk.tb - chunk.ta] = chunk.stream._window(chunk.ta, chunk.tb)
            x = x.to(device=self.device, dtype=self.dtype).transpose(1, 2)  # (B, D, tokens)
            mel = decode_mel(self.decoder, x)  # (B, n_mels, 2 * tokens)
            self.num_decoder_calls += 1
            for row, chunk in enumerate(group):
                offset = FRAMES_PER_TOKEN * chunk.ta
                chunk.mel = mel[row, :, chunk.va - offset : chunk.vb - offset]

    def _run_vocoder(self, chunks: list[_Chunk]) -> None:
        groups = _length_groups(chunks, lambda c: c.vb - c.va, lambda c: c.vocoder_right_safe)
        for length, group in groups:
            assert group[0].mel is not None
            mel = group[0].mel.new_zeros((len(group), group[0].mel.shape[0], length))
            for row, chunk in enumerate(group):
                assert chunk.mel is not None
                mel[row, :, : chunk.vb - chunk.va] = chunk.mel
            audio = self.vocoder.decode(mel).float().cpu().numpy()  # (B, samples)
            self.num_vocoder_calls += 1
            for row, chunk in enumerate(group):
                chunk.audio = audio[row, : num_samples(self.vocoder, chunk.vb - chunk.va)]
                chunk.audio_origin = chunk.va * self.hop_length
                chunk.mel = None

    def _run_stateful(self, chunks: list[_Chunk]) -> None:
        """Each stream's new tokens through the Decoder state, then the vocoder: its state
        (exact mode) or a window per chunk over final and provisional mel."""
        last: dict[int, _Chunk] = {}  # per stream, its last chunk planned this step
        for chunk in chunks:
            last[id(chunk.stream)] = chunk
        provisional = self._feed_decoder(list(last.values()))
        self._vocode_stateful(chunks, provisional)

    def _feed_decoder(self, last: list[_Chunk]) -> dict[int, Tensor]:
        """One Decoder call over every stream's tokens up to its last chunk's window end: final
        mel frames go to the stream (or its vocoder state), provisional ones are returned."""
        assert self._decoder_stack is not None
        items = []
        for chunk in last:
            stream = chunk.stream
            if stream._decoder_state is None:
                like = torch.empty(0, device=self.device, dtype=self.dtype)
                stream._decoder_state = self._decoder_stack.new_state(like)
            window = stream._window(stream._fed, chunk.tb)
            stream.last_window_tokens = chunk.tb - stream._fed
            stream.max_window_tokens = max(stream.max_window_tokens, stream.last_window_tokens)
            stream._fed = chunk.tb
            frames = hidden_frames(window.to(device=self.device, dtype=self.dtype))
            items.append(StackInput(stream._decoder_state, frames, chunk.final or not stream.exact))
        self._decoder_stack.run(items)
        self.num_decoder_calls += 1
        provisional: dict[int, Tensor] = {}
        vocoder_items: list[tuple[DecodeStream, VocosStreamInput]] = []
        for chunk, item in zip(last, items, strict=True):
            stream = chunk.stream
            assert item.committed is not None and item.provisional is not None
            new_mel = item.committed
            if chunk.final:  # nothing follows: the flush is final
                new_mel = torch.cat([item.committed, item.provisional])
            else:
                provisional[id(stream)] = item.provisional
            if stream._vocoder_state is not None:
                vocoder_input = VocosStreamInput(stream._vocoder_state, new_mel, chunk.final)
                vocoder_items.append((stream, vocoder_input))
                stream.last_vocoder_frames = len(new_mel)
            elif stream._mel is None:
                stream._mel = new_mel
            else:
                stream._mel = torch.cat([stream._mel, new_mel])
        if vocoder_items:
            assert isinstance(self.vocoder, VocosVocoder)
            self.vocoder.stream([v for _, v in vocoder_items])
            self.num_vocoder_calls += 1
            for stream, v in vocoder_items:
                assert v.audio is not None and v.provisional is not None
                pcm = torch.cat([v.audio, v.provisional]) if v.flush else v.audio
                stream._audio = np.concatenate([stream._audio, pcm.float().cpu().numpy()])
        return provisional

    def _vocode_stateful(self, chunks: list[_Chunk], provisional: dict[int, Tensor]) -> None:
        """Each chunk's audio: from its stream's vocoder state, or a vocoder window."""
        window_chunks = []
        for chunk in chunks:
            stream = chunk.stream
            if stream._vocoder_state is not None:
                chunk.audio, chunk.audio_origin = stream._audio, stream._audio_start
                continue
            assert stream._mel is not None
            mel_end = stream._mel_start + len(stream._mel)
            lo, hi = chunk.va - stream._mel_start, chunk.vb - stream._mel_start
            mel = stream._mel[lo:hi]
            if chunk.vb > mel_end:
                tail = provisional[id(stream)][max(0, chunk.va - mel_end) : chunk.vb - mel_end]
                mel = torch.cat([mel, tail])
            assert chunk.va >= stream._mel_start and len(mel) == chunk.vb - chunk.va
            chunk.mel = mel.T  # (n_mels, frames)
            window_chunks.append(chunk)
        vocoder = self.vocoder
        if isinstance(vocoder, VocosVocoder) and vocoder.can_stream and window_chunks:
            self._run_vocos_windows(vocoder, window_chunks)
        else:
            self._run_vocoder(window_chunks)

    def _run_vocos_windows(self, vocoder: VocosVocoder, chunks: list[_Chunk]) -> None:
        """Vocos over each chunk's mel window in one packed call. A window that reaches back
        the vocoder's full left field before the samples it emits runs without left padding
        (its first frames are only left context, so no layer computes outputs for them)."""
        voc_left, hop = vocoder.receptive_field[0], self.hop_length
        items = []
        for chunk in chunks:
            assert chunk.mel is not None
            valid_left = chunk.va > 0 and (chunk.va + voc_left) * hop <= chunk.emit_lo
            state = vocoder.open_window() if valid_left else vocoder.open_stream()
            chunk.audio_origin = (chunk.va + voc_left) * hop if valid_left else chunk.va * hop
            items.append(VocosStreamInput(state, chunk.mel.T, flush=True))
            chunk.mel = None
        vocoder.stream(items)
        self.num_vocoder_calls += 1
        for chunk, item in zip(chunks, items, strict=True):
            assert item.audio is not None and item.provisional is not None
            chunk.audio = torch.cat([item.audio, item.provisional]).float().cpu().numpy()

    def _trim_stateful(self, stream: DecodeStream) -> None:
        """Drop the mel frames and samples no later chunk reads."""
        if stream._mel is not None:
            voc_left = self.vocoder.receptive_field[0]
            mel_end = stream._mel_start + len(stream._mel)
            keep = max(stream._mel_start, stream._seam[0] // self.hop_length - voc_left)
            keep = min(keep, mel_end)  # frames not yet final are not held either
            if keep > stream._mel_start:
                stream._mel = stream._mel[keep - stream._mel_start :].clone()
                stream._mel_start = keep
        drop = stream._emitted - stream._audio_start
        if drop > 0:
            stream._audio = stream._audio[drop:].copy()
            stream._audio_start = stream._emitted

    def _emit(self, chunk: _Chunk) -> np.ndarray:
        stream, audio = chunk.stream, chunk.audio
        assert audio is not None
        origin = chunk.audio_origin  # global index of audio[0]
        assert origin <= chunk.emit_lo == stream._emitted
        assert origin + len(audio) >= chunk.seam_end

        def span(lo: int, hi: int) -> np.ndarray:
            return audio[lo - origin : hi - origin]

        parts = []
        pos = chunk.emit_lo
        num_fade = len(stream._tail)
        if num_fade:
            fade_in = _fade_in(num_fade)
            parts.append(stream._tail * (1.0 - fade_in) + span(pos, pos + num_fade) * fade_in)
            pos += num_fade
        parts.append(span(pos, chunk.seam_start))
        stream._tail = span(chunk.seam_start, chunk.seam_end).copy()
        stream._emitted = chunk.seam_start
        return np.concatenate(parts).astype(np.float32, copy=False)

    # -- public steps ------------------------------------------------------------------------

    def step(self, streams: Mapping[K, DecodeStream]) -> dict[K, np.ndarray]:
        """Decode every ready chunk of `streams` (batched, by any key: the runner's slot ids);
        PCM for each stream that had one, under its key.

        A stream is ready when `lookahead_tokens` exist past its next chunk, or it has ended
        with tokens left (then everything left is decoded, in chunks of at most the cap).
        """
        planned = [(key, chunk) for key, stream in streams.items() for chunk in self._plan(stream)]
        out: dict[K, list[np.ndarray]] = {}
        if planned:
            chunks = [chunk for _, chunk in planned]
            with torch.inference_mode():
                if self.stateful:
                    self._run_stateful(chunks)
                else:
                    self._run_decoder(chunks)
                    self._run_vocoder(chunks)
            for key, chunk in planned:  # per stream in plan order: each seam needs the last tail
                out.setdefault(key, []).append(self._emit(chunk))
        for stream in streams.values():
            if stream.done:
                stream._buf = stream._mel = stream._decoder_state = stream._vocoder_state = None
                stream._audio = stream._audio[:0]
            elif stream._buf is not None:
                stream._compact()
                if stream.stateful:
                    self._trim_stateful(stream)
        return {key: np.concatenate(parts) for key, parts in out.items()}

    def finish(self, streams: Mapping[K, DecodeStream]) -> dict[K, np.ndarray]:
        """End `streams` and flush them: one entry per key (empty PCM if nothing was left)."""
        for stream in streams.values():
            stream.end()
        flushed = self.step(streams)
        empty = np.zeros(0, dtype=np.float32)
        return {key: flushed.get(key, empty) for key in streams}


def chunk_schedule(config: ChunkingConfig, num_tokens: int) -> list[int]:
    """New tokens per chunk for a stream of `num_tokens` tokens (for benchmarks and docs)."""
    sizes, size_f, done = [], float(config.first_chunk_tokens), 0
    while done < num_tokens:
        size = min(config.max_chunk_tokens, round(size_f), num_tokens - done)
        sizes.append(size)
        done += size
        size_f = min(float(config.max_chunk_tokens), size_f * config.growth)
    return sizes
