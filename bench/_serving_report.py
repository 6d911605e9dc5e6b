"""bench_serving.py's levels: the per-token cost from the server's timers, and serving.md."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _common import Load, command, pct, table, write_result

TOKENS_PER_S = 24000 / 256 / 2  # GPT steps per second of audio (46.875)
# Per-token cost rows: label, server timers summed (see serving_profile/sitecustomize.py).
COST_ROWS = [
    # gpt_decode_graphs: the decode step through CUDA graphs (which never calls decode).
    (
        "GPT step (decode + prefill)",
        ["gpt_forward", "gpt_decode", "gpt_decode_graphs", "gpt_prefill", "gpt_llamacpp"],
    ),
    ("heads + sampling", ["heads_sampling"]),
    ("Decoder + vocoder", ["decoder_vocoder", "decoder_vocoder_finish"]),
    ("rest of the engine step", []),  # engine_step minus the three above
    ("audio encoding", ["encoding", "encoding_opus"]),
    ("gRPC, asyncio, hand-off, idle", []),  # wall per token minus all of the above
]
ALL_IN = "all-in (wall / tokens)"


@dataclass
class Level:
    """One concurrency of one server (or upstream)."""

    name: str
    mode: str
    concurrency: int
    load: Load
    cost_ms: dict[str, float] = field(default_factory=dict)  # per generated token
    load_average: float = float("nan")  # 1-minute, as the level ended

    def p(self, name: str, q: float) -> float:
        return pct(self.load.figure(name), q)


@dataclass
class ServerFacts:
    """What one server's log and process say beside its levels."""

    ready_s: float = float("nan")  # "engine ready in X s": load, GGUF, warm-up
    rss_mib: float = float("nan")  # resident memory after its levels
    gpt: str = ""  # the log's "GPT: ..." line


def read_profile(path: Path) -> dict[str, list[float]]:
    try:
        return dict(json.loads(path.read_text()))
    except (OSError, ValueError):
        return {}


def cost_per_token(
    before: dict[str, list[float]], after: dict[str, list[float]], wall_s: float
) -> dict[str, float]:
    def spent(keys: list[str]) -> float:
        return sum(after.get(k, [0, 0])[0] - before.get(k, [0, 0])[0] for k in keys)

    tokens = int(spent(["decode_rows"]))
    if tokens <= 0:
        return {}
    ms = {label: 1e3 * spent(keys) / tokens for label, keys in COST_ROWS if keys}
    engine = 1e3 * spent(["engine_step"]) / tokens
    inside = sum(ms[label] for label, _ in COST_ROWS[:3])
    ms["rest of the engine step"] = max(0.0, engine - inside)
    ms[ALL_IN] = 1e3 * wall_s / tokens
    ms["gRPC, asyncio, hand-off, idle"] = max(0.0, ms[ALL_IN] - engine - ms["audio encoding"])
    return ms


def _levels_table(up: Level | None, ours: list[Level]) -> str:
    header = ["run", "streams", "requests", "TTFA p50 s", "TTFA p95 s", "gap-free start p50 s"]
    header += ["gap-free p95 s", "RTF p50 (per stream)", "RTF max", "audio s / wall s"]
    rows = [
        [
            lv.name, lv.concurrency, len(lv.load.calls), f"{lv.p('ttfa_s', 50):.2f}",
            f"{lv.p('ttfa_s', 95):.2f}", f"{lv.p('gap_free_s', 50):.2f}",
            f"{lv.p('gap_free_s', 95):.2f}", f"{lv.p('rtf', 50):.2f}",
            f"{max(lv.load.figure('rtf'), default=float('nan')):.2f}",
            f"{lv.load.throughput:.2f}", lv.load.errors, f"{lv.load_average:.2f}",
        ]
        for lv in ([up] if up else []) + ours
    ]  # fmt: skip
    return table([*header, "errors", "load avg"], rows)


def _against_upstream(up: Level, ours: list[Level]) -> list[str]:
    lines = ["Against upstream in the same run (targets of issue 47 in brackets):", ""]
    for mode in dict.fromkeys(lv.mode for lv in ours):
        by_c = {lv.concurrency: lv for lv in ours if lv.mode == mode}
        parts = []
        if 1 in by_c and by_c[1].load.figure("ttfa_s"):
            c1 = by_c[1]
            parts.append(
                f"1 stream: first audio {c1.p('ttfa_s', 50):.3f} s = "
                f"{c1.p('ttfa_s', 50) / up.p('ttfa_s', 50):.3f}x upstream's [<= 0.04x], "
                f"RTF {c1.p('rtf', 50):.2f} [<= 0.6], gap-free start "
                f"{c1.p('gap_free_s', 50):.2f} s [<= 0.5 s]"
            )
        if 4 in by_c and by_c[4].load.figure("rtf"):
            c4 = by_c[4].load
            parts.append(
                f"4 streams: RTF max {max(c4.figure('rtf')):.2f} [<= 1], gap-free start max "
                f"{max(c4.figure('gap_free_s')):.2f} s [<= 0.5 s]"
            )
        top = by_c[max(by_c)]
        parts.append(
            f"{top.concurrency} streams throughput {top.load.throughput / up.load.throughput:.1f}x"
            f" upstream sequential [>= 20x], first-audio p95 {top.p('ttfa_s', 95):.2f} s "
            "[<= 1.0 s]"
        )
        lines.append(f"- {mode}: " + "; ".join(parts))
    return [*lines, ""]


def _cost_table(levels: list[Level]) -> list[str]:
    labels = [label for label, _ in COST_ROWS] + [ALL_IN]
    rows: list[list[Any]] = [
        [label, *(f"{lv.cost_ms.get(label, float('nan')):.2f}" for lv in levels)]
        for label in labels
    ]
    gpt = "GPT step (decode + prefill)"
    rows.append(
        ["all-in / GPT step", *(f"{lv.cost_ms[ALL_IN] / lv.cost_ms[gpt]:.2f}" for lv in levels)]
    )
    header = ["component", *(f"{lv.mode} c{lv.concurrency}" for lv in levels)]
    return [
        "Cost per generated token, ms (timers inside the server; at N streams a step "
        "serves N tokens, so per-token figures are the step's share):",
        "",
        table(header, rows),
        "",
    ]


def write_report(
    args: Any, up: Level | None, ours: list[Level], servers: dict[str, ServerFacts]
) -> str:
    """serving.md in --out, written whole; its text."""
    lines = [
        "# Serving benchmark",
        "",
        f"{args.model.capitalize()} dev model (random weights), {args.device}, {args.tokens} "
        f"tokens per stream ({args.tokens / TOKENS_PER_S:.2f} s of audio), server --max-streams "
        f"{args.max_streams}, one server per `--modes` entry (`default`: the server's default "
        "flags; `gguf:<format>`: the GPT in that format). "
        f"Load average at the end {os.getloadavg()[0]:.1f}. Command: {command()}",
        "",
        _levels_table(up, ours),
        "",
    ]
    if servers:
        header = ["server", "GPT", "engine ready (cold start) s"]
        rows = [[m, f.gpt, f"{f.ready_s:.1f}", f"{f.rss_mib:.0f}"] for m, f in servers.items()]
        lines += [table([*header, "resident memory after its levels MiB"], rows), ""]
    if up and ours:
        lines += _against_upstream(up, ours)
    cost_levels = [lv for lv in ours if lv.cost_ms]
    if cost_levels:
        lines += _cost_table(cost_levels)
    text = "\n".join(lines)
    write_result(Path(args.out) / "serving.md", text)
    return text
