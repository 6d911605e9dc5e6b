"""haproxy.cfg's readiness check keeps traffic off a replica that is up but not ready: with
--no-listen-when-ready a replica listens while its model loads (health NOT_SERVING, /health 503,
every call refused), and under least connections it would draw every call. Two replicas, one
restarted under load behind the shipped file: no call fails. (test_haproxy_replicas.py runs its
replicas with default flags, which keep the ports closed while loading.)"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from chattts_devtools.replica_load import Load
from chattts_devtools.replicas import CONFIGS, REPLICA_ARGS, HAProxy, Replicas, haproxy_missing

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(haproxy_missing() is not None, reason=str(haproxy_missing())),
]


def test_a_loading_replica_draws_no_call_behind_the_readiness_check(
    dev_model_cache: Path, tiny_model_dir: Path
) -> None:
    with Replicas(2, dev_model_cache, [*REPLICA_ARGS, "--no-listen-when-ready"]) as replicas:
        replicas.start()
        with HAProxy(CONFIGS["haproxy"], replicas) as proxy:
            load = Load(proxy.grpc_target, proxy.http_url, num_callers=6).start()
            time.sleep(1.0)
            first = replicas.members[0]
            assert replicas.restart(first) == 0
            time.sleep(1.0)
            outcomes = load.stop()
    failed = [f"{o.kind}:{o.status}@{o.served_by}" for o in outcomes if not o.ok]
    assert outcomes and not failed, f"{len(failed)} of {len(outcomes)} failed: {failed[:10]}"
    assert {o.served_by for o in outcomes} >= {first.name, replicas.members[1].name}
