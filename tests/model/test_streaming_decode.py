"""Streaming decode against the offline decode of all tokens (ChatTTS Decoder + vocoder), and
short lookahead against the chunked oracle (`chunked_offline`: each chunk's samples from an
offline decode of the tokens before its window end, joined at the planned seams).

Tolerances: exact mode (left context and lookahead >= the receptive field) must match the
offline decode to 1e-4 absolute in fp32 (observed ~1e-7: only summation order differs), and
short lookahead the chunked oracle to the same. Against the offline decode of all tokens, short
lookahead must keep the length, stay above 20 dB SNR and have no clicks at seams.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from chattts_devtools.decode_probe import DecodeProbe
from chattts_server.engine.chunking import ChunkSchedule
from chattts_server.engine.decode_stream import DecodeStream
from chattts_server.engine.streaming_decode import StreamingDecoder
from chattts_server.model.hifigan import HiFiGANVocoder
from chattts_server.model.vocoders import Vocoder
from chattts_server.model.vocos import VocosVocoder
from decode_oracle import chunked_offline, offline, stream_all
from tiny_modules import hidden_walk, tiny_decoder, tiny_hifigan, tiny_vocos

EXACT_TOL = 1e-4


@pytest.fixture(scope="module")
def decoder() -> torch.nn.Module:
    return tiny_decoder()


@pytest.fixture(scope="module")
def vocoders() -> dict[str, Vocoder]:
    return {"vocos": VocosVocoder(tiny_vocos()), "hifigan": HiFiGANVocoder(tiny_hifigan())}


@pytest.fixture(scope="module", params=["vocos", "hifigan"])
def vocoder(request, vocoders) -> Vocoder:
    return vocoders[request.param]


def assert_close_without_seam_clicks(
    sd: StreamingDecoder, hiddens: torch.Tensor, config: ChunkSchedule, reference: np.ndarray
) -> None:
    """`hiddens` streamed under a short lookahead, against offline: the same length, aligned
    and close (random weights: a loose bound; see bench_lookahead.py), and no jump in the
    error at a seam (its sample-to-sample step stays far below the signal's)."""
    streamed = stream_all(sd, hiddens, config)
    assert streamed.shape == reference.shape
    error = streamed - reference
    assert 10 * np.log10(np.sum(reference**2) / np.sum(error**2)) > 20
    ref_step = np.abs(np.diff(reference)).max()
    for seam in np.cumsum(config.schedule(len(hiddens)))[:-1] * sd.geometry.samples_per_token:
        assert np.abs(np.diff(error[seam - 600 : seam + 600])).max() <= 0.15 * ref_step


@pytest.mark.parametrize(
    "name,first,growth,cap,push_sizes",
    [
        ("vocos", 4, 1.0, 4, (1,)),
        ("vocos", 8, 2.0, 32, (1,)),
        ("vocos", 4, 2.0, 16, (3, 1, 7)),
        ("vocos", 8, 1.5, 24, (5,)),
        # HiFi-GAN runs at the sample rate and is slower on CPU: two schedules.
        ("hifigan", 4, 2.0, 16, (3, 1, 7)),
        ("hifigan", 8, 1.5, 24, (5,)),
    ],
)
def test_exact_mode_equals_offline(decoder, vocoders, name, first, growth, cap, push_sizes) -> None:
    vocoder = vocoders[name]
    sd = StreamingDecoder(decoder, vocoder)
    left, right = sd.receptive_field_tokens
    config = ChunkSchedule(
        first_chunk_tokens=first,
        growth=growth,
        max_chunk_tokens=cap,
        left_context_tokens=left,
        lookahead_tokens=right,
    )
    hiddens = hidden_walk(131)
    reference = offline(decoder, vocoder, hiddens)
    assert len(reference) == sd.total_samples(131)
    streamed = stream_all(sd, hiddens, config, push_sizes)
    assert sd.open(config).exact
    assert streamed.shape == reference.shape
    assert np.abs(reference).max() > 0.05  # a real signal, so the tolerance means something
    assert np.abs(streamed - reference).max() <= EXACT_TOL


def test_exact_mode_defaults_left_context_to_receptive_field(decoder) -> None:
    sd = StreamingDecoder(decoder, VocosVocoder(tiny_vocos()))
    assert sd.receptive_field_tokens == (52, 52)
    stream = sd.open(ChunkSchedule(lookahead_tokens=52))
    assert stream.chunking.left_context_tokens == 52 and stream.exact
    assert not sd.open(ChunkSchedule(lookahead_tokens=51)).exact
    # A short first lookahead leaves exact mode too.
    assert not sd.open(ChunkSchedule(lookahead_tokens=52, first_lookahead_tokens=4)).exact


def test_short_streams_and_empty_stream(decoder, vocoder) -> None:
    sd = StreamingDecoder(decoder, vocoder)
    for num_tokens in (1, 2, 5):
        hiddens = hidden_walk(num_tokens, seed=num_tokens)
        for config in (ChunkSchedule(lookahead_tokens=52), ChunkSchedule()):
            streamed = stream_all(sd, hiddens, config)
            reference = offline(decoder, vocoder, hiddens)
            # Never more tokens than one window: both modes see everything, so both are exact.
            assert streamed.shape == reference.shape
            assert np.abs(streamed - reference).max() <= EXACT_TOL
    stream = sd.open()
    out = sd.finish({7: stream})
    assert list(out) == [7] and out[7].shape == (0,) and stream.done
    with pytest.raises(RuntimeError):
        stream.push(hidden_walk(1))


@pytest.mark.parametrize("mode", ["exact", "short"])
def test_batched_streams_equal_each_alone(decoder, mode) -> None:
    vocoder = VocosVocoder(tiny_vocos())
    sd = StreamingDecoder(decoder, vocoder)
    probe = DecodeProbe(sd)
    config = (
        ChunkSchedule(lookahead_tokens=52) if mode == "exact" else ChunkSchedule(lookahead_tokens=4)
    )
    lengths = (37, 90, 133)
    inputs = [hidden_walk(n, seed=10 + n) for n in lengths]
    alone = [stream_all(StreamingDecoder(decoder, vocoder), h, config) for h in inputs]

    streams = [sd.open(config) for _ in lengths]
    parts: dict[int, list[np.ndarray]] = {i: [] for i in range(len(streams))}
    for t in range(max(lengths)):
        live = {}
        for i, (stream, hiddens) in enumerate(zip(streams, inputs, strict=True)):
            if t < len(hiddens):
                stream.push(hiddens[t : t + 1])
                live[i] = stream
        for i, pcm in sd.step(live).items():
            parts[i].append(pcm)
        ended = {i: s for i, s in enumerate(streams) if t == len(inputs[i]) - 1}
        for i, pcm in sd.finish(ended).items():
            parts[i].append(pcm)
    batched = [np.concatenate(parts[i]) for i in range(len(streams))]
    for got, want in zip(batched, alone, strict=True):
        assert got.shape == want.shape
        assert np.abs(got - want).max() <= 1e-5
    num_chunks = sum(s.num_chunks for s in streams)
    assert probe.num_decoder_calls < num_chunks and probe.num_vocoder_calls < num_chunks


def test_ready_chunks_of_several_streams_share_one_call(decoder) -> None:
    sd = StreamingDecoder(decoder, VocosVocoder(tiny_vocos()))
    probe = DecodeProbe(sd)
    # Mid-stream in exact mode every window is right-safe: different lengths pad into one call.
    config = ChunkSchedule(lookahead_tokens=52, first_chunk_tokens=8, max_chunk_tokens=32)
    streams = [sd.open(config) for _ in range(3)]
    for stream, n in zip(streams, (60, 70, 100), strict=True):
        stream.push(hidden_walk(n, seed=n))
    out = sd.step(dict(enumerate(streams)))
    assert set(out) == {0, 1, 2}
    assert sum(s.num_chunks for s in streams) == 1 + 1 + 2
    assert (probe.num_decoder_calls, probe.num_vocoder_calls) == (1, 1)


def test_short_lookahead_streams_in_steady_state_share_one_call(decoder) -> None:
    # Short lookahead: windows are not right-safe, so batching needs equal lengths, which every
    # stream past its first left context has. Streams start 8 steps apart, chunking in phase.
    sd = StreamingDecoder(decoder, VocosVocoder(tiny_vocos()))
    probe = DecodeProbe(sd)
    config = ChunkSchedule(first_chunk_tokens=8, growth=1.0, max_chunk_tokens=8, lookahead_tokens=4)
    starts = (0, 8, 16)
    inputs = [hidden_walk(120, seed=s) for s in starts]
    streams = [sd.open(config) for _ in starts]
    steady_steps = 0
    for step in range(120 + starts[-1]):
        for stream, start, hiddens in zip(streams, starts, inputs, strict=True):
            if 0 <= step - start < len(hiddens):
                stream.push(hiddens[step - start : step - start + 1])
        calls = probe.num_decoder_calls, probe.num_vocoder_calls
        out = sd.step(dict(enumerate(streams)))
        if len(out) == 3 and min(s.next_token for s in streams) > 52 + 8:
            steady_steps += 1
            assert probe.num_decoder_calls == calls[0] + 1
            assert probe.num_vocoder_calls == calls[1] + 1
    assert steady_steps >= 5


def test_flat_cost_and_bounded_memory(decoder) -> None:
    sd = StreamingDecoder(decoder, VocosVocoder(tiny_vocos()))
    probe = DecodeProbe(sd)
    config = ChunkSchedule(
        first_chunk_tokens=4, growth=2.0, max_chunk_tokens=16, lookahead_tokens=8
    )
    left = sd.receptive_field_tokens[0]
    bound = left + config.max_chunk_tokens + config.lookahead_tokens
    windows: list[tuple[int, int]] = []
    held: list[tuple[int, int]] = []

    def record(stream: DecodeStream) -> None:
        windows.append((probe.decoder_tokens[-1], probe.vocoder_frames[-1]))
        held.append((stream.buffered_tokens, stream.held_mel_frames))

    stream_all(sd, hidden_walk(300), config, on_step=record)
    assert len(windows) >= 15
    assert max(w for w, _ in windows) <= bound
    # Past the growth phase every chunk costs the same: the window does not grow with position.
    steady = windows[len(windows) // 3 :]
    assert len(set(steady)) == 1
    # The Decoder reads only new tokens: its state holds the left context.
    assert steady[0][0] == config.max_chunk_tokens
    assert max(h for h, _ in held) <= config.max_chunk_tokens + config.lookahead_tokens
    # The final mel held for the vocoder's windows stays flat too.
    assert len(set(held[len(held) // 3 :])) == 1 and max(m for _, m in held) <= 2 * bound


def test_short_lookahead_keeps_length_and_has_no_seam_clicks(decoder, vocoder) -> None:
    sd = StreamingDecoder(decoder, vocoder)
    hiddens = hidden_walk(160, seed=7)
    reference = offline(decoder, vocoder, hiddens)
    # The default (crossfaded seams) must keep the length whatever the lookahead.
    default = stream_all(sd, hiddens, ChunkSchedule())
    assert default.shape == reference.shape == (sd.total_samples(160),)

    config = ChunkSchedule(lookahead_tokens=4)  # far below the 52-token receptive field
    assert not sd.open(config).exact
    assert_close_without_seam_clicks(sd, hiddens, config, reference)


def test_crossfade_removes_the_step_of_a_hard_cut(decoder) -> None:
    # HiFi-GAN has no overlap-add to soften a cut, so a hard seam shows as a step in the error.
    vocoder = HiFiGANVocoder(tiny_hifigan())
    sd = StreamingDecoder(decoder, vocoder)
    hiddens = hidden_walk(120, seed=9)
    reference = offline(decoder, vocoder, hiddens)
    seams = np.arange(1, 15) * 8 * 2 * sd.hop_length  # the hard cuts: chunk borders
    steps = {}
    for fade in (0, 512):
        config = ChunkSchedule(
            first_chunk_tokens=8,
            growth=1.0,
            max_chunk_tokens=8,
            left_context_tokens=2,
            lookahead_tokens=2,
            crossfade_samples=fade,
        )
        streamed = stream_all(sd, hiddens, config)
        assert streamed.shape == reference.shape
        steps[fade] = np.abs(np.diff(streamed - reference))[seams - 1].mean()
    assert steps[512] < 0.5 * steps[0]


@pytest.mark.parametrize(
    "name,lookahead,first,growth,cap,push_sizes",
    [
        ("vocos", 4, 8, 2.0, 32, (1,)),
        ("vocos", 8, 4, 1.5, 16, (3, 1, 7)),
        ("vocos", 20, 8, 2.0, 24, (5,)),
        ("hifigan", 4, 8, 2.0, 16, (2, 1)),
    ],
)
def test_stateful_short_lookahead_equals_chunked_offline(
    decoder, vocoders, name, lookahead, first, growth, cap, push_sizes
) -> None:
    # What the stateful path computes from carried state (final mel, and the provisional frames
    # from a copy of the state) is what an offline decode of the tokens before each chunk's
    # window end gives; left context at the receptive field (the default).
    vocoder = vocoders[name]
    config = ChunkSchedule(
        first_chunk_tokens=first, growth=growth, max_chunk_tokens=cap, lookahead_tokens=lookahead
    )
    hiddens = hidden_walk(150, seed=lookahead)
    stateful = StreamingDecoder(decoder, vocoder)
    assert not stateful.open(config).exact
    got = stream_all(stateful, hiddens, config, push_sizes)
    want = chunked_offline(stateful, hiddens, config)
    assert got.shape == want.shape
    assert np.abs(got - want).max() <= EXACT_TOL


@pytest.mark.parametrize("name", ["vocos", "hifigan"])
def test_the_short_first_chunk_keeps_length_no_clicks_and_equals_chunked_offline(
    decoder, vocoders, name
):
    # The server's schedule (--first-chunk-tokens 4, --first-lookahead-tokens 4): a shorter
    # first chunk with a shorter lookahead than the chunks after it. Same length as offline, no
    # step in the error at the seams, and each chunk is still the offline decode of the tokens
    # before its window end.
    vocoder = vocoders[name]
    config = ChunkSchedule(first_chunk_tokens=4, lookahead_tokens=8, first_lookahead_tokens=4)
    assert (config.first_chunk_tokens, config.lookahead_of(0), config.lookahead_of(1)) == (4, 4, 8)
    hiddens = hidden_walk(120, seed=11)
    reference = offline(decoder, vocoder, hiddens)
    sd = StreamingDecoder(decoder, vocoder)
    assert_close_without_seam_clicks(sd, hiddens, config, reference)
    want = chunked_offline(sd, hiddens, config)
    assert np.abs(stream_all(sd, hiddens, config, (3, 1)) - want).max() <= EXACT_TOL


@pytest.mark.parametrize("name", ["vocos", "hifigan"])
def test_stateful_exact_streams_starting_and_ending_apart_equal_offline(
    decoder, vocoders, name
) -> None:
    # Five streams of different lengths join and leave at different steps, each pushing its own
    # sizes; every step with ready chunks is one Decoder call (and one vocoder call while all
    # ready streams are mid-stream).
    vocoder = vocoders[name]
    sd = StreamingDecoder(decoder, vocoder)
    probe = DecodeProbe(sd)
    left, right = sd.receptive_field_tokens
    config = ChunkSchedule(
        first_chunk_tokens=4, growth=2.0, max_chunk_tokens=16, lookahead_tokens=right
    )
    starts, lengths = (0, 3, 11, 30, 31), (120, 70, 95, 9, 61)
    inputs = [hidden_walk(n, seed=20 + i) for i, n in enumerate(lengths)]
    streams = [sd.open(config) for _ in starts]
    assert all(s.exact for s in streams)
    parts: dict[int, list[np.ndarray]] = {i: [] for i in range(len(streams))}
    pos = [0] * len(streams)
    for step in range(200):
        live = {}
        for i, (stream, start, hiddens) in enumerate(zip(streams, starts, inputs, strict=True)):
            if step >= start and pos[i] < len(hiddens):
                n = 1 + (step + i) % 3
                stream.push(hiddens[pos[i] : pos[i] + n])
                pos[i] += n
                live[i] = stream
        ended = {i: streams[i] for i in live if pos[i] >= len(inputs[i])}
        calls = probe.num_decoder_calls
        out = sd.step({i: s for i, s in live.items() if i not in ended})
        assert probe.num_decoder_calls - calls == (1 if out else 0)
        for i, pcm in out.items():
            parts[i].append(pcm)
        for i, pcm in sd.finish(ended).items():
            parts[i].append(pcm)
    for i, hiddens in enumerate(inputs):
        assert streams[i].done
        got = np.concatenate(parts[i])
        want = offline(decoder, vocoder, hiddens)
        assert got.shape == want.shape
        assert np.abs(got - want).max() <= EXACT_TOL


def test_stateful_state_follows_the_decoder_dtype_not_the_pushed_one(decoder) -> None:
    # The GPT hands over bf16 hidden states to an fp32 Decoder: the carried state is the
    # Decoder's dtype, and the audio matches the chunked oracle's (of the same bf16 values).
    sd = StreamingDecoder(decoder, VocosVocoder(tiny_vocos()))
    hiddens = hidden_walk(90, seed=5).bfloat16()
    got = stream_all(sd, hiddens)
    want = chunked_offline(sd, hiddens)
    assert got.dtype == np.float32 and got.shape == want.shape
    assert np.abs(got - want).max() <= EXACT_TOL


def test_vocoder_without_stream_state_decodes_windows(decoder) -> None:
    # A Vocos that cannot run chunk by chunk ("same" iSTFT padding) answers that it keeps no
    # state, as HiFi-GAN does: exact mode then decodes windows and still equals offline.
    from vocos import Vocos
    from vocos.feature_extractors import MelSpectrogramFeatures
    from vocos.heads import ISTFTHead
    from vocos.models import VocosBackbone

    torch.manual_seed(1)
    vocos = Vocos(
        feature_extractor=MelSpectrogramFeatures(),
        backbone=VocosBackbone(input_channels=100, dim=64, intermediate_dim=192, num_layers=8),
        head=ISTFTHead(dim=64, n_fft=1024, hop_length=256, padding="same"),
    ).eval()
    vocoder = VocosVocoder(vocos)
    assert vocoder.open_stream_state() is None
    assert HiFiGANVocoder(tiny_hifigan()).open_stream_state() is None
    sd = StreamingDecoder(decoder, vocoder)
    config = ChunkSchedule(lookahead_tokens=sd.receptive_field_tokens[1])
    assert sd.open(config).exact and not sd.open(config).keeps_vocoder_state
    hiddens = hidden_walk(90, seed=4)
    reference = offline(decoder, vocoder, hiddens)
    streamed = stream_all(sd, hiddens, config, (3, 1))
    assert streamed.shape == reference.shape
    assert np.abs(reference).max() > 0.05
    assert np.abs(streamed - reference).max() <= EXACT_TOL
