"""The GPT's layers on llama.cpp (`--backend llamacpp`): a runtime built for CPU decode.

torch drives a decode step as ~700 small ops from Python around the GEMVs; llama.cpp runs the
whole graph in C with its own quantized matmuls (Q8_0 and the k-quants: 8, 6, 5 and 4 bits a
weight, with dot products that do not saturate on AVX2). It runs the 20 Llama layers only
(`model/gguf_export.py`): our embeddings go in through `llama_batch.embd`, the final normed
hidden states come back in embeddings mode with no pooling, and the heads, sampling and
everything after stay ours.

Each KV slot is a llama.cpp sequence (seq id = slot id), each with `max_tokens` positions of its
own (`kv_unified` off). One `llama_decode` per step serves every prompt chunk and every decoding
slot; a slot's sequence is removed when its pass ends or a new pass takes the slot. Alignment
heads need attention weights, which llama.cpp does not return: word timing falls back to the
estimate on this backend.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import threading
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ..model.alignment_capture import AlignmentCapture, CaptureRow
from ..model.alignment_heads import HeadId
from ..model.llama import DecodeBatch, PromptRun
from ..model.llama_layers import LlamaShape

log = logging.getLogger(__name__)

MAX_SEQUENCES = 256
"""llama.cpp's LLAMA_MAX_SEQ: the most slots one context holds."""

_backend_lock = threading.Lock()
_backend_ready = False


def import_llama_cpp() -> Any:
    """The `llama_cpp` module, its backend initialised once, logging routed to ours; raises
    ImportError or OSError where the package is missing or its library does not load."""
    global _backend_ready
    import llama_cpp

    with _backend_lock:
        if not _backend_ready:
            global _LOG_CALLBACK
            llama_cpp.llama_backend_init()
            _LOG_CALLBACK = llama_cpp.llama_log_callback(_log_callback)
            llama_cpp.llama_log_set(_LOG_CALLBACK, ctypes.c_void_p(0))
            _backend_ready = True
    return llama_cpp


def _log_callback(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
    # llama.cpp logs every tensor it loads: only its warnings and errors are worth our log.
    if level in (3, 4):  # GGML_LOG_LEVEL_WARN, _ERROR (5 continues the last line)
        message = text.decode(errors="replace").rstrip()
        if message and not any(expected in message for expected in _EXPECTED):
            log.warning("llama.cpp: %s", message)


_EXPECTED = ("dummy tokens", "pooling_type is", "not divisible by n_seq_max")
"""Warnings our GGUF makes on purpose (no vocabulary; hidden states out, not pooled)."""


_LOG_CALLBACK: Any = None
"""The C callback (made at the backend's first use: its type comes from the package)."""


class LlamaCppGPT:
    """`GPTModel` over a llama.cpp context: one sequence per slot."""

    def __init__(
        self,
        gguf_path: Path,
        shape: LlamaShape,
        num_slots: int,
        max_tokens: int,
        max_batch_tokens: int,
        threads: int,
        weight_format: str,
    ) -> None:
        if num_slots > MAX_SEQUENCES:
            raise ValueError(f"llama.cpp holds at most {MAX_SEQUENCES} sequences, not {num_slots}")
        lc = import_llama_cpp()
        self._lc = lc
        self.shape = shape
        self.weight_format = weight_format
        self.num_slots = num_slots
        self.max_tokens = max_tokens
        self.threads = threads
        self.name = f"llamacpp {weight_format}"
        self.supports_alignment = False
        self.graphs_error = ""
        model_params = lc.llama_model_default_params()
        model_params.n_gpu_layers = 0
        self._model = lc.llama_model_load_from_file(str(gguf_path).encode(), model_params)
        if not self._model:
            raise RuntimeError(f"llama.cpp could not load {gguf_path}")
        params = lc.llama_context_default_params()
        params.n_ctx = num_slots * max_tokens
        params.n_batch = params.n_ubatch = max_batch_tokens
        params.n_seq_max = num_slots
        params.n_threads = params.n_threads_batch = threads
        params.embeddings = True
        params.pooling_type = lc.LLAMA_POOLING_TYPE_NONE
        params.kv_unified = False
        params.no_perf = True
        if weight_format == "F32":  # the exact format: K/V in fp32, attention without flash
            # attention, whose CPU kernel works in fp16 (61 dB against fp32 on the full model)
            params.type_k = params.type_v = lc.GGML_TYPE_F32
            params.flash_attn_type = lc.LLAMA_FLASH_ATTN_TYPE_DISABLED
        self._ctx = lc.llama_init_from_model(self._model, params)
        if not self._ctx:
            lc.llama_model_free(self._model)
            raise RuntimeError("llama.cpp could not create a context")
        self._memory = lc.llama_get_memory(self._ctx)
        self._batch = lc.llama_batch_init(max_batch_tokens, shape.hidden_size, 1)
        self._max_batch_tokens = max_batch_tokens
        d = shape.hidden_size
        self._embd = np.ctypeslib.as_array(self._batch.embd, shape=(max_batch_tokens, d))
        self._pos = np.ctypeslib.as_array(self._batch.pos, shape=(max_batch_tokens,))
        self._n_seq_id = np.ctypeslib.as_array(self._batch.n_seq_id, shape=(max_batch_tokens,))
        self._wants_output = np.ctypeslib.as_array(self._batch.logits, shape=(max_batch_tokens,))
        self._n_seq_id[:] = 1
        self._seq_of_row = [-1] * max_batch_tokens  # what each row's seq_id pointer holds now

    def close(self) -> None:
        lc = self._lc
        if getattr(self, "_ctx", None):
            lc.llama_batch_free(self._batch)
            lc.llama_free(self._ctx)
            lc.llama_model_free(self._model)
            self._ctx = None

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # interpreter shutdown
            self.close()

    def set_threads(self, threads: int) -> None:
        """Follow the CPU pool's size (the thread governor changes torch's)."""
        if threads != self.threads:
            self.threads = threads
            self._lc.llama_set_n_threads(self._ctx, threads, threads)

    def forward(
        self,
        prompts: list[PromptRun],
        decode: DecodeBatch | None,
        alignment: tuple[tuple[HeadId, ...], list[CaptureRow]] | None = None,
    ) -> tuple[list[Tensor], Tensor | None, AlignmentCapture | None]:
        """Prompt chunks first, then the decode rows, in one `llama_decode` (more than
        `max_batch_tokens` rows in several); outputs only where a hidden state is used."""
        rows: list[tuple[int, Tensor, int, bool]] = []
        for run in prompts:
            rows.append((run.slot_id, run.embeds, run.start_pos, False))
        if decode is not None:
            slots, positions = decode.slot_ids.tolist(), decode.positions.tolist()
            for i, (slot, pos) in enumerate(zip(slots, positions, strict=True)):
                rows.append((slot, decode.embeds[i : i + 1], pos, False))
        hidden = self._run(rows)
        prompt_last = hidden[: len(prompts)]
        decode_hidden = torch.stack(hidden[len(prompts) :]) if decode is not None else None
        return [h for h in prompt_last], decode_hidden, None

    def _run(self, rows: list[tuple[int, Tensor, int, bool]]) -> list[Tensor]:
        """Rows (seq, embeds (n, D), first position, every position?) through the layers, in
        as few `llama_decode` calls as the batch size allows: the hidden state of each row's
        last token (or of every token), in row order."""
        out: list[Tensor] = []
        filled = 0
        wanted: list[int] = []  # batch indices whose hidden states are asked for
        for seq, embeds, start, every in rows:
            tokens = embeds.detach().to(torch.float32).numpy()
            done = 0
            while done < len(tokens):
                take = min(len(tokens) - done, self._max_batch_tokens - filled)
                self._embd[filled : filled + take] = tokens[done : done + take]
                self._pos[filled : filled + take] = np.arange(start + done, start + done + take)
                for row in range(filled, filled + take):
                    if self._seq_of_row[row] != seq:
                        self._batch.seq_id[row][0] = seq
                        self._seq_of_row[row] = seq
                if every:
                    wanted += range(filled, filled + take)
                filled += take
                done += take
                if done == len(tokens) and not every:
                    wanted.append(filled - 1)
                if filled == self._max_batch_tokens:
                    out += self._decode(filled, wanted)
                    filled, wanted = 0, []
        if filled:
            out += self._decode(filled, wanted)
        return out

    def _decode(self, num_tokens: int, wanted: list[int]) -> list[Tensor]:
        """One `llama_decode` of the batch's first `num_tokens` rows; the hidden states of the
        rows in `wanted`. Embeddings mode outputs every row (llama.cpp insists), so every row is
        marked and the wanted ones are picked."""
        lc = self._lc
        self._batch.n_tokens = num_tokens
        self._wants_output[:num_tokens] = 1
        status = lc.llama_decode(self._ctx, self._batch)
        if status != 0:
            raise RuntimeError(f"llama_decode failed ({status})")
        if not wanted:
            return []
        pointer = lc.llama_get_embeddings(self._ctx)
        hidden = np.ctypeslib.as_array(pointer, shape=(num_tokens, self.shape.hidden_size))
        return list(torch.from_numpy(hidden[wanted]))

    def free_slot(self, slot_id: int) -> None:
        """The slot's sequence is removed from llama.cpp's KV cache."""
        self._lc.llama_memory_seq_rm(self._memory, slot_id, -1, -1)

    @property
    def decode_graphs(self) -> str:
        return "off"

    def hidden_states(self, slot_id: int, embeds: Tensor) -> Tensor:
        """(L, D) embeds as a fresh prompt in `slot_id`: the hidden state of every position
        (the quality check at warm-up). The slot's sequence is removed after."""
        self.free_slot(slot_id)
        hidden = self._run([(slot_id, embeds, 0, True)])
        self.free_slot(slot_id)
        return torch.stack(hidden)
