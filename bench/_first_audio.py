"""bench_serving.py's first-audio part: where a navigation prompt's first audio goes, one caller.

(1) In the engine: the server's own `ModelRunner.load` and warm-up (default flags), one request
    driven through `EngineCore` step by step with the runner's parts timed: the text front end
    (`prepare`), the prefill (the first step's GPT forward), the decode steps up to the first
    chunk (GPT, then heads + sampling), the Decoder + vocoder that make the first chunk, and the
    rest of the engine steps; each `--schedules` entry (first chunk / lookahead tokens, a
    request's own `chunking`) in turn, `--repeats` times.
(2) Through the real server (default flags, the client library over gRPC): the same prompt's
    first audio as the client sees it; encoding + gRPC + hand-off = that minus the engine's.
Medians, the load average beside them.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _common import command, launch, load_line, table, write_result

PROMPTS = {
    "en": (
        "In four hundred meters at the roundabout take the second exit onto Main Street, "
        "then keep left towards the airport."
    ),
    "zh": "前方四百米进入环岛，从第二个出口驶出进入主街，然后靠左行驶前往机场。",
}
"""19 English words, or the same in 33 Chinese characters. The dev model's tokenizer knows few
English words and spells the rest out letter by letter (87 tokens, where ChatTTS's own
vocabulary has most words whole); it has every Chinese character, one token each, as ChatTTS's
does, so the Chinese prompt's length is what real weights would see."""
TOKENS = 48
"""Audio tokens of each utterance, exactly: the random-weight model would otherwise stop at any
step, and an early end code brings first audio forward (the flush)."""
PARTS = [("text front end", "prepare"), ("prefill", "prefill"),
         ("decode steps to the first chunk (GPT)", "decode_gpt"), ("heads + sampling", "heads"),
         ("Decoder + vocoder, first chunk", "audio"), ("rest of the engine steps", "rest")]  # fmt: skip


def _timed(times: dict[str, float], key: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    def wrapper(*a: Any, **k: Any) -> Any:
        started = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            times[key] += time.perf_counter() - started

    return wrapper


def _until_first_audio(core: Any, times: dict[str, float]) -> None:
    """Step until some output has audio; the Decoder + vocoder of that step is the first
    chunk's."""
    heard = False
    while not heard:
        audio_before = times["audio_all"]
        for out in core.step():
            heard = heard or bool(out.audio)
        if heard:
            times["audio"] = times["audio_all"] - audio_before


def engine_first_audio(runner: Any, engine: Any, schedule: str, text: str) -> dict[str, float]:
    """One request's first audio in the engine, its parts in seconds ('total' too)."""
    from chattts_server.engine.core import EngineCore
    from chattts_server.engine.utterance import ChunkingOptions, SamplingParams, UtteranceRequest

    first, lookahead = (int(n) for n in schedule.split("/"))
    times: dict[str, float] = defaultdict(float)
    gpt, audio = runner.gpt, runner.audio
    real_forward = gpt.forward

    def forward(prompts: list, decode: Any, *rest: Any) -> Any:
        key = "prefill" if prompts else "decode_gpt"
        return _timed(times, key, real_forward)(prompts, decode, *rest)

    gpt.forward = forward
    runner.prepare = _timed(times, "prepare", runner.prepare)
    runner._code_step = _timed(times, "heads", runner._code_step)
    audio.step = _timed(times, "audio_all", audio.step)
    try:
        core = EngineCore.from_config(runner, engine)
        sampling = SamplingParams(min_new_tokens=TOKENS, max_new_tokens=TOKENS)
        chunking = ChunkingOptions(first, None, lookahead)
        started = time.perf_counter()
        core.add_request(UtteranceRequest("r0", text, sampling=sampling, chunking=chunking))
        _until_first_audio(core, times)
        times["total"] = time.perf_counter() - started
        core.abort_request("r0")
        while core.has_unfinished_requests:
            core.step()
        core.step()
    finally:
        del gpt.forward, runner.prepare, runner._code_step, audio.step
    counted = sum(times[k] for _, k in PARTS if k != "rest")
    times["rest"] = times["total"] - counted - (times["audio_all"] - times["audio"])
    return dict(times)


def server_first_audio(args: argparse.Namespace, text: str) -> list[float]:
    """The client's first audio through the real server, default flags, sequential requests."""
    from chattts_client import TTSClient
    from chattts_proto.chattts.v1 import tts_pb2

    sampling = tts_pb2.Sampling(min_new_tokens=TOKENS, max_new_tokens=TOKENS)
    config = tts_pb2.SynthesisConfig(sampling=sampling)
    ttfa = []
    with launch([], dev_model=args.model, cache=Path(args.cache), start_timeout_s=900) as srv:
        srv.wait_serving(900)
        with TTSClient(srv.target) as client:
            for i in range(args.repeats + 1):
                stream = client.synthesize(text, config=config, timeout=120)
                for _ in stream:
                    pass
                if i:  # the first request pays for the client's own first call
                    ttfa_ms = stream.stats.ttfa_ms
                    ttfa.append(float("nan") if ttfa_ms is None else ttfa_ms / 1e3)
        srv.stop()
    return ttfa


def _steps(schedule: str) -> int:
    """Decode steps before the first chunk: its tokens and lookahead, less the prefill's one."""
    first, lookahead = (int(n) for n in schedule.split("/"))
    return first + lookahead - 1


def report(args: argparse.Namespace, engine: dict, client: list[float], prompt_tokens: int) -> str:
    med, schedules, load = statistics.median, list(engine), load_line()
    why = (
        ": the dev model's tokenizer spells English words it does not know letter by letter, "
        "where ChatTTS's own vocabulary has most of them whole"
        if args.language == "en"
        else ", as ChatTTS's own vocabulary makes it: one token a character"
    )
    rows = [
        [label, *(f"{1e3 * med(r[key] for r in engine[s]):.1f}" for s in schedules)]
        for label, key in [*PARTS, ("engine: request to first audio", "total")]
    ]
    each = (med(r["decode_gpt"] for r in engine[s]) / max(1, _steps(s)) for s in schedules)
    rows.append(["GPT decode step (each)", *(f"{1e3 * v:.1f}" for v in each)])
    lines = [
        "# First audio of a navigation prompt, one caller",
        "",
        f"{args.model.capitalize()} dev model (random weights), CPU, default server flags, the "
        f'prompt "{PROMPTS[args.language]}". Medians of {args.repeats} runs; {load} at the end. '
        f"Command: {command()}",
        "",
        "In the engine, ms (a schedule is first-chunk / first-chunk lookahead tokens; the "
        f"server's default is 4/4, 8/8 before issue 47; the prompt is {prompt_tokens} tokens"
        f"{why}):",
        "",
        table(["part", *schedules], rows),
    ]
    default = med(r["total"] for r in engine[schedules[0]])
    lines += [
        "",
        f"Through the server ({schedules[0]}, gRPC, the client library): first audio "
        f"{1e3 * med(client):.1f} ms (p95 of {len(client)}: {1e3 * max(client):.1f} ms); "
        f"encoding + gRPC + hand-off + the engine thread's wake-up: "
        f"{1e3 * (med(client) - default):.1f} ms ({load}).",
    ]
    return "\n".join(lines) + "\n"


def _engine_parts(args: argparse.Namespace, text: str) -> tuple[dict, int]:
    """Each schedule's parts, `--repeats` times, in turn (the machine's load falls on each
    alike); and the prompt's length in tokens."""
    from chattts_server.threads import configure_threads

    configure_threads(None)  # as the server does, before torch loads
    from chattts_server.config import EngineConfig
    from chattts_server.config_model import ModelConfig
    from chattts_server.engine.runner import ModelRunner
    from chattts_server.engine.utterance import VoiceSpec

    model = ModelConfig(dev_model=args.model, dev_model_cache=Path(args.cache), device="cpu")
    engine = EngineConfig()
    runner = ModelRunner.load(model, engine)
    runner.warmup(engine.max_streams)
    schedules = [s for s in args.schedules.split(",") if s]
    results: dict[str, list[dict[str, float]]] = {s: [] for s in schedules}
    for s in schedules:
        engine_first_audio(runner, engine, s, text)  # each schedule's first run: not counted
    for _ in range(args.repeats):
        for s in schedules:
            results[s].append(engine_first_audio(runner, engine, s, text))
            print(
                f"  {s}: engine first audio {1e3 * results[s][-1]['total']:.1f} ms, {load_line()}"
            )
    normalized = runner.prompts.normalize(text)
    return results, runner.prompts.code_prompt(normalized, VoiceSpec(), 5).embeds.shape[0]


def run_first_audio(args: argparse.Namespace) -> None:
    text = PROMPTS[args.language]
    results, prompt_tokens = _engine_parts(args, text)
    markdown = report(args, results, server_first_audio(args, text), prompt_tokens)
    print(markdown)
    name = "first_audio.md" if args.language == "en" else f"first_audio_{args.language}.md"
    write_result(Path(args.out) / name, markdown)
