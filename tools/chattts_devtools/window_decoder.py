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

import numpy as np
from torch import Tensor

from chattts_server.engine.chunked_stream import Chunk, ChunkedDecoder, ChunkedStream
from chattts_server.engine.chunking import ChunkSchedule
from chattts_server.model.mel_decoder import decode_mel
from chattts_server.model.receptive_field import FRAMES_PER_TOKEN
from chattts_server.model.vocoders import MelWindow, decode_padded, length_groups


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


class WindowDecoder(ChunkedDecoder[WindowStream]):
    """`StreamingDecoder`'s interface (open, step, finish, the receptive fields and counters)
    over the window path."""

    def _new_stream(self, config: ChunkSchedule, left: int, exact: bool) -> WindowStream:
        return WindowStream(config, self.geometry, left, exact)

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
