"""The ChatTTS Decoder (a DVAE without encoder): GPT hidden states -> log-mel.

Hidden states (B, 2*idim, T tokens) are read as two mel-rate frames per token, then conv_in,
12 ConvNeXt blocks and out_conv give a log-mel (B, 100, 2T). `decode_mel` runs it;
`decoder_receptive_field` measures it from its layers.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn

from .receptive_field import ReceptiveField, stride1_receptive_field


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
