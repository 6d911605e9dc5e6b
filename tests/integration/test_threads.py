"""Thread pools sized to the CPUs the process may use (threads.py): cgroup v1/v2 quota parsing
on fake cgroup trees, the plan's precedence (--threads, OMP_NUM_THREADS, affinity and quota),
the spin default the operator's OpenMP settings override, and the server logging its choice at
start-up."""

from __future__ import annotations

import os
import urllib.request
from pathlib import Path

import pytest

from chattts_devtools.launcher import launch
from chattts_server.threads import SPIN_COUNT, CpuBudget, cgroup_cpu_quota, plan_threads


def _v2_tree(tmp_path: Path, limits: dict[str, str]) -> tuple[Path, Path]:
    root = tmp_path / "cgroup"
    root.mkdir()
    (root / "cgroup.controllers").write_text("cpu memory\n")
    for rel, cpu_max in limits.items():
        folder = root / rel
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "cpu.max").write_text(cpu_max + "\n")
    proc = tmp_path / "proc_cgroup"
    proc.write_text("0::/kubepods/pod1/ctr\n")
    (root / "kubepods/pod1/ctr").mkdir(parents=True, exist_ok=True)
    return root, proc


def test_cgroup_v2_quota_is_the_tightest_on_the_path_to_the_root(tmp_path: Path) -> None:
    root, proc = _v2_tree(tmp_path, {"kubepods": "400000 100000", "kubepods/pod1": "150000 100000"})
    quota, source = cgroup_cpu_quota(root, proc)
    assert quota == 1.5
    assert source.endswith("kubepods/pod1/cpu.max")


def test_cgroup_v2_without_a_limit(tmp_path: Path) -> None:
    root, proc = _v2_tree(tmp_path, {"kubepods/pod1/ctr": "max 100000"})
    assert cgroup_cpu_quota(root, proc) == (None, "")


def test_cgroup_v1_quota_from_the_container_root(tmp_path: Path) -> None:
    root = tmp_path / "cgroup"
    cpu = root / "cpu,cpuacct"
    cpu.mkdir(parents=True)
    (cpu / "cpu.cfs_quota_us").write_text("200000\n")
    (cpu / "cpu.cfs_period_us").write_text("100000\n")
    proc = tmp_path / "proc_cgroup"
    # The host's path, which the container does not see: the mount root is the container's.
    proc.write_text("4:memory:/docker/abc\n3:cpu,cpuacct:/docker/abc\n")
    assert cgroup_cpu_quota(root, proc)[0] == 2.0
    (cpu / "cpu.cfs_quota_us").write_text("-1\n")
    assert cgroup_cpu_quota(root, proc)[0] is None


def test_unreadable_cgroup_means_no_quota(tmp_path: Path) -> None:
    assert cgroup_cpu_quota(tmp_path, tmp_path / "missing") == (None, "")


@pytest.mark.parametrize(
    ("requested", "env", "budget", "threads"),
    [
        (None, {}, CpuBudget(8, None), 8),
        (None, {}, CpuBudget(8, 2.5, "cpu.max"), 2),  # quota rounded down
        (None, {}, CpuBudget(2, 6.0, "cpu.max"), 2),  # affinity tighter than the quota
        (None, {}, CpuBudget(4, 0.5, "cpu.max"), 1),  # at least one
        (None, {"OMP_NUM_THREADS": "3"}, CpuBudget(8, None), 3),
        (5, {"OMP_NUM_THREADS": "3"}, CpuBudget(8, 2.0, "cpu.max"), 5),  # --threads wins
    ],
)
def test_plan_precedence(
    requested: int | None, env: dict[str, str], budget: CpuBudget, threads: int
) -> None:
    plan = plan_threads(requested, budget, env)
    assert (plan.intra_op, plan.inter_op) == (threads, 1)


def test_spin_default_unless_the_operator_set_one() -> None:
    budget = CpuBudget(2, None)
    plan = plan_threads(None, budget, {})
    assert plan.spin_env == {"GOMP_SPINCOUNT": str(SPIN_COUNT)}
    assert plan.wait_policy == f"spin {SPIN_COUNT} then sleep (GOMP_SPINCOUNT default)"
    for env in ({"GOMP_SPINCOUNT": "300000"}, {"OMP_WAIT_POLICY": "PASSIVE"}):
        plan = plan_threads(None, budget, env)
        assert plan.spin_env == {}
        assert plan.wait_policy == " ".join(f"{k}={v}" for k, v in env.items())


def test_server_logs_its_thread_choice(dev_model_cache: Path, tiny_model_dir: Path) -> None:
    with launch(["--threads", "1", "--no-warmup"], cache=dev_model_cache) as srv:
        srv.stop()
    assert (
        f"threads: 1 intra-op, 1 inter-op, OpenMP spin {SPIN_COUNT} then sleep (GOMP_SPINCOUNT "
        "default), fewer on CPU while a neighbour takes the CPUs (--adaptive-threads on) "
        "(--threads 1;" in srv.log_text()
    )


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs")
def test_server_sizes_threads_from_its_affinity(
    dev_model_cache: Path, tiny_model_dir: Path
) -> None:
    # A child inherits the affinity mask, as a pod on Kubernetes' static CPU manager would.
    mask = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(mask)})
    try:
        srv = launch(["--no-warmup"], cache=dev_model_cache)
    finally:
        os.sched_setaffinity(0, mask)
    with srv:
        srv.stop()
    assert "threads: 1 intra-op, 1 inter-op" in srv.log_text()
    assert "affinity 1 CPUs" in srv.log_text()


def _metrics(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
        return str(reply.read().decode())


def test_metrics_show_the_governed_pool(dev_model_cache: Path, tiny_model_dir: Path) -> None:
    with launch(["--threads", "2", "--no-warmup"], cache=dev_model_cache, metrics=True) as srv:
        srv.wait_serving()
        text = _metrics(srv.metrics_port)
        srv.stop()
    # No request ran, so the governor has not looked yet: the pool is what start-up chose.
    assert "\nchattts_intra_op_threads 2.0\n" in text, text
    assert 'chattts_thread_adaptations_total{direction="down"} 0.0' in text, text
    assert 'chattts_thread_adaptations_total{direction="up"} 0.0' in text, text
    with launch(
        ["--threads", "2", "--no-warmup", "--adaptive-threads", "off"],
        cache=dev_model_cache,
        metrics=True,
    ) as srv:
        srv.wait_serving()
        text = _metrics(srv.metrics_port)
        srv.stop()
    assert "chattts_thread_adaptations" not in text
    assert "chattts_intra_op_threads" not in text
    assert "fixed (--adaptive-threads off)" in srv.log_text()
