"""The window path: the streaming decode as it was before per-layer state, kept as the oracle the
stateful `StreamingDecoder` is tested and timed against (tests/model/test_streaming_decode.py,
bench/bench_lookahead.py).

Each chunk re-decodes its window [t0 - left_context, t1 + lookahead) of hidden states through
the Decoder's plain forward (`decode_mel`), then its mel window through the vocoder's plain
`decode`: no state between chunks, so nothing a stateful bug could carry. The chunk plan and the
seams are the production ones (`ChunkedStream`): the two paths cut the same chunks, so their audio
must agree (to fp32 rounding).

Batching as the production windows: Decoder (and vocoder) windows are zero-padded on the right to
a common length only when their kept outputs lie further than the receptive field from their
right edge; the others group by exact length, one call per group.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch
from torch import Tensor, nn

from chattts_server.engine.chunked_stream import (
    Chunk,
    ChunkedStream,
    ChunkGeometry,
    K,
    decode_step,
    finish_streams,
)
from chattts_server.engine.chunking import ChunkingConfig
from chattts_server.model.mel_decoder import decode_mel, decoder_receptive_field
from chattts_server.model.receptive_field import FRAMES_PER_TOKEN, ReceptiveField
from chattts_server.model.vocoders import MelWindow, Vocoder, decode_padded, length_groups


class WindowStream(ChunkedStream):
    """A stream whose chunks re-read their left context: it holds those hidden states."""

    held_mel_frames = 0  # no mel is held between steps

    def _first_token_needed(self) -> int:
        return self.next_token - self.left_context_tokens

    def decoder_window(self, chunk: Chunk) -> Tensor:
        """The hidden states (tb - ta, D) of `chunk`'s Decoder window."""
        self.last_window_tokens = chunk.tb - chunk.ta
        self.max_window_tokens = max(self.max_window_tokens, self.last_window_tokens)
        return self._hidden(chunk.ta, chunk.tb)


class WindowDecoder:
    """`StreamingDecoder`'s interface (open, step, finish, the receptive fields and counters)
    over the window path."""

    def __init__(
        self,
        decoder: nn.Module,
        vocoder: Vocoder,
        config: ChunkingConfig | None = None,
        device: torch.device | str | None = None,
    ) -> None:
        param = next(decoder.parameters())
        self.decoder = decoder
        self.vocoder = vocoder
        self.default_config = config or ChunkingConfig()
        self.device = torch.device(device) if device is not None else param.device
        self.dtype = param.dtype
        self.decoder_receptive_field: ReceptiveField = decoder_receptive_field(decoder)
        self.geometry = ChunkGeometry.of(self.decoder_receptive_field, vocoder)
        self.receptive_field_tokens: ReceptiveField = self.geometry.receptive_field_tokens
        self.hop_length = vocoder.hop_length
        self.num_decoder_calls = 0
        self.num_vocoder_calls = 0

    def open(self, config: ChunkingConfig | None = None) -> WindowStream:
        config = config or self.default_config
        left, exact = self.geometry.resolve(config)
        return WindowStream(config, self.geometry, left, exact)

    def total_samples(self, num_tokens: int) -> int:
        return self.geometry.total_samples(num_tokens)

    def step(self, streams: Mapping[K, WindowStream]) -> dict[K, np.ndarray]:
        return decode_step(streams, self._decode)

    def finish(self, streams: Mapping[K, WindowStream]) -> dict[K, np.ndarray]:
        return finish_streams(streams, self.step)

    def _decode(self, planned: list[tuple[WindowStream, Chunk]]) -> list[tuple[np.ndarray, int]]:
        windows = self._run_decoder(planned)
        decoded, num_calls = decode_padded(self.vocoder, windows)
        self.num_vocoder_calls += num_calls
        return [(audio.numpy(), origin) for audio, origin in decoded]

    def _run_decoder(self, planned: list[tuple[WindowStream, Chunk]]) -> list[MelWindow]:
        """Every chunk's Decoder window through `decode_mel`: its vocoder window of mel."""
        dec_right = self.decoder_receptive_field[1]
        hiddens = [stream.decoder_window(chunk) for stream, chunk in planned]
        chunks = [chunk for _, chunk in planned]

        def right_safe(i: int) -> bool:  # right zero-padding cannot reach the mel frames kept
            return chunks[i].vb + dec_right <= FRAMES_PER_TOKEN * chunks[i].tb

        out: dict[int, MelWindow] = {}
        for length, group in length_groups(
            range(len(planned)), lambda i: len(hiddens[i]), right_safe
        ):
            first = hiddens[group[0]]
            x = first.new_zeros((len(group), length, first.shape[1]))  # (B, tokens, D)
            for row, i in enumerate(group):
                x[row, : len(hiddens[i])] = hiddens[i]
            x = x.to(device=self.device, dtype=self.dtype).transpose(1, 2)  # (B, D, tokens)
            mel = decode_mel(self.decoder, x)  # (B, n_mels, 2 * tokens)
            self.num_decoder_calls += 1
            for row, i in enumerate(group):
                c = chunks[i]
                offset = FRAMES_PER_TOKEN * c.ta
                window = mel[row, :, c.va - offset : c.vb - offset].T  # (frames, n_mels)
                out[i] = MelWindow(window, c.va, c.emit_lo, c.seam_end)
        return [out[i] for i in range(len(planned))]
