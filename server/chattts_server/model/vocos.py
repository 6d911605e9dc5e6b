"""Vocos, ChatTTS's vocoder (ConvNeXt backbone + iSTFT head), behind the `Vocoder` protocol:
offline (`decode`), chunk by chunk with per-layer state (`open_stream_state`, `stream`), and by
windows packed into one call (`decode_windows`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

import torch
from torch import Tensor, nn

from ..audio_constants import SAMPLE_RATE_HZ
from .receptive_field import ReceptiveField, istft_receptive_field, stride1_receptive_field
from .streaming_conv import StackInput, StackState, Stage, StreamingStack
from .vocoders import (
    MelWindow,
    VocoderStreamInput,
    WindowAudio,
    decode_padded,
    module_device_dtype,
)


@dataclass
class _IstftState:
    frames: Tensor  # (overlap - 1, n_fft) last windowed frames, zeros before the stream starts
    num_frames: int = 0  # frames committed so far
    drop_blocks: int = 0  # output blocks still to drop (a window's incomplete first blocks)


class StreamingISTFT:
    """`torch.istft(center=True)` chunk by chunk: overlap-add of windowed inverse FFTs divided by
    the window envelope, emitting each block of `hop` samples once every frame over it exists.

    Output block i (samples [i * hop, (i + 1) * hop)) is overlap-add block i + n_fft / (2 hop),
    the sum of frames i + trim - overlap + 1 .. i + trim; at a flush the missing later frames
    are left out of both the sum and the envelope, as torch.istft does at the end of a signal.
    """

    def __init__(self, istft: nn.Module) -> None:
        module: Any = istft  # vocos.spectral_ops.ISTFT
        n_fft, hop_length = module.n_fft, module.hop_length
        if module.win_length != n_fft or n_fft % hop_length or (n_fft // 2) % hop_length:
            raise ValueError("streaming iSTFT needs win_length == n_fft, a multiple of 2 hops")
        self.module = module
        self.n_fft, self.hop = n_fft, hop_length
        self.overlap = n_fft // hop_length  # frames over each sample
        self.trim = n_fft // 2 // hop_length  # blocks center=True drops at the start

    @property
    def window(self) -> Tensor:
        # Read from the module each time: it follows the module's .to(device).
        window: Tensor = self.module.window
        return window

    def new_state(self, like: Tensor) -> _IstftState:
        return _IstftState(like.new_zeros((self.overlap - 1, self.n_fft)))

    def run(
        self, state: _IstftState, frames: Tensor, num_committed: int, flush: bool
    ) -> tuple[Tensor, Tensor]:
        """Samples for windowed time frames (n, n_fft), of which the first `num_committed` are
        final (folded into `state`): (the samples those complete, and at a flush the samples
        after them, computed as if the signal ended with the last frame)."""
        r, hop, k = self.overlap, self.hop, state.num_frames
        seq = torch.cat([state.frames, frames])  # global frames k - r + 1 .. k + n - 1
        num = len(seq)
        blocks = seq.new_zeros((num + r - 1, hop))  # row b: overlap-add block k - r + 1 + b
        window_sq = (self.window.float() ** 2).view(r, hop)
        env = window_sq.new_zeros((num + r - 1, hop))
        exists = torch.arange(num, device=env.device) >= r - 1 - k  # global index >= 0
        exists_f = exists.to(env.dtype)[:, None]
        for m in range(r):
            blocks[m : m + num] += seq[:, m * hop : (m + 1) * hop]
            env[m : m + num] += exists_f * window_sq[m]
        start = r - 1 + max(0, self.trim - k)  # the first `trim` blocks are cut (center=True)
        mid = max(start, r - 1 + num_committed)
        end = max(mid, r - 1 + len(frames) + self.trim - 1) if flush else mid
        drop = min(state.drop_blocks, end - start)
        state.drop_blocks -= drop
        start, mid = start + drop, max(mid, start + drop)
        out = blocks[start:end] / env[start:end].to(blocks.dtype)
        kept = torch.cat([state.frames, frames[:num_committed]])
        state.frames = kept[len(kept) - (r - 1) :].clone()
        state.num_frames += num_committed
        return out[: mid - start].reshape(-1), out[mid - start :].reshape(-1)


@dataclass
class VocosStreamState:
    """One stream's Vocos state: the backbone's per-layer inputs and the iSTFT's overlap."""

    backbone: StackState
    istft: _IstftState


class VocosVocoder:
    """The ChatTTS Vocos module (`vocos.Vocos`) behind the `Vocoder` protocol."""

    def __init__(self, vocos: nn.Module) -> None:
        self.vocos = vocos
        # vocos.Vocos: VocosBackbone, ISTFTHead (untyped submodules)
        backbone: Any = vocos.backbone
        istft: Any = vocos.head.istft
        self.hop_length: int = istft.hop_length
        self.n_mels: int = backbone.input_channels
        self.sample_rate: int = SAMPLE_RATE_HZ
        feature_extractor = getattr(vocos, "feature_extractor", None)
        mel_spec = getattr(feature_extractor, "mel_spec", None)
        if mel_spec is not None:
            self.sample_rate = int(mel_spec.sample_rate)
        # Per-frame ops (LayerNorm, MLP, the head's Linear) add nothing; the convolutions and the
        # iSTFT overlap do.
        convs = [backbone.embed] + [block.dwconv for block in backbone.convnext]
        b_left, b_right = stride1_receptive_field(convs)
        i_left, i_right = istft_receptive_field(
            istft.n_fft, istft.hop_length, istft.win_length, istft.padding
        )
        self.backbone_receptive_field: ReceptiveField = (b_left, b_right)
        self.receptive_field: ReceptiveField = (b_left + i_left, b_right + i_right)
        # torch.istft(center=True) returns (n - 1) * hop samples; vocos "same" returns n * hop.
        self.end_trim_samples: int = self.hop_length if istft.padding == "center" else 0
        # Chunk-by-chunk decoding: ChatTTS's configuration (plain LayerNorm, center iSTFT).
        self._stack: StreamingStack | None = None
        self._istft: StreamingISTFT | None = None
        if not getattr(backbone, "adanorm", False) and istft.padding == "center":
            stages = [Stage(backbone.embed, post=backbone.norm)]
            stages += [Stage(b.dwconv, block=b, scale=b.gamma) for b in backbone.convnext]
            self._stack = StreamingStack(stages)
            self._istft = StreamingISTFT(istft)

    def decode(self, mel: Tensor) -> Tensor:
        # vocos.Vocos.decode without its inference_mode decorator (callers choose the grad mode).
        device, dtype = module_device_dtype(self.vocos)
        vocos: Any = self.vocos
        return vocos.head(vocos.backbone(mel.to(device=device, dtype=dtype)))

    def open_stream_state(self) -> VocosStreamState | None:
        """A stream's state before its first mel frame; None where Vocos cannot stream."""
        if self._stack is None or self._istft is None:
            return None
        like = next(self.vocos.parameters())
        return VocosStreamState(self._stack.new_state(like), self._istft.new_state(like))

    def _open_window(self) -> VocosStreamState:
        """State for a one-off decode of a window of mel frames that does not start the
        stream (`stream` it with flush=True): no left zero padding, so only outputs whose
        left context lies inside the window are computed, and the samples start
        `receptive_field[0]` frames into the window. A window at the stream's start takes
        `open_stream_state` (the left padding `decode` applies)."""
        assert self._stack is not None and self._istft is not None
        like = next(self.vocos.parameters())
        fresh = self._stack.new_state(like)
        backbone = StackState([h[:0] for h in fresh.history])
        istft = self._istft.new_state(like)
        # Frames before the window count as present (zeros): the blocks they would complete
        # are dropped, and every later block's envelope is the full one.
        istft.num_frames = self._istft.overlap
        istft.drop_blocks = self._istft.overlap - 1
        return VocosStreamState(backbone, istft)

    def decode_windows(self, windows: Sequence[MelWindow]) -> tuple[list[WindowAudio], int]:
        """Every window through one packed `stream` call (no padding, so no grouping by
        length). A window that reaches back the full left field before the samples kept runs
        without left padding: its first frames are only left context, so no layer computes
        outputs for them."""
        if self._stack is None:
            return decode_padded(self, windows)
        voc_left, hop = self.receptive_field[0], self.hop_length
        items, origins = [], []
        for window in windows:
            first = window.first_frame
            valid_left = first > 0 and (first + voc_left) * hop <= window.first_sample
            state = self._open_window() if valid_left else self.open_stream_state()
            assert state is not None
            origins.append((first + voc_left) * hop if valid_left else first * hop)
            items.append(VocoderStreamInput(state, window.mel, flush=True))
        self.stream(items)
        out = []
        for item, origin in zip(items, origins, strict=True):
            assert item.audio is not None and item.provisional is not None
            out.append((torch.cat([item.audio, item.provisional]).float().cpu(), origin))
        return out, 1

    def stream(self, items: Sequence[VocoderStreamInput]) -> None:
        """Advance every item's stream by its new mel frames, batched; fills `audio` (and, at a
        flush, `provisional`). Concatenated `audio` of all calls, then the last flush's
        `provisional`, equals `decode` of all frames (float rounding aside)."""
        assert self._stack is not None and self._istft is not None
        if not items:
            return
        device, dtype = module_device_dtype(self.vocos)
        vocos: Any = self.vocos
        states = [cast(VocosStreamState, item.state) for item in items]
        inputs = [
            StackInput(state.backbone, item.mel.to(device, dtype), item.flush)
            for state, item in zip(states, items, strict=True)
        ]
        self._stack.run(inputs)
        parts = [p for x in inputs for p in (x.committed, x.provisional) if p is not None]
        x = vocos.head.out(vocos.backbone.final_layer_norm(torch.cat(parts)))
        mag, phase = x.chunk(2, dim=1)  # as ISTFTHead.forward, in (T, C) layout
        mag = torch.clip(torch.exp(mag), max=1e2)
        spec = mag * (torch.cos(phase) + 1j * torch.sin(phase))
        if len(spec):
            frames = torch.fft.irfft(spec, self._istft.n_fft, dim=1, norm="backward")
            frames = frames * self._istft.window
        else:  # MKL's FFT rejects an empty batch
            frames = x.new_zeros((0, self._istft.n_fft))
        start = 0
        for item, state, x_in in zip(items, states, inputs, strict=True):
            assert x_in.committed is not None and x_in.provisional is not None
            num_com, num = len(x_in.committed), len(x_in.committed) + len(x_in.provisional)
            item.audio, item.provisional = self._istft.run(
                state.istft, frames[start : start + num], num_com, item.flush
            )
            start += num
