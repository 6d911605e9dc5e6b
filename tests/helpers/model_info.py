"""The `ModelInfo` the tiny dev model publishes, for tests that validate requests without
loading a model (api/convert.py's Validator, the stream items)."""

from __future__ import annotations

from chattts_server.engine.chunking import ChunkSchedule
from chattts_server.engine.protocol import ModelInfo

TINY_MODEL_INFO = ModelInfo(
    sample_rate=24000,
    samples_per_token=512,
    speaker_dim=768,
    num_vq=4,
    num_audio_codes=626,
    max_new_tokens=384,
    max_tokens=512,
    device="cpu",
    dtype="float32",
    chunking=ChunkSchedule().options(),
)
