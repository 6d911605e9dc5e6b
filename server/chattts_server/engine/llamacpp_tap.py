"""Reading llama.cpp's attention weights while it decodes (word timing, and the alignment
heads' calibration): `AttentionTap`, made with the llama.cpp context it reads (`LlamaCppGPT`)."""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np


class _TensorHead(ctypes.Structure):
    """The start of ggml's `struct ggml_tensor` (ggml.h), up to its name."""

    _fields_ = [
        ("type", ctypes.c_int),
        ("buffer", ctypes.c_void_p),
        ("ne", ctypes.c_int64 * 4),
        ("nb", ctypes.c_size_t * 4),
        ("op", ctypes.c_int),
        ("op_params", ctypes.c_int32 * 16),
        ("flags", ctypes.c_int32),
        ("src", ctypes.c_void_p * 10),
        ("view_src", ctypes.c_void_p),
        ("view_offs", ctypes.c_size_t),
        ("data", ctypes.c_void_p),
        ("name", ctypes.c_char * 64),
    ]


class AttentionTap:
    """Reads chosen layers' softmaxed attention (`kq_soft_max-<layer>`) while `llama_decode`
    runs, through the context's eval callback (`cb_eval`): ggml's scheduler asks it about every
    node of the graph, computes the graph up to each node it wants, and hands the node over.

    Only a context made with a tap pays for it (a Python call per graph node, asked and
    refused while nothing is wanted), so the server makes one only where alignment heads
    exist. `found[layer]` holds one (streams, heads, tokens per stream, cells) array per
    micro-batch, in the order llama.cpp ran them."""

    def __init__(self, lc: Any) -> None:
        from llama_cpp._ggml import libggml

        self._tensor_get = libggml.ggml_backend_tensor_get
        self._tensor_get.argtypes = [
            ctypes.c_void_p,
            ctypes.c_void_p,
            ctypes.c_size_t,
            ctypes.c_size_t,
        ]
        self._tensor_get.restype = None
        self._wanted: dict[bytes, int] = {}
        self.found: dict[int, list[np.ndarray]] = {}
        self.callback = lc.ggml_backend_sched_eval_callback(self._on_tensor)

    def want(self, layers: set[int]) -> None:
        """Read these layers in the next `llama_decode` calls (none: read nothing)."""
        self._wanted = {f"kq_soft_max-{layer}".encode(): layer for layer in layers}
        self.found = {}

    def _on_tensor(self, pointer: int, ask: bool, user_data: ctypes.c_void_p) -> bool:
        if not self._wanted:
            return not ask  # asked: not wanted; handed over: go on
        head = _TensorHead.from_address(pointer)
        layer = self._wanted.get(head.name)
        if ask:
            return layer is not None
        if layer is not None:
            cells, tokens, heads, streams = (int(n) for n in head.ne)
            weights = np.empty((streams, heads, tokens, cells), dtype=np.float32)
            self._tensor_get(pointer, weights.ctypes.data, 0, weights.nbytes)
            self.found.setdefault(layer, []).append(weights)
        return True
