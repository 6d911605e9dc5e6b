"""Replicas under load through rolling restarts and a kill -9, with default flags (issue 40).

Three tiny replicas on fixed loopback ports, started with default flags (so their ports stay
closed while the model loads). One load per setup runs at once, eight callers each mixing the
client library's resumable stream, Synthesize, a fragmented stream, a POST and a WebSocket
(tools/chattts_devtools/replica_load.py):
- `haproxy`: deploy/haproxy/haproxy.cfg as shipped (readiness checks on the HTTP door);
- `plain`: deploy/haproxy/haproxy-plain.cfg as shipped (TCP checks);
- `operator`: the config most operators write (tools/chattts_devtools/haproxy-operator.cfg: TCP
  checks, `retries 3`, `option redispatch`, no `retry-on`);
- `direct`: no proxy, chattts_client's default service config (gRPC calls only).

Every replica is restarted in turn (SIGTERM, drain, relaunch, SERVING before the next), round
after round, until every load has made `--min-calls` calls. Then one replica is killed with
SIGKILL. Printed per setup: the restarts' calls and failures (gRPC and HTTP apart), each failure's
status and whether it had audio; the kill's failed calls, their statuses, the longest time from
the kill to a failure, whether every call started after the kill succeeded, and the survivors'
first-audio p95 before and during (5 s from) the kill; HAProxy's own log lines for its 5xx.

Usage: python bench/bench_replicas.py [--setups haproxy,plain,operator,direct] [--min-calls 1000]
       python bench/bench_replicas.py --smoke   # two replicas, one restart, a kill
"""

from __future__ import annotations

import time

from _common import CACHE, arguments, load_line

from chattts_devtools.replica_load import KINDS, RESUMABLE, Load, Outcome, judge_kill, p95
from chattts_devtools.replicas import CONFIGS, REPLICA_ARGS, HAProxy, Replicas, haproxy_missing

SETTLE_S = 1.5
"""Load before and after each event, so calls in flight meet it."""
HTTP_KINDS = ("post", "websocket")
MIX = (RESUMABLE, *KINDS)
"""Each setup's callers, in turn: the client library's resumable stream first, so that 8 callers
give it 2."""


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.0f} ms"


def _count(outcomes: list[Outcome], http: bool) -> str:
    mine = [o for o in outcomes if (o.kind in HTTP_KINDS) == http and o.kind != RESUMABLE]
    return f"{sum(not o.ok for o in mine)}/{len(mine)}"


def _resumable(outcomes: list[Outcome]) -> str:
    """The resumable streams: failed/calls, and the resumes (those that went on elsewhere)."""
    mine = [o for o in outcomes if o.kind == RESUMABLE]
    resumes = sum(o.resumes for o in mine)
    elsewhere = sum(o.new_streams for o in mine)
    return f"{sum(not o.ok for o in mine)}/{len(mine)} ({resumes} resumed, {elsewhere} elsewhere)"


def proxy_errors(proxies: dict[str, HAProxy], limit: int = 4) -> list[str]:
    """HAProxy's log lines for the requests it answered 5xx (which replica, and why: the
    termination state), for each setup that had any."""
    rows = []
    for setup, proxy in proxies.items():
        lines = [ln.strip() for ln in proxy.log if any(f" {c} " in ln for c in (502, 503, 504))]
        rows += [f"  {setup} haproxy: {line[:220]}" for line in lines[:limit]]
    return rows


def start_loads(
    setups: list[str], replicas: Replicas, proxies: dict[str, HAProxy], callers: int
) -> dict[str, Load]:
    def load(setup: str) -> Load:
        if setup == "direct":
            return Load(replicas.direct_target, None, callers, kinds=MIX)
        return Load(proxies[setup].grpc_target, proxies[setup].http_url, callers, kinds=MIX)

    return {setup: load(setup).start() for setup in setups}


def rolling_restarts(
    loads: dict[str, Load],
    replicas: Replicas,
    min_calls: int,
    max_rounds: int,
    restarts: int | None = None,
) -> list[str]:
    """Restart every replica in turn (the first `restarts` of them a round, if given) until
    each load has `min_calls` calls; the report."""
    started = time.monotonic()
    time.sleep(SETTLE_S)
    rounds = 0
    while rounds < max_rounds:
        for replica in replicas.members[:restarts]:
            if (code := replicas.restart(replica)) != 0:
                raise RuntimeError(f"{replica.name} exited {code} on SIGTERM")
        rounds += 1
        if min(len(load.outcomes) for load in loads.values()) >= min_calls:
            break
    time.sleep(SETTLE_S)
    rows = [
        f"rolling restarts: {rounds} rounds of {len(replicas.members[:restarts])} replicas in "
        f"{time.monotonic() - started:.0f} s, {load_line()}",
        f"{'setup':9} {'calls':>6} {'gRPC failed':>12} {'HTTP failed':>12}  resumable failed",
    ]
    for setup, load in loads.items():
        outcomes = load.stop()
        http = _count(outcomes, http=True) if setup != "direct" else "-"
        rows.append(
            f"{setup:9} {len(outcomes):>6} {_count(outcomes, http=False):>12} {http:>12}  "
            f"{_resumable(outcomes)}"
        )
        rows += sorted(
            {
                f"    {o.kind}:{o.status}@{o.served_by or '?'} "
                f"{'after audio' if o.first_audio else 'before audio'} {o.detail}"
                for o in outcomes
                if not o.ok
            }
        )
    return rows


def kill_9(loads: dict[str, Load], replicas: Replicas, revive: bool) -> list[str]:
    victim = replicas.members[-1]
    time.sleep(2 * SETTLE_S)
    kill_at = time.monotonic()
    replicas.kill(victim)
    time.sleep(5.0)
    results = {name: load.stop() for name, load in loads.items()}
    if revive:
        replicas.revive(victim)
    rows = [
        f"{'setup':9} {'kill -9':>10} {'kill statuses':>44} {'to error':>10} {'after ok':>6}"
        "  first-audio p95 before -> during; resumable failed"
    ]
    for setup, outcomes in results.items():
        report = judge_kill(outcomes, kill_at)
        after_ok = all(o.ok for o in report.started_after)
        failed = f"{len(report.failed)}/{len(outcomes)}"
        rows.append(
            f"{setup:9} {failed:>10} {','.join(report.statuses) or '-':>44} "
            f"{_ms(report.max_time_to_error_s):>10} "
            f"{'yes' if after_ok else 'NO':>6} ({len(report.started_after)}) "
            f"{_ms(p95(report.ttfa_before)):>9} -> {_ms(p95(report.ttfa_during))}; "
            f"{_resumable(outcomes)}"
        )
    return rows


def main() -> None:
    parser = arguments(__doc__, "two replicas, one restart, a kill")
    parser.add_argument("--setups", default="haproxy,plain,operator,direct", help="comma-separated")
    parser.add_argument("--callers", type=int, default=8, help="concurrent callers per setup")
    parser.add_argument("--min-calls", type=int, default=1000, help="calls per setup, at least")
    parser.add_argument("--max-rounds", type=int, default=12, help="rolling restarts, at most")
    args = parser.parse_args()
    setups = args.setups.split(",")
    if missing := haproxy_missing():
        print(f"skipping the proxy setups: {missing}")
        setups = [s for s in setups if s == "direct"]
    if args.smoke:
        setups, args.callers, args.min_calls, args.max_rounds = setups[:1], 4, 0, 1
    print(f"before: {load_line()}")
    with Replicas(2 if args.smoke else 3, CACHE, REPLICA_ARGS) as replicas:
        replicas.start()
        proxies = {s: HAProxy(CONFIGS[s], replicas) for s in setups if s in CONFIGS}
        try:
            for proxy in proxies.values():
                proxy.start()
            loads = start_loads(setups, replicas, proxies, args.callers)
            # The smoke run restarts one replica: the same path, half the wait.
            restarts = 1 if args.smoke else None
            rows = rolling_restarts(loads, replicas, args.min_calls, args.max_rounds, restarts)
            print("\n".join(rows), flush=True)
            loads = start_loads(setups, replicas, proxies, args.callers)
            rows = kill_9(loads, replicas, revive=not args.smoke)
            rows += proxy_errors(proxies) or ["no 5xx in HAProxy's logs"]
            print("\n".join(rows), flush=True)
        finally:
            for proxy in proxies.values():
                proxy.stop()
    print(
        f"{len(replicas.members)} replicas ({' '.join(REPLICA_ARGS)}), {args.callers} callers "
        f"per setup; after: {load_line()}"
    )


if __name__ == "__main__":
    main()
