"""One stream's stateful decode state: what `StreamingDecoder` carries from chunk to chunk.

The Decoder keeps per-layer state (`streaming_conv.py`), so each chunk feeds it only the tokens
since the last one; the final mel frames it emits go to the vocoder's state (exact mode, a
vocoder that keeps one) or are held for the vocoder's windows, as long as a later window reads
them. Every change to that state is a method here; the decoder batches the calls across streams.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from ..model.mel_decoder import hidden_frames
from ..model.streaming_conv import StackInput, StackState, StreamingStack
from ..model.vocoders import MelWindow, VocoderStreamInput, VocoderStreamState
from .chunked_stream import Chunk, ChunkedStream, ChunkGeometry
from .chunking import ChunkSchedule


class DecodeStream(ChunkedStream):
    """One utterance's decode: its chunk plan and seams (`ChunkedStream`), the Decoder's state,
    the final mel frames held for vocoder windows, or the vocoder's state and its samples."""

    def __init__(
        self,
        config: ChunkSchedule,
        geometry: ChunkGeometry,
        left_context_tokens: int,
        exact: bool,
        vocoder_state: VocoderStreamState | None = None,
    ) -> None:
        super().__init__(config, geometry, left_context_tokens, exact)
        self._decoder_state: StackState | None = None
        self._fed = 0  # tokens fed to the Decoder state
        self._mel: Tensor | None = None  # (frames, n_mels) final mel frames from _mel_start on
        self._mel_start = 0
        # Set: the vocoder keeps state too, and its final samples are held from _audio_start on.
        self._vocoder_state = vocoder_state
        self._audio = np.zeros(0, dtype=np.float32)
        self._audio_start = 0

    @property
    def keeps_vocoder_state(self) -> bool:
        return self._vocoder_state is not None

    @property
    def held_mel_frames(self) -> int:
        """Final mel frames held for the vocoder's windows."""
        return 0 if self._mel is None else len(self._mel)

    def _first_token_needed(self) -> int:
        return self._fed  # the Decoder state holds the left context

    # -- the Decoder -------------------------------------------------------------------------

    def decoder_input(
        self, chunk: Chunk, stack: StreamingStack, device: torch.device, dtype: torch.dtype
    ) -> StackInput:
        """This stream's tokens since the last feed up to `chunk`'s window end, as its share of
        one `stack.run` over every stream; flushed (held-back frames computed as if the
        stream ended at the window's end) unless exact mode mid-stream."""
        if self._decoder_state is None:
            self._decoder_state = stack.new_state(torch.empty(0, device=device, dtype=dtype))
        window = self._hidden(self._fed, chunk.tb)
        self.last_window_tokens = chunk.tb - self._fed
        self.max_window_tokens = max(self.max_window_tokens, self.last_window_tokens)
        self._fed = chunk.tb
        frames = hidden_frames(window.to(device=device, dtype=dtype))
        return StackInput(self._decoder_state, frames, chunk.final or not self.exact)

    def take_mel(self, mel: Tensor, final: bool) -> VocoderStreamInput | None:
        """New final mel frames (n, n_mels) from the Decoder: the vocoder state's next input
        (returned, for one batched `Vocoder.stream`), or held for the vocoder's windows."""
        if self._vocoder_state is not None:
            self.last_vocoder_frames = len(mel)
            return VocoderStreamInput(self._vocoder_state, mel, final)
        self._mel = mel if self._mel is None else torch.cat([self._mel, mel])
        return None

    # -- the vocoder -------------------------------------------------------------------------

    def take_audio(self, item: VocoderStreamInput) -> None:
        """The samples `Vocoder.stream` made final for this stream (at a flush, all the rest)."""
        assert item.audio is not None and item.provisional is not None
        pcm = torch.cat([item.audio, item.provisional]) if item.flush else item.audio
        self._audio = np.concatenate([self._audio, pcm.float().cpu().numpy()])

    def state_audio(self) -> tuple[np.ndarray, int]:
        """The vocoder state's samples held, and the stream's index of the first."""
        return self._audio, self._audio_start

    def mel_window(self, chunk: Chunk, provisional: Tensor | None) -> MelWindow:
        """`chunk`'s vocoder window: held final mel frames, then (short lookahead) the
        Decoder's provisional frames (n, n_mels) that follow them in this step."""
        assert self._mel is not None
        mel_end = self._mel_start + len(self._mel)
        mel = self._mel[chunk.va - self._mel_start : chunk.vb - self._mel_start]
        if chunk.vb > mel_end:
            assert provisional is not None
            mel = torch.cat([mel, provisional[max(0, chunk.va - mel_end) : chunk.vb - mel_end]])
        assert chunk.va >= self._mel_start and len(mel) == chunk.vb - chunk.va
        return MelWindow(mel, chunk.va, chunk.emit_lo, chunk.seam_end)

    # -- trimming ----------------------------------------------------------------------------

    def _trim_held(self) -> None:
        """Drop the mel frames and samples no later chunk reads."""
        if self._mel is not None:
            mel_end = self._mel_start + len(self._mel)
            first_block = self._seam[0] // self.geometry.hop_length
            keep = max(self._mel_start, first_block - self.geometry.vocoder_left)
            keep = min(keep, mel_end)  # frames not yet final are not held either
            if keep > self._mel_start:
                self._mel = self._mel[keep - self._mel_start :].clone()
                self._mel_start = keep
        drop = self._emitted - self._audio_start
        if drop > 0:
            self._audio = self._audio[drop:].copy()
            self._audio_start = self._emitted

    def _release(self) -> None:
        super()._release()
        self._mel = self._decoder_state = self._vocoder_state = None
        self._audio = self._audio[:0]
