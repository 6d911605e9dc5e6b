"""Per-component timers inside a `chattts-server` subprocess, for bench/bench_serving.py.

Active only when CHATTTS_PROFILE_OUT names a file (bench_serving puts this folder on the
server's PYTHONPATH and sets it). Python imports `sitecustomize` at start-up, before
`chattts_server.main`; the timers go in right after the server has sized its thread pools
(importing torch earlier would defeat that). Each timer wraps a method at class level and adds
its wall time (seconds) and call count to a dict that a daemon thread writes as JSON every
0.2 s; the benchmark reads it before and after each load level and takes the difference.
Methods that do not exist (the engine changed) are skipped and show as absent.
"""

from __future__ import annotations

import os

_OUT = os.environ.get("CHATTTS_PROFILE_OUT")

# label -> (module, class, method)
_TIMERS = {
    "engine_step": ("chattts_server.engine.core", "EngineCore", "step"),
    "gpt_decode": ("chattts_server.model.llama", "LlamaDecoder", "decode"),
    "gpt_prefill": ("chattts_server.model.llama", "LlamaDecoder", "prefill"),
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
    import json
    import threading
    import time

    totals: dict[str, list[float]] = {}

    def wrap(label: str, fn):  # type: ignore[no-untyped-def]
        slot = totals.setdefault(label, [0.0, 0.0])

        def timed(*args, **kwargs):  # type: ignore[no-untyped-def]
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                slot[0] += time.perf_counter() - t0
                slot[1] += 1

        return timed

    for label, (module_name, cls_name, method) in _TIMERS.items():
        try:
            cls = getattr(importlib.import_module(module_name), cls_name)
            setattr(cls, method, wrap(label, getattr(cls, method)))
        except (ImportError, AttributeError):
            continue
    # Decode rows = tokens generated (one per row per step).
    llama = importlib.import_module("chattts_server.model.llama").LlamaDecoder
    decode = llama.decode
    rows = totals.setdefault("decode_rows", [0.0, 0.0])

    def counted(self, slot_ids, *args, **kwargs):  # type: ignore[no-untyped-def]
        rows[0] += int(slot_ids.shape[0])
        rows[1] += 1
        return decode(self, slot_ids, *args, **kwargs)

    llama.decode = counted

    def dump() -> None:
        tmp = f"{_OUT}.tmp"
        while True:
            with open(tmp, "w") as f:
                json.dump({k: list(v) for k, v in totals.items()}, f)
            os.replace(tmp, _OUT)
            time.sleep(0.2)

    threading.Thread(target=dump, name="bench-profile", daemon=True).start()


if _OUT:
    import chattts_server.threads as _threads

    _configure = _threads.configure_threads

    def _configure_then_profile(requested):  # type: ignore[no-untyped-def]
        plan = _configure(requested)
        _install()
        return plan

    _threads.configure_threads = _configure_then_profile
