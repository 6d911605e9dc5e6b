"""Vocoders and receptive fields: computed fields match probes, adapters match upstream, HiFi-GAN loads.

Modules are ChatTTS/vocos classes (and our HiFi-GAN) with random weights, narrow but with the
official kernels, dilations and layer counts, so their receptive fields are the real ones.
"""

from __future__ import annotations

from dataclasses import asdict

import pytest
import torch
from torch import nn

from chattts_server.model.hifigan import HiFiGANGenerator, HiFiGANVocoder
from chattts_server.model.mel_decoder import decode_mel, decoder_receptive_field
from chattts_server.model.receptive_field import combined_receptive_field_tokens, frames_to_tokens
from chattts_server.model.vocoders import num_samples
from chattts_server.model.vocos import VocosVocoder
from tiny_modules import HIDDEN, TINY_HIFIGAN, hidden_walk, tiny_decoder, tiny_hifigan, tiny_vocos


def test_decode_mel_matches_chattts_decoder_forward() -> None:
    decoder = tiny_decoder()
    hiddens = hidden_walk(40).T[None].contiguous()  # (1, D, T)
    reference = decoder(hiddens.clone())  # ChatTTS DVAE.forward (decode mode)
    ours = decode_mel(decoder, hiddens)
    assert ours.shape == (1, 100, 80)
    torch.testing.assert_close(ours, reference, rtol=0, atol=0)


def test_vocos_adapter_matches_vocos_decode() -> None:
    vocos = tiny_vocos()
    vocoder = VocosVocoder(vocos)
    mel = torch.randn(2, 100, 30)
    reference = vocos.decode(mel)
    ours = vocoder.decode(mel)
    torch.testing.assert_close(ours, reference, rtol=0, atol=0)
    assert ours.shape == (2, num_samples(vocoder, 30)) == (2, 29 * 256)
    assert (vocoder.sample_rate, vocoder.hop_length, vocoder.n_mels) == (24000, 256, 100)


def test_hifigan_shapes_and_output_range() -> None:
    vocoder = HiFiGANVocoder(tiny_hifigan())
    with torch.inference_mode():
        audio = vocoder.decode(torch.randn(1, 100, 12))
    assert audio.shape == (1, 12 * 256) and vocoder.end_trim_samples == 0
    assert audio.abs().max() <= 1.0 and audio.std() > 0.01


def test_receptive_fields_at_official_shapes() -> None:
    # Built on the meta device: shapes without memory. Widths do not change the fields, the
    # kernels, dilations and layer counts do.
    from ChatTTS.config import Config
    from ChatTTS.model import DVAE
    from vocos import Vocos
    from vocos.feature_extractors import MelSpectrogramFeatures
    from vocos.pretrained import instantiate_class

    config = Config()
    with torch.device("meta"):
        decoder = DVAE(decoder_config=asdict(config.decoder), dim=config.decoder.idim)
        backbone = instantiate_class(args=(), init=asdict(config.vocos.backbone))
        head = instantiate_class(args=(), init=asdict(config.vocos.head))
        hifigan = HiFiGANVocoder(HiFiGANGenerator())
    # The mel front end computes its filterbank eagerly, which the meta device cannot.
    vocos = VocosVocoder(Vocos(MelSpectrogramFeatures(), backbone, head))
    assert decoder_receptive_field(decoder) == (75, 75)
    assert frames_to_tokens(decoder_receptive_field(decoder)) == (38, 38)
    assert vocos.backbone_receptive_field == (27, 27)
    assert vocos.receptive_field == (28, 29)  # + iSTFT: frames j-1 .. j+2 overlap block j
    assert hifigan.receptive_field == (13, 13)
    assert combined_receptive_field_tokens((75, 75), vocos.receptive_field) == (52, 52)
    assert combined_receptive_field_tokens((75, 75), hifigan.receptive_field) == (44, 44)


def _gradient_field(fn, x: torch.Tensor, out_lo: int, out_hi: int, in_block: int, centre: int):
    """(left, right) in input frames (blocks of `in_block` positions) that outputs [lo, hi) read.

    The gradient of the outputs is structurally zero exactly outside their dependency set, so
    unlike a finite perturbation it cannot lose far, weak dependencies to rounding.
    """
    x = x.clone().requires_grad_(True)
    fn(x)[..., out_lo:out_hi].sum().backward()
    assert x.grad is not None
    touched = (x.grad.abs().sum(dim=(0, 1)) > 0).nonzero().flatten() // in_block
    return centre - int(touched.min()), int(touched.max()) - centre


def _perturbation_span(fn, x: torch.Tensor, frame: int, hop: int) -> tuple[int, int]:
    """Sample blocks whose output changes when one input frame changes (float64, exact zero)."""
    with torch.no_grad():
        base = fn(x)
        bumped = x.clone()
        bumped[..., frame] += 1.0
        diff = fn(bumped) - base
        changed = (diff.reshape(-1, diff.shape[-1]) != 0).any(dim=0).nonzero().flatten() // hop
    return int(changed.min()), int(changed.max())


def _decoder_by_frames(decoder: nn.Module):
    # Lay input frames out on the time axis: (1, idim, 2T) -> the (1, 2*idim, T) hidden states.
    def run(frames: torch.Tensor) -> torch.Tensor:
        b, c, n = frames.shape
        hiddens = frames.view(b, c, n // 2, 2).permute(0, 3, 1, 2).reshape(b, 2 * c, n // 2)
        return decode_mel(decoder, hiddens)

    return run


def test_decoder_receptive_field_matches_probe() -> None:
    decoder = tiny_decoder().double()
    left, right = decoder_receptive_field(decoder)
    run = _decoder_by_frames(decoder)
    frames = torch.randn(1, HIDDEN // 2, 180, dtype=torch.float64)
    # The frame layout round-trips: the same mel as the token layout.
    hiddens = frames.view(1, HIDDEN // 2, 90, 2).permute(0, 3, 1, 2).reshape(1, HIDDEN, 90)
    torch.testing.assert_close(run(frames), decode_mel(decoder, hiddens))
    assert _gradient_field(run, frames, 90, 91, 1, 90) == (left, right)
    lo, hi = _perturbation_span(run, frames, 90, 1)
    assert (lo, hi) == (90 - right, 90 + left)


@pytest.mark.parametrize("name", ["vocos", "hifigan"])
def test_vocoder_receptive_field_matches_probe(name: str) -> None:
    vocoder = (
        VocosVocoder(tiny_vocos().double())
        if name == "vocos"
        else HiFiGANVocoder(tiny_hifigan().double())
    )
    left, right = vocoder.receptive_field
    hop, frames, j = vocoder.hop_length, 120, 60
    mel = torch.randn(1, 100, frames, dtype=torch.float64)
    assert _gradient_field(vocoder.decode, mel, j * hop, (j + 1) * hop, 1, j) == (left, right)
    # Frame j changes exactly blocks j - right .. j + left (nothing outside, in float64).
    lo, hi = _perturbation_span(vocoder.decode, mel, j, hop)
    # Far, weak dependencies can round away even in float64; nothing outside may change.
    assert j - right <= lo < j < hi <= j + left


def _official_style(generator: HiFiGANGenerator, parametrize: bool) -> nn.Module:
    """A copy with weight norm on every conv, as the official repository trains it."""
    import copy

    wn = torch.nn.utils.parametrizations.weight_norm if parametrize else torch.nn.utils.weight_norm
    model = copy.deepcopy(generator)
    for module in list(model.modules()):
        if isinstance(module, (nn.Conv1d, nn.ConvTranspose1d)):
            wn(module)
    return model


@pytest.mark.parametrize("layout", ["official", "parametrizations", "bare"])
def test_hifigan_loads_checkpoint(tmp_path, layout: str) -> None:
    import warnings

    source = tiny_hifigan(seed=5)
    # Perturb the weight-norm magnitudes so folding them is actually exercised.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # torch.nn.utils.weight_norm is deprecated
        model = (
            _official_style(source, parametrize=layout == "parametrizations")
            if layout != "bare"
            else source
        )
    if layout == "official":
        for name, param in model.named_parameters():
            if name.endswith("weight_g"):
                param.data.mul_(1.3)
        assert any(k.endswith("weight_v") for k in model.state_dict())
        payload: object = {"generator": model.state_dict()}
    elif layout == "parametrizations":
        assert any("parametrizations.weight.original0" in k for k in model.state_dict())
        payload = {"generator": model.state_dict()}
    else:
        payload = model.state_dict()
    path = tmp_path / "g_02500000"
    torch.save(payload, path)

    vocoder = HiFiGANVocoder.from_checkpoint(path, TINY_HIFIGAN)
    mel = torch.randn(1, 100, 16)
    with torch.no_grad():
        expected = model(mel).squeeze(1)
        got = vocoder.decode(mel)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)


def test_hifigan_rejects_mismatched_checkpoint(tmp_path) -> None:
    path = tmp_path / "g"
    torch.save({"generator": tiny_hifigan().state_dict()}, path)
    with pytest.raises(RuntimeError):
        HiFiGANVocoder.from_checkpoint(path)  # saved with 16 channels, loaded as 512


def test_stateful_stacks_equal_offline_decode_chunk_by_chunk() -> None:
    # The Decoder stack and the Vocos stream (backbone state + overlap-add iSTFT), fed in uneven
    # chunks with a flush at the end, equal one offline decode; a flush mid-stream equals the
    # offline decode of the frames so far and leaves the state as if it had not happened.
    from chattts_server.model.mel_decoder import decode_mel, decoder_stack, hidden_frames
    from chattts_server.model.streaming_conv import StackInput
    from chattts_server.model.vocoders import VocoderStreamInput

    decoder, vocoder = tiny_decoder(), VocosVocoder(tiny_vocos())
    hiddens = hidden_walk(60)
    with torch.inference_mode():
        mel = decode_mel(decoder, hiddens.T[None].clone())[0].T  # (frames, n_mels)
        audio = vocoder.decode(mel.T[None])[0]
        stack = decoder_stack(decoder)
        assert stack.delay == 75
        state = stack.new_state(hiddens)
        mels, pos = [], 0
        for n in (1, 5, 30, 2, 22):
            end = pos + n
            # A flush mid-stream (at 36 tokens) gives provisional frames, dropped here.
            item = StackInput(state, hidden_frames(hiddens[pos:end]), flush=end in (36, 60))
            stack.run([item])
            assert item.committed is not None and item.provisional is not None
            mels.append(item.committed)
            if end == 36:
                window = decode_mel(decoder, hiddens[:end].T[None].clone())[0].T
                assert torch.allclose(torch.cat([*mels, item.provisional]), window, atol=1e-4)
            elif end == 60:
                mels.append(item.provisional)
            pos = end
        assert torch.allclose(torch.cat(mels), mel, atol=1e-4)
        stream, parts, pos = vocoder.open_stream_state(), [], 0
        assert stream is not None
        for n in (3, 1, 40, 9, 67):
            v = VocoderStreamInput(stream, mel[pos : pos + n], flush=pos + n == 120)
            vocoder.stream([v])
            assert v.audio is not None and v.provisional is not None
            parts += [v.audio, v.provisional]
            pos += n
        streamed = torch.cat(parts)
        assert streamed.shape == audio.shape
        assert (streamed - audio).abs().max() <= 1e-5
