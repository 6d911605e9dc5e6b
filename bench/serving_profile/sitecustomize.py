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


# label -> (module, class, method)
_TIMERS = {
    "engine_step": ("chattts_server.engine.core", "EngineCore", "step"),
    "gpt_forward": ("chattts_server.model.llama", "LlamaDecoder", "forward_batch"),
    "gpt_decode": ("chattts_server.model.llama", "LlamaDecoder", "decode"),
    "gpt_decode_graphs": ("chattts_server.model.cuda_graphs", "DecodeGraphs", "__call__"),
    "gpt_prefill": ("chattts_server.model.llama", "LlamaDecoder", "prefill"),
    "gpt_llamacpp": ("chattts_server.engine.llamacpp_gpt", "LlamaCppGPT", "forward"),
    "heads_sampling": ("chattts_server.engine.runner", "ModelRunner", "_code_step"),
    "decoder_vocoder": ("chattts_server.engine.streaming_decode", "StreamingDecoder", "step"),
    "decoder_vocoder_finish": (
        "chattts_server.engine.streaming_decode",
        "StreamingDecoder",
        "finish",
    ),
    "encoding": ("chattts_server.audio.encoding", "_PcmEncoder", "encode"),
    "encoding_opus": ("chattts_server.audio.encoding", "_OggOpusEncoder", "encode"),
}


def _install() -> None:
    import importlib
    import threading
    import time

    import torch

    totals = _TOTALS

    def sync() -> None:
        if torch.cuda.is_initialized():
            torch.cuda.synchronize()

    def wrap(label: str, fn):  # type: ignore[no-untyped-def]
        slot = totals.setdefault(label, [0.0, 0.0])

        def timed(*args, **kwargs):  # type: ignore[no-untyped-def]
            sync()
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                sync()
                slot[0] += time.perf_counter() - t0
                slot[1] += 1

        return timed

    for label, (module_name, cls_name, method) in _TIMERS.items():
        try:
            cls = getattr(importlib.import_module(module_name), cls_name)
            setattr(cls, method, wrap(label, getattr(cls, method)))
        except (ImportError, AttributeError):
            continue
    # Decode rows = tokens generated (one per row per step), on either decode path.
    rows = totals.setdefault("decode_rows", [0.0, 0.0])

    def count_rows(cls, method: str) -> None:  # type: ignore[no-untyped-def]
        fn = getattr(cls, method)

        def counted(self, slot_ids, *args, **kwargs):  # type: ignore[no-untyped-def]
            rows[0] += int(slot_ids.shape[0])
            rows[1] += 1
            return fn(self, slot_ids, *args, **kwargs)

        setattr(cls, method, counted)

    count_rows(importlib.import_module("chattts_server.model.cuda_graphs").DecodeGraphs, "__call__")
    llama_decoder = importlib.import_module("chattts_server.model.llama").LlamaDecoder
    forward_batch = llama_decoder.forward_batch

    def count_decode_rows(self, prompts, decode, *args, **kwargs):  # type: ignore[no-untyped-def]
        if decode is not None:
            rows[0] += int(decode.embeds.shape[0])
            rows[1] += 1
        return forward_batch(self, prompts, decode, *args, **kwargs)

    llama_decoder.forward_batch = count_decode_rows
    llamacpp_gpt = importlib.import_module("chattts_server.engine.llamacpp_gpt").LlamaCppGPT
    llamacpp_forward = llamacpp_gpt.forward

    def count_llamacpp_rows(self, prompts, decode, *args, **kwargs):  # type: ignore[no-untyped-def]
        if decode is not None:
            rows[0] += int(decode.embeds.shape[0])
            rows[1] += 1
        return llamacpp_forward(self, prompts, decode, *args, **kwargs)

    llamacpp_gpt.forward = count_llamacpp_rows

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
