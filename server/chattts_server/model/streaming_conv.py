"""Stateful streaming through a stack of stride-1 convolutions (the ChatTTS Decoder, the Vocos
backbone), one chunk at a time, batched across streams.

Every stage is a stride-1 "same" convolution (padding p = dilation * (kernel - 1) / 2 on both
sides) followed by per-frame ops (GELU, LayerNorm, the ConvNeXt MLP and its residual add).
Offline, output frame n of a stage reads input frames n - p .. n + p, zeros outside the stream.
Streaming, each stage keeps the last 2p input frames it has seen (`StackState`); given new input
frames it emits the outputs whose inputs all exist, so each stage lags its input by p frames and
the lags add up to the stack's right receptive field. A state starts as p zeros (the left
padding), so these committed outputs equal the offline decode's.

A flush appends each stage's p zeros of right padding and so also emits the outputs the lags held
back, as if the stream ended there. At the end of a stream those are final; mid-stream (short
lookahead) they are provisional: returned, never folded into the state, so later outputs do not
depend on them. A fresh state flushed at once is a plain windowed decode.

Streams are packed: every stream's [state, new frames, right padding] is laid end to end along
time and each stage runs as one convolution and one MLP over all of them; the conv outputs that
straddle two streams are dropped before the MLP.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn


@dataclass
class Stage:
    """One stride-1 convolution and the per-frame ops after it."""

    conv: nn.Conv1d
    # A ConvNeXt block whose `dwconv` is `conv`: norm, pwconv1, act, pwconv2, layer scale and
    # the residual add run after it. None: `post` (or nothing) runs after the conv.
    block: nn.Module | None = None
    scale: Tensor | None = None  # the block's layer scale (ChatTTS `weight`, Vocos `gamma`)
    post: Callable[[Tensor], Tensor] | None = None  # per-frame op on (T, C) after a plain conv

    @property
    def pad(self) -> int:
        (k,), (d,) = self.conv.kernel_size, self.conv.dilation
        if self.conv.stride != (1,) or (d * (k - 1)) % 2:
            raise ValueError("streaming needs stride-1 convolutions with symmetric padding")
        pad = self.conv.padding
        if pad != "same" and pad != (d * (k - 1) // 2,):
            raise ValueError(f"streaming needs 'same' padding, got {pad}")
        return d * (k - 1) // 2

    def conv_valid(self, buf: Tensor) -> Tensor:
        """The convolution without padding over frames (L, C_in): (L - 2p, C_out), contiguous.

        Two transposing copies around oneDNN's convolution cost less than the convolution in
        (T, C) layout (k shifted multiply-adds for a depthwise one) on CPU.
        """
        conv = self.conv
        y = F.conv1d(
            buf.T.contiguous().unsqueeze(0),
            conv.weight,
            conv.bias,
            dilation=conv.dilation,
            groups=conv.groups,
        )
        return y[0].T.contiguous()

    def mix(self, x: Tensor, residual: Tensor) -> Tensor:
        """Per-frame ops on packed conv outputs (N, C); `residual` is the aligned input."""
        if self.block is None:
            return x if self.post is None else self.post(x)
        block: Any = self.block  # ChatTTS or Vocos ConvNeXtBlock (untyped submodules)
        y = block.pwconv2(block.act(block.pwconv1(block.norm(x))))
        if self.scale is not None:
            y = y * self.scale
        return y + residual


@dataclass
class StackState:
    """One stream's position in a stack: the input frames each stage still needs."""

    history: list[Tensor]  # per stage (<= 2p, C_in) in (T, C) layout, oldest first


@dataclass
class StackInput:
    """One stream's share of a `StreamingStack.run` call."""

    state: StackState
    frames: Tensor  # (n, C_in) new input frames, all final
    flush: bool  # also emit the held-back outputs, computed with right zero padding
    committed: Tensor | None = None  # out: (c, C_out) outputs that are final and now in the state
    provisional: Tensor | None = None  # out: (q, C_out) flush outputs past `committed`


class StreamingStack:
    """A convolution stack (`Stage`s in forward order) run chunk by chunk over many streams."""

    def __init__(self, stages: Sequence[Stage]) -> None:
        self.stages = list(stages)
        self.pads = [stage.pad for stage in self.stages]
        # Frames an output lags its input: the stack's right receptive field.
        self.delay = sum(self.pads)

    def new_state(self, like: Tensor) -> StackState:
        """A stream's state before its first frame: each stage's left zero padding."""
        history = [
            like.new_zeros((pad, stage.conv.in_channels))
            for stage, pad in zip(self.stages, self.pads, strict=True)
        ]
        return StackState(history)

    def run(self, items: Sequence[StackInput]) -> None:
        """Advance every item's stream by its new frames (one pass over all of them); fills
        `committed` and `provisional` and updates each state with the committed part only."""
        if not items:
            return
        # Per item: committed and provisional frames entering the current stage.
        com = [item.frames for item in items]
        prov = [item.frames[:0] for item in items]
        for i, (stage, pad) in enumerate(zip(self.stages, self.pads, strict=True)):
            pieces, spans = [], []
            offset = 0
            for item, c, q in zip(items, com, prov, strict=True):
                hist = item.state.history[i]
                seq = [hist, c, q]
                if item.flush:
                    seq.append(hist.new_zeros((pad, hist.shape[1])))
                length = sum(len(s) for s in seq)
                num_com = max(0, len(hist) + len(c) - 2 * pad)
                num_out = max(0, length - 2 * pad) if item.flush else num_com
                spans.append((offset, num_com, num_out))
                pieces += seq
                offset += length
            buf = torch.cat(pieces)  # (sum of lengths, C_in)
            for item, c, (o, _, _) in zip(items, com, spans, strict=True):
                # The committed input this stage must remember: its last 2p frames.
                end = o + len(item.state.history[i]) + len(c)
                item.state.history[i] = buf[end - min(end - o, 2 * pad) : end].clone()
            if not any(num_out for _, _, num_out in spans):
                com = [c[:0].new_zeros((0, stage.conv.out_channels)) for c in com]
                prov = list(com)
                continue
            y = stage.conv_valid(buf)  # (sum of lengths - 2p, C_out)
            # Outputs straddling two streams read another stream's frames: drop them.
            x = torch.cat([y[o : o + n] for o, _, n in spans])
            residual = (
                torch.cat([buf[o + pad : o + pad + n] for o, _, n in spans])
                if stage.block is not None
                else x
            )
            x = stage.mix(x, residual)
            com, prov, start = [], [], 0
            for _, num_com, num_out in spans:
                com.append(x[start : start + num_com])
                prov.append(x[start + num_com : start + num_out])
                start += num_out
        for item, c, q in zip(items, com, prov, strict=True):
            item.committed, item.provisional = c, q
