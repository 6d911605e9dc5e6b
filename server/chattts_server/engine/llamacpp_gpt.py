"""The GPT's layers on llama.cpp: the one way they run on a CPU.

torch drives a decode step as ~700 small ops from Python around the GEMVs; llama.cpp runs the
whole graph in C with its own quantized matmuls. It runs the 20 Llama layers only
(`model/gguf_export.py`): our embeddings go in through `llama_batch.embd`, the final normed
hidden states come back in embeddings mode with no pooling, and the heads, sampling and
everything after stay ours.

Each KV slot is a llama.cpp sequence (seq id = slot id), each with `max_tokens` positions of its
own (`kv_unified` off: attention reads only the row's own sequence). One `llama_decode` per step
serves every prompt chunk and every decoding slot; llama.cpp splits it into micro-batches of
consecutive sequence ids, so rows go in sorted by slot. A slot's sequence is removed when its
pass ends or a new pass takes the slot.

Settings that hold on every CPU:
- Flash attention off: its CPU kernel is no faster here at the lengths we serve (it was slower
  at 16 streams over 200 positions), and without it the softmaxed attention is a tensor of its
  own (`kq_soft_max-<layer>`), which word timing reads (`AttentionTap`).
- No extra buffer types (weight repacking, AMX): on an AMX Xeon the AMX buffer's matmul crashed
  the process in the first prefill of a Q8_0 model (a general protection fault in
  libggml-cpu), and on x86 they repack none of the formats we serve.
- K in Q8_0 and V in F16 (V can be quantized only with flash attention), but both F32 for the
  F32 format (exact against torch fp32). K in Q8_0 costs the hidden states 0.2 dB (32.0 ->
  31.8 dB against fp32 on the dev model, Q8_0-mixed1) and takes a quarter off the cache's
  memory (1.5 -> 1.1 GiB at 16 slots x 1536 positions), and the step at 16 streams reads less.
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

from ..model.llama import DecodeBatch, PromptRun
from ..model.llama_layers import LlamaShape
from ..timing.capture import LlamaCppAlignment
from ..timing.types import CaptureRequest, HeadId
from .llamacpp_tap import AttentionTap

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
            _LOG_CALLBACK = llama_cpp.llama_log_callback(_log_callback)
            llama_cpp.llama_log_set(_LOG_CALLBACK, ctypes.c_void_p(0))
            llama_cpp.llama_backend_init()
            info = llama_cpp.llama_print_system_info().decode(errors="replace")
            log.info("llama.cpp: %s", info.strip(" |"))
            _backend_ready = True
    return llama_cpp


def llamacpp_unavailable() -> str | None:
    """Why llama.cpp cannot run here (the build failed, another platform), or None."""
    try:
        import_llama_cpp()
    except Exception as exc:  # noqa: BLE001 - ImportError, OSError from the shared library...
        return f"llama-cpp-python does not load ({type(exc).__name__}: {exc})"
    return None


def _log_callback(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
    # llama.cpp logs every tensor it loads: only its warnings and errors are worth our log.
    if level in (3, 4):  # GGML_LOG_LEVEL_WARN, _ERROR (5 continues the last line)
        message = text.decode(errors="replace").rstrip()
        if message and not any(expected in message for expected in _EXPECTED):
            log.warning("llama.cpp: %s", message)


# fmt: off
_EXPECTED = (
    "dummy tokens", "pooling_type is", "not divisible by n_seq_max", "n_ctx_seq",
    "not divisible by 256", "falling back to", "required fallback quantization",
)
# fmt: on
"""Warnings our GGUF and context make on purpose (no vocabulary; hidden states out, not pooled;
each sequence's positions are ours to bound), and the k-quants' fallback on a model narrower
than their 256-wide blocks (the tiny dev model)."""


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
        attention_tap: bool = False,
    ) -> None:
        """`attention_tap`: make the context with an `AttentionTap` (word timing, the
        alignment heads' calibration); `set_attention_tap` changes it while no slot is used."""
        if num_slots > MAX_SEQUENCES:
            raise ValueError(f"llama.cpp holds at most {MAX_SEQUENCES} sequences, not {num_slots}")
        lc = import_llama_cpp()
        self._lc = lc
        self.gguf_path = gguf_path
        self.shape = shape
        self.weight_format = weight_format
        self.num_slots = num_slots
        self.max_tokens = max_tokens
        self.threads = threads
        self.name = f"llamacpp {weight_format}"
        self.graphs_error = ""
        self.alignment_heads: tuple[HeadId, ...] = ()
        self._tap: AttentionTap | None = None
        self._ctx: Any = None
        model_params = lc.llama_model_default_params()
        model_params.n_gpu_layers = 0
        model_params.use_extra_bufts = False
        self._model = lc.llama_model_load_from_file(str(gguf_path).encode(), model_params)
        if not self._model:
            raise RuntimeError(f"llama.cpp could not load {gguf_path}")
        self._batch = lc.llama_batch_init(max_batch_tokens, shape.hidden_size, 1)
        self._max_batch_tokens = max_batch_tokens
        d = shape.hidden_size
        self._embd = np.ctypeslib.as_array(self._batch.embd, shape=(max_batch_tokens, d))
        self._pos = np.ctypeslib.as_array(self._batch.pos, shape=(max_batch_tokens,))
        self._n_seq_id = np.ctypeslib.as_array(self._batch.n_seq_id, shape=(max_batch_tokens,))
        self._wants_output = np.ctypeslib.as_array(self._batch.logits, shape=(max_batch_tokens,))
        self._n_seq_id[:] = 1
        self._seq_of_row = [-1] * max_batch_tokens  # what each row's seq_id pointer holds now
        self._make_context(attention_tap)

    def _make_context(self, attention_tap: bool) -> None:
        lc = self._lc
        if self._ctx:
            lc.llama_free(self._ctx)
            self._ctx = None
        params = lc.llama_context_default_params()
        params.n_ctx = self.num_slots * self.max_tokens
        params.n_batch = params.n_ubatch = self._max_batch_tokens
        params.n_seq_max = self.num_slots
        params.n_threads = params.n_threads_batch = self.threads
        params.embeddings = True
        params.pooling_type = lc.LLAMA_POOLING_TYPE_NONE
        params.kv_unified = False
        params.no_perf = True
        params.flash_attn_type = lc.LLAMA_FLASH_ATTN_TYPE_DISABLED
        if self.weight_format == "F32":  # the exact format: K/V in fp32 too
            params.type_k = params.type_v = lc.GGML_TYPE_F32
        else:
            params.type_k = lc.GGML_TYPE_Q8_0
        self._tap = AttentionTap(lc) if attention_tap else None
        if self._tap is not None:
            params.cb_eval = self._tap.callback
            params.cb_eval_user_data = None
        self._ctx = lc.llama_init_from_model(self._model, params)
        if not self._ctx:
            raise RuntimeError("llama.cpp could not create a context")
        self._memory = lc.llama_get_memory(self._ctx)

    def set_attention_tap(self, enabled: bool) -> None:
        """Remake the context with or without the tap (warm-up only: every slot is dropped)."""
        if enabled != (self._tap is not None):
            self._make_context(enabled)

    def close(self) -> None:
        lc = self._lc
        if getattr(self, "_model", None):
            if self._ctx:
                lc.llama_free(self._ctx)
            lc.llama_batch_free(self._batch)
            lc.llama_model_free(self._model)
            self._ctx = self._model = None

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
        alignment: CaptureRequest | None = None,
    ) -> tuple[list[Tensor], Tensor | None, LlamaCppAlignment | None]:
        """Every row in one `llama_decode` (more than `max_batch_tokens` rows in several),
        sorted by sequence so that llama.cpp's micro-batches stay few; outputs only where a
        hidden state is used. With `alignment` (and a tap) the decode rows run in a call of
        their own, whose micro-batches are then known: runs of consecutive sequences."""
        rows: list[tuple[int, Tensor, int, bool]] = [
            (run.slot_id, run.embeds, run.start_pos, False) for run in prompts
        ]
        decode_rows: list[tuple[int, Tensor, int, bool]] = []
        if decode is not None:
            slots, positions = decode.slot_ids.tolist(), decode.positions.tolist()
            decode_rows = [
                (slot, decode.embeds[i : i + 1], pos, False)
                for i, (slot, pos) in enumerate(zip(slots, positions, strict=True))
            ]
        capture = None
        if alignment is not None and self._tap is not None and decode_rows:
            capture = LlamaCppAlignment(*alignment)
            hidden = self._run(rows) if rows else []
            self._tap.want(capture.layers)
            try:
                hidden += self._run(decode_rows)
            finally:
                found, self._tap.found = self._tap.found, {}
                self._tap.want(set())
            capture.read(found, _consecutive_runs(decode_rows))
        else:
            hidden = self._run(rows + decode_rows)
        prompt_last = hidden[: len(prompts)]
        decode_hidden = torch.stack(hidden[len(prompts) :]) if decode is not None else None
        return prompt_last, decode_hidden, capture

    def _run(self, rows: list[tuple[int, Tensor, int, bool]]) -> list[Tensor]:
        """Rows (seq, embeds (n, D), first position, every position?) through the layers, in
        as few `llama_decode` calls as the batch size allows: the hidden state of each row's
        last token (or of every token), in the order given."""
        order = sorted(range(len(rows)), key=lambda i: rows[i][0])
        out: list[Tensor] = []
        filled = 0
        wanted: list[int] = []  # batch indices whose hidden states are asked for
        for seq, embeds, start, every in (rows[i] for i in order):
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
        if any(every for *_, every in rows):
            return out  # one row with every position (the quality probe): nothing to reorder
        restored: list[Tensor] = [out[0]] * len(rows)
        for position, i in enumerate(order):
            restored[i] = out[position]
        return restored

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
        return list(torch.from_numpy(hidden[wanted].copy()))

    def free_slot(self, slot_id: int) -> None:
        """The slot's sequence is removed from llama.cpp's KV cache. Always whole: a sequence
        then refills its cells from the first, so cell i holds position i (`AttentionTap`)."""
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


def _consecutive_runs(rows: list[tuple[int, Tensor, int, bool]]) -> list[list[int]]:
    """The micro-batches llama.cpp makes of one-token rows: runs of consecutive sequence ids
    in ascending order (`split_equal`, sequential), as row indices."""
    order = sorted(range(len(rows)), key=lambda i: rows[i][0])
    runs: list[list[int]] = []
    for i in order:
        if runs and rows[i][0] == rows[runs[-1][-1]][0] + 1:
            runs[-1].append(i)
        else:
            runs.append([i])
    return runs
