"""Open the playground in headless Chromium against a real server, stream a sentence, check that
it played, and save a screenshot of the page with its timeline.

Starts `chattts-server --http-port` (dev model, CPU) through `chattts_server.launcher`, drives
Debian's /usr/bin/chromium with Selenium (tools/_playground.py), prints what the page measured
(first audio, chunks, audio scheduled, underruns, words highlighted) and writes
<out>/playground.png.

Usage: python tools/playground_check.py [--model tiny|full] [--route ws|post] [--out bench/results]
       python tools/playground_check.py --smoke    # tiny model, screenshot to a temp folder
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "client"), str(REPO / "server"), str(REPO / "tools")]

TEXT = (
    "In two hundred meters, turn left onto Main Street. Then keep right at the fork, "
    "and you will arrive at your destination."
)


def _args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny", choices=["tiny", "full"])
    parser.add_argument("--route", default="ws", choices=["ws", "post"])
    parser.add_argument("--max-tokens", type=int, default=120, help="audio tokens per sentence")
    parser.add_argument("--text", default=TEXT)
    parser.add_argument("--cache", default=str(REPO / ".cache" / "dev-models"))
    parser.add_argument("--out", default=str(REPO / "bench" / "results"))
    parser.add_argument(
        "--smoke", action="store_true", help="tiny model, screenshot to a temp folder"
    )
    args = parser.parse_args()
    if args.smoke:
        args.model, args.max_tokens = "tiny", 24
        args.out = tempfile.mkdtemp(prefix="playground_check-")
    return args


def main() -> int:
    args = _args()
    from _playground import browser_missing, run_playground

    missing = browser_missing()
    if missing:
        print(f"SKIPPED: no browser to drive: {missing}")
        return 0 if args.smoke else 1

    from chattts_devtools.launcher import launch

    out = Path(args.out) / "playground.png"
    with launch(["--max-streams", "2"], dev_model=args.model, cache=args.cache, http=True) as srv:
        srv.wait_serving(600)
        run = run_playground(
            srv.http_url + "/",
            args.text,
            route=args.route,
            max_tokens=args.max_tokens,
            screenshot=out,
            timeout_s=300,
            until_played_out=True,
        )
        srv.stop()
    print(run.stats_text)
    return _report(run, args.model, args.route, out)


def _report(run: Any, model: str, route: str, out: Path) -> int:
    state = run.state
    print(
        f"{model} model, {route}: first audio {state['firstAudioMs']:.0f} ms, "
        f"{len(state['chunks'])} chunks, {state['samplesScheduled'] / 24000:.2f} s of audio "
        f"scheduled, {state['underruns']} underruns, output peak {state['peak']:.3f}"
    )
    highlighted = [h["index"] for h in state["highlights"]]
    print(
        f"word timing ({state['wordTimingSource']}): {len(state['words'])} words, "
        f"{len(highlighted)} highlighted while they played, in order: "
        f"{highlighted == sorted(set(highlighted))}"
    )
    ok = not state["error"] and state["samplesScheduled"] > 0 and state["peak"] > 0
    print(f"wrote {out}" if ok else f"FAILED: {state['error'] or 'no audio played'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
