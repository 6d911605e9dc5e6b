"""Thread pools sized to the CPUs this process may use, set once at start-up.

torch's default intra-op pool has one thread per CPU of the *machine*. A container with a CPU
limit, a pod pinned to a few cores, or two replicas on one node then run more busy threads than
they have CPUs, and OpenMP threads that spin while they wait turn that into a collapse: two
replicas on a 2-core machine ran 40x slower than one alone. So:

- the intra-op pool gets the CPUs this process may use: its affinity mask, capped by the cgroup
  CPU quota (v2 ``cpu.max``, v1 ``cpu.cfs_quota_us``), rounded down, at least 1; ``--threads``
  (or ``OMP_NUM_THREADS``) overrides; a Kubernetes pod without a CPU limit has no quota to read,
  so the manifests pass its CPU request as ``--threads``;
- the inter-op pool gets one thread (the engine runs one model step at a time);
- libgomp spins :data:`SPIN_COUNT` (10000) times before a waiting thread sleeps, not its
  default 300000 (``GOMP_SPINCOUNT``; an operator's ``GOMP_SPINCOUNT`` or ``OMP_WAIT_POLICY``
  wins). Sizing alone is not enough: any neighbour that is busy at the same time (a second
  replica seeing the same CPUs, an ASR model, another agent's job) leaves our threads waiting at
  the barriers that end the ~500 parallel regions of a decode step, and with the long default
  spin the waiting threads burn the CPU the late one needs: two such replicas ran 94-107x slower
  than one alone. Sleeping at once (``OMP_WAIT_POLICY=PASSIVE``) made a lone decode step 1.9x
  slower (waking an idle vCPU is slow); 10000 spins cover the gaps between regions of one step;
- under sustained contention the engine's thread governor (thread_governor.py) drops
  the pool towards 1 thread, which runs each region inline with no barrier at all, and climbs
  back when CPUs sit idle (``--adaptive-threads``).

libgomp reads its settings when it loads, so :func:`configure_threads` runs before torch is
imported. bench/bench_neighbours.py measures both levers; bench/results/neighbours.md.
"""

from __future__ import annotations

import logging
import math
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

_CGROUP_ROOT = Path("/sys/fs/cgroup")
_PROC_CGROUP = Path("/proc/self/cgroup")
# Environment for OpenMP/MKL/BLAS/numba pools in this process and any child it starts.
_POOL_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")
SPIN_COUNT = 10000
"""libgomp's spins before a waiting thread sleeps (its default: 300000); see the module doc."""


@dataclass(frozen=True)
class CpuBudget:
    """How many CPUs this process may use, and why."""

    affinity: int
    """CPUs in the scheduler affinity mask (taskset, cpuset, Kubernetes static CPU manager)."""
    quota: float | None
    """cgroup CPU quota in CPUs (quota / period), None when unlimited or unreadable."""
    quota_file: str = ""
    """Where the quota was read."""

    @property
    def cpus(self) -> int:
        limit = self.affinity if self.quota is None else min(self.affinity, self.quota)
        return max(1, math.floor(limit))


def _v2_quota(root: Path, cgroup_path: str) -> tuple[float | None, str]:
    # The effective limit is the tightest one on the way from our cgroup up to the root.
    best: tuple[float | None, str] = (None, "")
    folder = root / cgroup_path.lstrip("/")
    while True:
        cpu_max = folder / "cpu.max"
        try:
            quota_text, period_text = cpu_max.read_text().split()[:2]
        except (OSError, ValueError):
            quota_text = "max"
            period_text = "1"
        if quota_text != "max":
            cpus = int(quota_text) / int(period_text)
            if best[0] is None or cpus < best[0]:
                best = (cpus, str(cpu_max))
        if folder == root or root not in folder.parents:
            return best
        folder = folder.parent


def _v1_quota(root: Path, controllers: str, cgroup_path: str) -> tuple[float | None, str]:
    # Inside a container the cgroup path named in /proc/self/cgroup is the host's, while the
    # container sees its own cgroup mounted at the controller's root: try both.
    for mount in {controllers, *controllers.split(",")}:
        for folder in (root / mount / cgroup_path.lstrip("/"), root / mount):
            try:
                quota = int((folder / "cpu.cfs_quota_us").read_text())
                period = int((folder / "cpu.cfs_period_us").read_text())
            except (OSError, ValueError):
                continue
            return (quota / period if quota > 0 and period > 0 else None), str(folder)
    return None, ""


def cgroup_cpu_quota(
    root: Path = _CGROUP_ROOT, proc_cgroup: Path = _PROC_CGROUP
) -> tuple[float | None, str]:
    """The cgroup CPU quota of this process in CPUs (None if unlimited) and the file it came
    from; cgroup v2 or v1."""
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        return None, ""
    for line in lines:
        hierarchy, controllers, path = line.split(":", 2)
        if hierarchy == "0" and controllers == "" and (root / "cgroup.controllers").exists():
            return _v2_quota(root, path)
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if "cpu" in controllers.split(","):
            return _v1_quota(root, controllers, path)
    return None, ""


def cpu_budget() -> CpuBudget:
    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 0
    quota, source = cgroup_cpu_quota()
    return CpuBudget(affinity or os.cpu_count() or 1, quota, source)


@dataclass(frozen=True)
class ThreadPlan:
    intra_op: int
    inter_op: int
    reason: str
    wait_policy: str
    spin_env: dict[str, str] = field(default_factory=dict)
    """OpenMP settings to put in the environment (the spin default, unless the operator set
    one)."""


def plan_threads(requested: int | None, budget: CpuBudget, env: dict[str, str]) -> ThreadPlan:
    """Threads for torch's pools: ``requested`` (``--threads``) if given, else the
    environment's ``OMP_NUM_THREADS`` if set, else the CPU budget; libgomp's spin before it
    sleeps: the operator's ``GOMP_SPINCOUNT`` or ``OMP_WAIT_POLICY`` if set, else ours."""
    quota = f"{budget.quota:g} CPUs ({budget.quota_file})" if budget.quota else "none"
    where = f"affinity {budget.affinity} CPUs, cgroup quota {quota}"
    from_env = env.get("OMP_NUM_THREADS", "")
    if requested:
        reason, intra = f"--threads {requested}; {where}", requested
    elif from_env.isdigit() and int(from_env) > 0:
        reason, intra = f"OMP_NUM_THREADS={from_env}; {where}", int(from_env)
    else:
        reason, intra = where, budget.cpus
    spin_env: dict[str, str] = {}
    if "GOMP_SPINCOUNT" in env or "OMP_WAIT_POLICY" in env:
        policy = " ".join(
            f"{k}={env[k]}" for k in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT") if k in env
        )
    else:
        spin_env = {"GOMP_SPINCOUNT": str(SPIN_COUNT)}
        policy = f"spin {SPIN_COUNT} then sleep (GOMP_SPINCOUNT default)"
    return ThreadPlan(intra, 1, reason, policy, spin_env)


def configure_threads(requested: int | None, adaptive: bool = False) -> ThreadPlan:
    """Size torch's thread pools (see the module doc); call first thing, before torch loads.
    ``adaptive`` only names the engine's thread governor in the log line."""
    plan = plan_threads(requested, cpu_budget(), dict(os.environ))
    for name in _POOL_ENV:
        os.environ[name] = str(plan.intra_op)
    if plan.spin_env and "torch" in sys.modules:
        log.warning("torch was loaded before configure_threads: OpenMP keeps its default spin")
    os.environ.update(plan.spin_env)
    import torch

    torch.set_num_threads(plan.intra_op)
    try:
        torch.set_num_interop_threads(plan.inter_op)
    except RuntimeError:  # already started (torch was used before): keep what it has
        log.warning(
            "torch inter-op pool already started; left at %d", torch.get_num_interop_threads()
        )
    log.info(
        "threads: %d intra-op, %d inter-op, OpenMP %s, %s (%s)",
        torch.get_num_threads(),
        torch.get_num_interop_threads(),
        plan.wait_policy,
        "fewer on CPU while a neighbour takes the CPUs (--adaptive-threads on)"
        if adaptive
        else "fixed (--adaptive-threads off)",
        plan.reason,
    )
    return plan
