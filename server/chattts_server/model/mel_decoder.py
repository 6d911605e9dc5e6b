"""The ChatTTS Decoder (a DVAE without encoder): GPT hidden states -> log-mel.

Hidden states (B, 2*idim, T tokens) are read as two mel-rate frames per token, then conv_in,
12 ConvNeXt blocks and out_conv give a log-mel (B, 100, 2T). `decode_mel` runs it;
`decoder_receptive_field` measures it from its layers; `decoder_stack` runs it chunk by chunk
with per-layer state (`streaming_conv.py`).
"""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn

from .receptive_field import ReceptiveField, stride1_receptive_field
from .streaming_conv import Stage, StreamingStack


def decode_mel(decoder: nn.Module, hiddens: Tensor) -> Tensor:
    """ChatTTS Decoder forward: hiddens (B, 2*idim, T) -> log-mel (B, 100, 2T).

    The same arithmetic as `ChatTTS.model.DVAE.forward` in decode mode without a VQ layer
    (tests hold the two equal), without its `inference_mode` decorator so callers choose the
    grad mode (the receptive-field probe needs gradients).
    """
    dvae: Any = decoder  # ChatTTS DVAE; its submodules are untyped
    b, c, t = hiddens.shape
    # (B, 2*idim, T) -> (B, idim, 2T): frame 2t is the first half of token t, 2t+1 the second.
    x = hiddens.view(b, 2, c // 2, t).permute(0, 2, 3, 1).flatten(2)
    mel = dvae.out_conv(dvae.decoder(x))
    return mel * dvae.coef


def _decoder_convs(decoder: nn.Module) -> list[nn.Module]:
    dvae: Any = decoder
    inner = dvae.decoder  # ChatTTS DVAEDecoder
    layers: list[nn.Module] = [m for m in inner.conv_in if isinstance(m, nn.Conv1d)]
    layers += [block.dwconv for block in inner.decoder_block]
    layers += [inner.conv_out, dvae.out_conv]
    return layers


def decoder_receptive_field(decoder: nn.Module) -> ReceptiveField:
    """(left, right) mel frames of Decoder input that one output mel frame depends on.

    Everything between the convolutions (LayerNorm, GELU, the pointwise MLP, coef) acts per
    frame, so the convolutions alone set the field. Official shapes: (75, 75).
    """
    return stride1_receptive_field(_decoder_convs(decoder))


def decoder_stack(decoder: nn.Module) -> StreamingStack:
    """The Decoder as a `StreamingStack` over mel-rate frames (see `hidden_frames`)."""
    dvae: Any = decoder
    if getattr(dvae, "vq_layer", None) is not None:
        raise ValueError("streaming reads hidden states; this DVAE has a VQ layer")
    inner = dvae.decoder
    conv_in, act, conv_hidden = inner.conv_in
    coef = dvae.coef.reshape(1, -1)  # (1, n_mels): per band, as (T, C) frames
    stages = [Stage(conv_in, post=act), Stage(conv_hidden)]
    stages += [Stage(b.dwconv, block=b, scale=b.weight) for b in inner.decoder_block]
    stages += [Stage(inner.conv_out), Stage(dvae.out_conv, post=lambda mel: mel * coef)]
    return StreamingStack(stages)


def hidden_frames(hiddens: Tensor) -> Tensor:
    """Hidden states (T tokens, 2*idim) as the Decoder's input frames (2T, idim), (T, C) layout:
    frame 2t is the first half of token t's state, 2t+1 the second (as `decode_mel` reads them)."""
    return hiddens.reshape(2 * hiddens.shape[0], hiddens.shape[1] // 2)
