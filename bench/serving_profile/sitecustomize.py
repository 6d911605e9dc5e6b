"""Per-component timers inside a `chattts-server` subprocess, for bench/bench_serving.py.

Active only when CHATTTS_PROFILE_OUT names a file (bench_serving puts this folder on the
server's PYTHONPATH and sets it). Python imports `sitecustomize` at start-up, before
`chattts_server.main`; the timers go in right after the server has sized its thread pools
(importing torch earlier would defeat that). Each timer wraps a method at class level and adds
its wall time (seconds) and call count to a dict that a daemon thread writes as JSON every
0.2 s; the benchmark reads it before and after each load level and takes the difference. Code in
the profiled process itself (the tests) calls `write_profile()` for a snapshot taken now.
Methods that do not exist (the engine changed) are skipped and show as absent.

The GPT step has these entries: `LlamaDecoder.forward_batch` (the engine step's one forward:
prompt chunks and, with CUDA graphs off, the decode batch), `DecodeGraphs.__call__` (graphs on:
the replay), `LlamaCppGPT.forward` (the llama.cpp backend's whole step), and `decode` /
`prefill` (warm-up and direct callers); the first three count the decode rows (tokens) they
run. On CUDA each timer synchronizes the device before
it starts and stops, so a component's time is its own kernels', not whatever the next host
read waits for.
"""

from __future__ import annotations

import os

_OUT = os.environ.get("CHATTTS_PROFILE_OUT")
_TOTALS: dict[str, list[float]] = {}
"""label -> [seconds, calls], filled by the installed timers."""


def write_profile() -> None:
    """Write the totals so far to CHATTTS_PROFILE_OUT, atomically."""
    import json

    assert _OUT is not None, "CHATTTS_PROFILE_OUT is not set"
    tmp = f"{_OUT}.tmp"
    with open(tmp, "w") as f:
        json.dump({k: list(v) for k, v in _TOTALS.items()}, f)
    os.replace(tmp, _OUT)


def _graph_rows(args: tuple) -> int:  # DecodeGraphs.__call__(self, slot_ids, ...)
    return int(args[1].shape[0])


def _batch_rows(args: tuple) -> int:  # forward(self, prompts, decode, ...)
    return int(args[2].embeds.shape[0]) if len(args) > 2 and args[2] is not None else 0


# label -> (module, class, method, the decode rows (tokens) of a call, for the GPT step's)
_TIMERS = {
    "engine_step": ("chattts_server.engine.core", "EngineCore", "step", None),
    "gpt_forward": ("chattts_server.model.llama", "LlamaDecoder", "forward_batch", _batch_rows),
    "gpt_decode": ("chattts_server.model.llama", "LlamaDecoder", "decode", None),
    "gpt_decode_graphs": ("chattts_server.model.cuda_graphs", "DecodeGraphs", "__call__", _graph_rows),
    "gpt_prefill": ("chattts_server.model.llama", "LlamaDecoder", "prefill", None),
    "gpt_llamacpp": ("chattts_server.engine.llamacpp_gpt", "LlamaCppGPT", "forward", _batch_rows),
    "heads_sampling": ("chattts_server.engine.runner", "ModelRunner", "_code_step", None),
    "decoder_vocoder": ("chattts_server.engine.streaming_decode", "StreamingDecoder", "step", None),
    "decoder_vocoder_finish": ("chattts_server.engine.streaming_decode", "StreamingDecoder", "finish", None),
    "encoding": ("chattts_server.audio.encoding", "_PcmEncoder", "encode", None),
    "encoding_opus": ("chattts_server.audio.encoding", "_OggOpusEncoder", "encode", None),
}  # fmt: skip


def _install() -> None:
    import importlib
    import threading
    import time

    import torch

    rows = _TOTALS.setdefault("decode_rows", [0.0, 0.0])

    def sync() -> None:
        if torch.cuda.is_initialized():
            torch.cuda.synchronize()

    def wrap(label: str, fn, rows_of):  # type: ignore[no-untyped-def]
        slot = _TOTALS.setdefault(label, [0.0, 0.0])

        def timed(*args, **kwargs):  # type: ignore[no-untyped-def]
            counted = rows_of(args) if rows_of is not None else 0
            if counted:
                rows[0] += counted
                rows[1] += 1
            sync()
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                sync()
                slot[0] += time.perf_counter() - t0
                slot[1] += 1

        return timed

    for label, (module_name, cls_name, method, rows_of) in _TIMERS.items():
        try:
            cls = getattr(importlib.import_module(module_name), cls_name)
            setattr(cls, method, wrap(label, getattr(cls, method), rows_of))
        except (ImportError, AttributeError):
            continue

    def dump() -> None:
        while True:
            write_profile()
            time.sleep(0.2)

    threading.Thread(target=dump, name="bench-profile", daemon=True).start()


if _OUT:
    import chattts_server.threads as _threads

    _configure = _threads.configure_threads

    def _configure_then_profile(*args, **kwargs):  # type: ignore[no-untyped-def]
        plan = _configure(*args, **kwargs)
        _install()
        return plan

    _threads.configure_threads = _configure_then_profile
