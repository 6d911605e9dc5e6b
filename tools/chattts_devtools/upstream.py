"""Upstream ChatTTS (`ChatTTS.Chat`) loaded from the same asset folder our server serves, so
parity tests and benchmarks compare both on the same weights."""

from __future__ import annotations

import logging
from dataclasses import asdict
from pathlib import Path

import torch

from chattts_server.model.chattts_config import chattts_config
from chattts_server.model.shapes import check_consistent, read_shapes
from chattts_server.model.verify import resolve_model_dir


def upstream_chat(model_dir: Path | str, device: torch.device | None = None):  # -> ChatTTS.Chat
    """An upstream ChatTTS Chat loaded from these files (any size), for parity tests and benchmarks."""
    from ChatTTS import Chat

    root = resolve_model_dir(model_dir)
    shapes = read_shapes(root)
    check_consistent(shapes)
    chat = Chat(logging.getLogger("chattts_server.upstream"))
    chat.config = chattts_config(shapes)
    paths = {name: str(root / rel) for name, rel in asdict(chat.config.path).items()}
    if not chat._load(device=device or torch.device("cpu"), compile=False, **paths):
        raise RuntimeError(f"ChatTTS could not load {root}")
    return chat
