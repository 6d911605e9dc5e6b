"""What a `StreamingDecoder` runs, counted from outside it (the production classes keep no
counters): forward passes of its Decoder and vocoder, and the tokens and mel frames each
stream's share of a pass read. For tests/model/test_streaming_decode.py (batching, flat cost per
chunk) and the benchmarks."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from chattts_server.audio_constants import FRAMES_PER_TOKEN
from chattts_server.engine.streaming_decode import StreamingDecoder
from chattts_server.model.streaming_conv import StackInput
from chattts_server.model.vocoders import MelWindow, Vocoder, VocoderStreamInput, WindowAudio


class DecodeProbe:
    """Attached to one decoder: wraps its Decoder stack's `run` and its vocoder."""

    def __init__(self, sd: StreamingDecoder) -> None:
        self.num_decoder_calls = 0
        self.num_vocoder_calls = 0  # forward passes, however many streams each batched
        self.decoder_tokens: list[int] = []  # the last Decoder call: tokens fed per stream
        self.max_decoder_tokens = 0  # the most one stream fed in one call
        self.vocoder_frames: list[int] = []  # the last vocoder call: mel frames per stream
        stack = sd.decoder_stack
        run = stack.run

        def counted_run(items: Sequence[StackInput]) -> None:
            run(items)
            self.num_decoder_calls += 1
            self.decoder_tokens = [len(item.frames) // FRAMES_PER_TOKEN for item in items]
            self.max_decoder_tokens = max([self.max_decoder_tokens, *self.decoder_tokens])

        setattr(stack, "run", counted_run)  # noqa: B010 (an instance's method, replaced)
        sd.vocoder = _CountingVocoder(sd.vocoder, self)


class _CountingVocoder:
    """`inner` with `stream` and `decode_windows` counted into `probe`."""

    def __init__(self, inner: Vocoder, probe: DecodeProbe) -> None:
        self._inner = inner
        self._probe = probe

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def stream(self, items: Sequence[VocoderStreamInput]) -> None:
        self._inner.stream(items)
        self._probe.num_vocoder_calls += 1
        self._probe.vocoder_frames = [len(item.mel) for item in items]

    def decode_windows(self, windows: Sequence[MelWindow]) -> tuple[list[WindowAudio], int]:
        decoded, num_calls = self._inner.decode_windows(windows)
        self._probe.num_vocoder_calls += num_calls
        self._probe.vocoder_frames = [len(window.mel) for window in windows]
        return decoded, num_calls
