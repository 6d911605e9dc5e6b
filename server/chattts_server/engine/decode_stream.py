"""One stream's streaming decode: everything `StreamingDecoder` carries for it between chunks.

Hidden states go in (`HiddenBuffer`), chunks are planned over them (`plan_chunks`), and PCM
comes out through crossfaded seams (`SeamJoiner`). The Decoder keeps per-layer state
(`streaming_conv.py`), so each chunk feeds it only the tokens since the last one; the final mel
frames it emits go to the vocoder's state (exact mode, a vocoder that keeps one) or are held for
the vocoder's windows, as long as a later window reads them. Every change to that state is a
method here; the decoder batches the calls across streams.

Runs on the engine thread only; nothing here locks.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from ..model.mel_decoder import hidden_frames
from ..model.streaming_conv import StackInput, StackState, StreamingStack
from ..model.vocoders import MelWindow, VocoderStreamInput, VocoderStreamState
from .chunk_plan import Chunk, PlanPosition, StreamChunking, plan_chunks
from .hidden_buffer import HiddenBuffer
from .seams import SeamJoiner


class DecodeStream:
    """One utterance: its hidden states, chunk plan and seams, the Decoder's state, and the
    final mel frames held for vocoder windows or the vocoder's state and its samples."""

    def __init__(
        self, chunking: StreamChunking, vocoder_state: VocoderStreamState | None = None
    ) -> None:
        self.chunking = chunking
        self._hidden = HiddenBuffer()
        self._ended = False
        self._position = PlanPosition()
        self._seams = SeamJoiner()
        self._decoder_state: StackState | None = None
        self._fed = 0  # tokens fed to the Decoder state, which holds their left context
        self._mel: Tensor | None = None  # (frames, n_mels) final mel frames from _mel_start on
        self._mel_start = 0
        # Set: the vocoder keeps state too, and its final samples are held from _audio_start on.
        self._vocoder_state = vocoder_state
        self._audio = np.zeros(0, dtype=np.float32)
        self._audio_start = 0

    @property
    def exact(self) -> bool:
        """Left context and lookahead cover the receptive field: output equals offline."""
        return self.chunking.exact

    @property
    def done(self) -> bool:
        """Input ended and every sample emitted."""
        return self._ended and (self._hidden.num_tokens == 0 or self._position.final_planned)

    @property
    def next_token(self) -> int:
        """The first token no planned chunk covers yet."""
        return self._position.next_token

    @property
    def num_chunks(self) -> int:
        """Chunks planned so far."""
        return self._position.num_chunks

    @property
    def buffered_tokens(self) -> int:
        """Rows of hidden states held (tokens not yet fed to the Decoder)."""
        return self._hidden.held

    @property
    def held_mel_frames(self) -> int:
        """Final mel frames held for the vocoder's windows."""
        return 0 if self._mel is None else len(self._mel)

    @property
    def keeps_vocoder_state(self) -> bool:
        return self._vocoder_state is not None

    def push(self, hidden: Tensor) -> None:
        """Append hidden states (n, D) in generation order."""
        if self._ended:
            raise RuntimeError("push after end of stream")
        self._hidden.push(hidden, keep_from=self._fed)

    def end(self) -> None:
        """No more hidden states: the tail is decoded without lookahead at the next step."""
        self._ended = True

    def plan(self) -> list[Chunk]:
        """The chunks now ready, in order, each counted as planned (`plan_chunks`)."""
        chunks, self._position = plan_chunks(
            self.chunking, self._position, self._hidden.num_tokens, self._ended
        )
        return chunks

    # -- the Decoder -------------------------------------------------------------------------

    def decoder_input(
        self, chunk: Chunk, stack: StreamingStack, device: torch.device, dtype: torch.dtype
    ) -> StackInput:
        """This stream's tokens since the last feed up to `chunk`'s window end, as its share of
        one `stack.run` over every stream; flushed (held-back frames computed as if the
        stream ended at the window's end) unless exact mode mid-stream."""
        if self._decoder_state is None:
            self._decoder_state = stack.new_state(torch.empty(0, device=device, dtype=dtype))
        window = self._hidden.window(self._fed, chunk.tb)
        self._fed = chunk.tb
        frames = hidden_frames(window.to(device=device, dtype=dtype))
        return StackInput(self._decoder_state, frames, chunk.final or not self.exact)

    def take_mel(self, mel: Tensor, final: bool) -> VocoderStreamInput | None:
        """New final mel frames (n, n_mels) from the Decoder: the vocoder state's next input
        (returned, for one batched `Vocoder.stream`), or held for the vocoder's windows."""
        if self._vocoder_state is not None:
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

    # -- PCM out -----------------------------------------------------------------------------

    def emit(self, chunk: Chunk, audio: np.ndarray, origin: int) -> np.ndarray:
        """The samples `chunk` adds, from its decoded `audio` (`SeamJoiner.emit`)."""
        return self._seams.emit(chunk, audio, origin)

    def trim(self) -> None:
        """After a step: drop what no later chunk reads, or everything once done."""
        if self.done:
            self._hidden.release()
            self._mel = self._decoder_state = self._vocoder_state = None
            self._audio = self._audio[:0]
            return
        self._hidden.drop_before(self._fed)
        if self._mel is not None:
            mel_end = self._mel_start + len(self._mel)
            first_block = self._position.seam[0] // self.chunking.geometry.hop_length
            keep = max(self._mel_start, first_block - self.chunking.geometry.vocoder_left)
            keep = min(keep, mel_end)  # frames not yet final are not held either
            if keep > self._mel_start:
                self._mel = self._mel[keep - self._mel_start :].clone()
                self._mel_start = keep
        drop = self._seams.num_emitted - self._audio_start
        if drop > 0:
            self._audio = self._audio[drop:].copy()
            self._audio_start = self._seams.num_emitted
