"""Replicas under load through a rolling restart and a kill -9: the figures of issue 28.

Three tiny replicas (--listen-when-ready, so the TCP-checked proxy works too) on fixed loopback
ports; for each setup in turn, eight callers mixing Synthesize, a fragmented stream and a POST
(tools/chattts_devtools/replica_load.py) run while every replica is restarted in turn (SIGTERM,
drain, relaunch, SERVING before the next), then while one replica is killed with SIGKILL.
Setups: `haproxy` (deploy/haproxy/haproxy.cfg as shipped), `plain` (haproxy-plain.cfg, TCP
checks only), `direct` (no proxy: chattts_client's default service config, gRPC calls only).

Printed per setup: the rolling restart's failed calls; the kill's failed calls, their statuses,
the longest time from the kill to a failure, whether every call started after the kill
succeeded, and the survivors' first-audio p95 before and during (5 s from) the kill.

Usage: python bench/bench_replicas.py [--setups haproxy,plain,direct] [--callers 8]
       python bench/bench_replicas.py --smoke   # two replicas, one setup, a kill only
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / d) for d in ("client", "server", "tools")]

from chattts_devtools.replica_load import Load, Outcome, judge_kill, p95  # noqa: E402
from chattts_devtools.replicas import (  # noqa: E402
    CONFIGS,
    LISTEN_WHEN_READY,
    REPLICA_ARGS,
    HAProxy,
    Replicas,
    haproxy_missing,
)

CACHE = REPO / ".cache" / "dev-models"
SETTLE_S = 1.5
"""Load before and after each event, so calls in flight meet it."""


def _failed(outcomes: list[Outcome]) -> str:
    return f"{sum(not o.ok for o in outcomes)}/{len(outcomes)}"


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.0f} ms"


def _load(setup: str, replicas: Replicas, proxies: dict[str, HAProxy], callers: int) -> Load:
    if setup == "direct":
        return Load(replicas.direct_target, None, callers).start()
    proxy = proxies[setup]
    return Load(proxy.grpc_target, proxy.http_url, callers).start()


def rolling_restart(load: Load, replicas: Replicas) -> list[Outcome]:
    time.sleep(SETTLE_S)
    for replica in replicas.members:
        replicas.restart(replica)
    time.sleep(SETTLE_S)
    return load.stop()


def kill_9(load: Load, replicas: Replicas, revive: bool) -> tuple[list[Outcome], float]:
    victim = replicas.members[-1]
    time.sleep(2 * SETTLE_S)
    kill_at = time.monotonic()
    replicas.kill(victim)
    time.sleep(5.0)
    outcomes = load.stop()
    if revive:
        replicas.revive(victim)
    return outcomes, kill_at


def run_setup(
    setup: str, replicas: Replicas, proxies: dict[str, HAProxy], args: argparse.Namespace
) -> str:
    """One row. --smoke skips the rolling restart and the revival (the slow parts: each
    relaunch loads a model) and only kills."""
    restart = "skipped"
    if not args.smoke:
        restart = _failed(rolling_restart(_load(setup, replicas, proxies, args.callers), replicas))
    killed, kill_at = kill_9(
        _load(setup, replicas, proxies, args.callers), replicas, revive=not args.smoke
    )
    report = judge_kill(killed, kill_at)
    after_ok = all(o.ok for o in report.started_after)
    details = sorted({f"{o.status}: {o.detail}" for o in report.failed if o.detail})
    return (
        "\n".join(f"  ({d})" for d in details)
        + ("\n" if details else "")
        + f"{setup:8} {restart:>10} {_failed(killed):>10} "
        f"{','.join(report.statuses) or '-':>44} {_ms(report.max_time_to_error_s):>10} "
        f"{'yes' if after_ok else 'NO':>6} ({len(report.started_after)}) "
        f"{_ms(p95(report.ttfa_before)):>9} -> {_ms(p95(report.ttfa_during))}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--setups", default="haproxy,plain,direct", help="comma-separated")
    parser.add_argument("--callers", type=int, default=8, help="concurrent callers per setup")
    parser.add_argument("--smoke", action="store_true", help="two replicas, one setup, a kill only")
    args = parser.parse_args()
    setups = args.setups.split(",")
    missing = haproxy_missing()
    if missing:
        print(f"skipping the proxy setups: {missing}")
        setups = [s for s in setups if s == "direct"]
    if args.smoke:
        setups, args.callers = setups[:1], 4
    with Replicas(2 if args.smoke else 3, CACHE, [*REPLICA_ARGS, *LISTEN_WHEN_READY]) as replicas:
        replicas.start()
        proxies = {s: HAProxy(CONFIGS[s], replicas) for s in setups if s in CONFIGS}
        try:
            for proxy in proxies.values():
                proxy.start()
            print(
                f"{'setup':8} {'restart':>10} {'kill -9':>10} {'kill statuses':>44} "
                f"{'to error':>10} {'after ok':>6}  first-audio p95 before -> during"
            )
            for setup in setups:
                print(run_setup(setup, replicas, proxies, args), flush=True)
        finally:
            for proxy in proxies.values():
                proxy.stop()
    print(f"{len(replicas.members)} replicas, {args.callers} callers; a loaded machine's figures")


if __name__ == "__main__":
    main()
