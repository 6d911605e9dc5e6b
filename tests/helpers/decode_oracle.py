"""The references a streaming decode is held to (tests/model/test_streaming_decode.py): the
offline decode of all tokens, and the chunked oracle for short lookahead; and `stream_all`,
which streams an utterance as the engine would."""

from __future__ import annotations

import numpy as np
import torch

from chattts_server.engine.chunk_plan import PlanPosition, plan_chunks
from chattts_server.engine.chunking import ChunkSchedule
from chattts_server.engine.seams import SeamJoiner
from chattts_server.engine.streaming_decode import StreamingDecoder
from chattts_server.model.vocoders import Vocoder
from chattts_server.model.vocos import VocosVocoder


def offline(decoder: torch.nn.Module, vocoder: Vocoder, hiddens: torch.Tensor) -> np.ndarray:
    """The reference: ChatTTS's own Decoder forward, then the vocoder, over all tokens at once."""
    with torch.inference_mode():
        mel = decoder(hiddens.T[None].clone())
        if isinstance(vocoder, VocosVocoder):
            audio = vocoder.vocos.decode(mel)  # vocos.Vocos.decode, as ChatTTS calls it
        else:
            audio = vocoder.decode(mel)
    return audio[0].float().numpy()


def chunked_offline(
    sd: StreamingDecoder, hiddens: torch.Tensor, config: ChunkSchedule | None = None
) -> np.ndarray:
    """The oracle of a stream with the left context at the receptive field: each chunk's
    samples from an offline decode of the tokens before its window end (what the Decoder
    state's final and provisional frames stand for), joined at the planned seams. With any
    lookahead, the chunks do not depend on how the tokens arrived (tests/unit/
    test_chunk_schedule.py), so they are planned at once."""
    chunking = sd.open(config).chunking
    assert chunking.left_context_tokens >= sd.receptive_field_tokens[0]
    assert chunking.config.min_lookahead_tokens > 0
    chunks = plan_chunks(chunking, PlanPosition(), len(hiddens), ended=True)[0]
    hiddens = hiddens.to(sd.dtype)
    decoded = {tb: offline(sd.decoder, sd.vocoder, hiddens[:tb]) for tb in {c.tb for c in chunks}}
    seams = SeamJoiner()
    return np.concatenate([seams.emit(chunk, decoded[chunk.tb], 0) for chunk in chunks])


def stream_all(
    sd: StreamingDecoder,
    hiddens: torch.Tensor,
    config: ChunkSchedule | None = None,
    push_sizes: tuple[int, ...] = (1,),
    on_step=None,
) -> np.ndarray:
    """Push `hiddens` in rotating sizes, stepping after each push as the engine would."""
    stream = sd.open(config)
    parts, pos, i = [], 0, 0
    while pos < len(hiddens):
        n = push_sizes[i % len(push_sizes)]
        stream.push(hiddens[pos : pos + n])
        pos, i = pos + n, i + 1
        for key, pcm in sd.step({0: stream}).items():
            assert key == 0 and pcm.dtype == np.float32
            parts.append(pcm)
            if on_step is not None:
                on_step(stream)
    parts.append(sd.finish({0: stream})[0])
    assert stream.done and stream.buffered_tokens == 0
    return np.concatenate(parts)
