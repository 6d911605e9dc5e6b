"""Where a navigation prompt's first audio goes, at one caller, with the server's default flags.

(1) In the engine: the server's own `ModelRunner.load` and warm-up (the full-size dev model,
    default flags), one request driven through `EngineCore` step by step with the runner's parts
    timed: the text front end (`prepare`: normalization, tokens, the prompt's embeddings), the
    prefill (the first step's GPT forward), the decode steps up to the first chunk (GPT, then
    heads + sampling), the Decoder + vocoder that make the first chunk, and the rest of the
    engine steps. Each `--schedules` entry (first chunk / lookahead tokens, a request's own
    `chunking`) runs in turn, `--repeats` times.
(2) Through the real server (default flags, the client library over gRPC): the same prompt's
    first audio as the client sees it; encoding + gRPC + hand-off = that minus the engine's.

Medians; the load average is printed beside each figure. Writes bench/results/first_audio.md.

Usage: python bench/bench_first_audio.py [--repeats 5] [--schedules 4/4,8/8,4/8,4/2]
       python bench/bench_first_audio.py --smoke    # tiny model, a temp folder
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / p) for p in ("client", "server", "tools")]

PROMPTS = {
    "en": (
        "In four hundred meters at the roundabout take the second exit onto Main Street, "
        "then keep left towards the airport."
    ),
    "zh": "前方四百米进入环岛，从第二个出口驶出进入主街，然后靠左行驶前往机场。",
}
"""A navigation prompt: 19 English words, or the same in 33 Chinese characters. The dev
model's tokenizer knows few English words and spells the rest out letter by letter (87 tokens
here, where ChatTTS's own vocabulary has most words whole); it has every Chinese character, one
token each, as ChatTTS's does, so the Chinese prompt's length is what real weights would see."""
TOKENS = 48
"""Audio tokens of each utterance, exactly: the random-weight model would otherwise stop at any
step, and an early end code brings first audio forward (the flush)."""
PARTS = [
    ("text front end", "prepare"),
    ("prefill", "prefill"),
    ("decode steps to the first chunk (GPT)", "decode_gpt"),
    ("heads + sampling", "heads"),
    ("Decoder + vocoder, first chunk", "audio"),
    ("rest of the engine steps", "rest"),
]


def _load(args: argparse.Namespace) -> Any:
    from chattts_server.threads import configure_threads

    configure_threads(None)  # as the server does, before torch loads
    from chattts_server.config import EngineConfig, ModelConfig
    from chattts_server.engine.runner import ModelRunner

    model = ModelConfig(dev_model=args.model, dev_model_cache=Path(args.cache), device="cpu")
    engine = EngineConfig()
    runner = ModelRunner.load(model, engine)
    runner.warmup(engine.max_streams)
    return runner, engine


def _timed(times: dict[str, float], key: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    def wrapper(*a: Any, **k: Any) -> Any:
        started = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            times[key] += time.perf_counter() - started

    return wrapper


def engine_first_audio(runner: Any, engine: Any, schedule: str, text: str) -> dict[str, float]:
    """One request's first audio in the engine, its parts in seconds ('total' too)."""
    from chattts_server.engine.core import EngineCore
    from chattts_server.engine.utterance import ChunkingOptions, SamplingParams, UtteranceRequest

    first, lookahead = (int(n) for n in schedule.split("/"))
    times: dict[str, float] = defaultdict(float)
    gpt, audio = runner.gpt, runner.audio
    real_forward, real_prepare = gpt.forward, runner.prepare
    real_code_step, real_audio_step = runner._code_step, audio.step

    def forward(prompts: list, decode: Any, *rest: Any) -> Any:
        key = "prefill" if prompts else "decode_gpt"
        return _timed(times, key, real_forward)(prompts, decode, *rest)

    gpt.forward = forward
    runner.prepare = _timed(times, "prepare", real_prepare)
    runner._code_step = _timed(times, "heads", real_code_step)
    audio.step = _timed(times, "audio_all", real_audio_step)
    try:
        core = EngineCore.from_config(runner, engine)
        request = UtteranceRequest(
            "r0",
            text,
            sampling=SamplingParams(min_new_tokens=TOKENS, max_new_tokens=TOKENS),
            chunking=ChunkingOptions(first, None, lookahead),
        )
        started = time.perf_counter()
        core.add_request(request)
        heard = False
        while not heard:
            audio_before = times["audio_all"]
            for out in core.step():
                heard = heard or bool(out.audio)
            if heard:
                times["audio"] = times["audio_all"] - audio_before
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


def server_first_audio(args: argparse.Namespace, repeats: int) -> list[float]:
    """The client's first audio through the real server, default flags, sequential requests."""
    from chattts_client import TTSClient
    from chattts_devtools.launcher import launch
    from chattts_proto.chattts.v1 import tts_pb2

    config = tts_pb2.SynthesisConfig(
        sampling=tts_pb2.Sampling(min_new_tokens=TOKENS, max_new_tokens=TOKENS)
    )

    ttfa = []
    with launch([], dev_model=args.model, cache=Path(args.cache), start_timeout_s=900) as srv:
        srv.wait_serving(900)
        with TTSClient(srv.target) as client:
            for i in range(repeats + 1):
                started = time.perf_counter()
                stream = client.synthesize(args.text, config=config, timeout=120)
                first = None
                for _ in stream:
                    if first is None:
                        first = time.perf_counter() - started
                if i:  # the first request pays for the client's own first call
                    ttfa.append(first if first is not None else float("nan"))
        srv.stop()
    return ttfa


def report(
    args: argparse.Namespace,
    engine: dict[str, list[dict[str, float]]],
    client: list[float],
    prompt_tokens: int,
) -> str:
    med = statistics.median
    schedules = list(engine)
    load = os.getloadavg()[0]
    lines = [
        "# First audio of a navigation prompt, one caller",
        "",
        f"{args.model.capitalize()} dev model (random weights), CPU, default server flags, the "
        f'prompt "{args.text}". Medians of {args.repeats} runs; load average '
        f"{load:.2f} at the end. Command: `python {' '.join(sys.argv)}`",
        "",
        "In the engine, ms (a schedule is first-chunk / first-chunk lookahead tokens; the "
        f"server's default is 4/4, 8/8 before issue 47; the prompt is {prompt_tokens} tokens"
        + (
            ": the dev model's tokenizer spells English words it does not know letter by "
            "letter, where ChatTTS's own vocabulary has most of them whole"
            if args.language == "en"
            else ", as ChatTTS's own vocabulary makes it: one token a character"
        )
        + "):",
        "",
        "| part | " + " | ".join(schedules) + " |",
        "|---" * (len(schedules) + 1) + "|",
    ]
    for label, key in [*PARTS, ("engine: request to first audio", "total")]:
        cells = " | ".join(f"{1e3 * med(r[key] for r in engine[s]):.1f}" for s in schedules)
        lines.append(f"| {label} | {cells} |")
    steps = " | ".join(
        f"{1e3 * med(r['decode_gpt'] for r in engine[s]) / max(1, _steps(s)):.1f}"
        for s in schedules
    )
    lines.append(f"| GPT decode step (each) | {steps} |")
    if client:
        default = med(r["total"] for r in engine[schedules[0]])
        lines += [
            "",
            f"Through the server ({schedules[0]}, gRPC, the client library): first audio "
            f"{1e3 * med(client):.1f} ms (p95 of {len(client)}: {1e3 * max(client):.1f} ms); "
            f"encoding + gRPC + hand-off + the engine thread's wake-up: "
            f"{1e3 * (med(client) - default):.1f} ms. Load average {load:.2f}.",
        ]
    return "\n".join(lines) + "\n"


def _steps(schedule: str) -> int:
    """Decode steps before the first chunk: its tokens and lookahead, less the prefill's one."""
    first, lookahead = (int(n) for n in schedule.split("/"))
    return first + lookahead - 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--schedules", default="4/4,8/8,4/8,4/2", help="the first is the default")
    parser.add_argument("--model", default="full", choices=["tiny", "full"])
    parser.add_argument("--cache", default=str(REPO / ".cache" / "dev-models"))
    parser.add_argument("--language", default="en", choices=sorted(PROMPTS))
    parser.add_argument("--skip-server", action="store_true")
    parser.add_argument("--out", default=str(REPO / "bench" / "results"))
    parser.add_argument("--smoke", action="store_true", help="tiny model, 1 repeat, a temp folder")
    args = parser.parse_args()
    if args.smoke:
        args.model, args.repeats, args.out = "tiny", 1, tempfile.mkdtemp(prefix="first_audio-")
    args.text = PROMPTS[args.language]
    runner, engine = _load(args)
    schedules = [s for s in args.schedules.split(",") if s]
    results: dict[str, list[dict[str, float]]] = {s: [] for s in schedules}
    for s in schedules:
        engine_first_audio(runner, engine, s, args.text)  # each schedule's first run: not counted
    for _ in range(args.repeats):
        for s in schedules:  # in turn, so that the machine's load falls on each alike
            results[s].append(engine_first_audio(runner, engine, s, args.text))
            print(
                f"  {s}: engine first audio {1e3 * results[s][-1]['total']:.1f} ms, "
                f"load average {os.getloadavg()[0]:.2f}",
                flush=True,
            )
    from chattts_server.engine.utterance import VoiceSpec

    prompts = runner.prompts
    normalized = prompts.normalize(args.text)
    prompt_tokens = prompts.code_prompt(normalized, VoiceSpec(), 5).embeds.shape[0]
    del runner
    client = [] if args.skip_server else server_first_audio(args, args.repeats)
    text = report(args, results, client, prompt_tokens)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    name = "first_audio.md" if args.language == "en" else f"first_audio_{args.language}.md"
    (out / name).write_text(text)
    print(text)
    print(f"wrote {out / name}")


if __name__ == "__main__":
    main()
