"""Fewer intra-op threads while a neighbour takes our CPUs, more again once they are idle.

Sizing the pool to the CPU budget (threads.py) is right on a quiet machine and wrong beside a
busy neighbour: another replica, an ASR model, any OpenMP process. Then our threads wait for
CPUs, and every parallel region (about 500 per decode step) ends at a barrier where the threads
that did run wait for the one that did not. One thread runs each region inline, with no barrier,
so under contention it is faster than two.

The signal is the kernel's own: the time the model's threads spent runnable but waiting for a
CPU (``/proc/self/task/*/schedstat``, second field), against busy wall time times threads.
That is near zero alone and about one half when two busy threads share each CPU. The model's
threads are the engine thread and the OpenMP workers it starts, which inherit its name
(:func:`name_model_thread`, called before the model loads); the server's other threads (asyncio,
gRPC) are left out, so a busy front door does not read as a neighbour. Climbing back is decided
by the CPUs of our affinity mask that sat idle (``/proc/stat``) while we were busy.

- Every ``window_s`` of busy engine time (model steps back to back; a gap restarts the window)
  the governor reads both. Waiting for ``drop_wait_share`` of the time or more: threads drop to
  about the share of CPU they got (at least 1, at least one fewer).
- Below the ceiling, with ``climb_idle_cpus`` or more idle CPUs over a window and ``hold_s`` of
  busy time since the last change: threads climb by the idle CPUs. A climb that is dropped again
  within ``hold_s`` doubles the hold (up to ``max_hold_s``), so a neighbour that is busy only
  while we are idle costs a probe every ``max_hold_s``, not every window.

Decisions are pure (:func:`decide`, unit-tested with made-up samples); :class:`ThreadGovernor`
reads ``/proc`` and calls ``torch.set_num_threads`` on the engine thread, which is where the
model's parallel regions start (OpenMP's thread count is per calling thread).
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

log = logging.getLogger(__name__)

_PROC_TASKS = Path("/proc/self/task")
MODEL_THREAD_NAME = "chattts-engine"
"""The engine thread's OS name (at most 15 bytes), inherited by the OpenMP workers it starts."""
_PROC_STAT = Path("/proc/stat")
_USER_HZ = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


@dataclass(frozen=True)
class Policy:
    window_s: float = 0.5
    """Busy time each decision looks at."""
    gap_s: float = 0.2
    """A pause between model steps longer than this restarts the window (the engine idled)."""
    drop_wait_share: float = 0.3
    """Drop threads when they waited for a CPU this share of busy time x threads (alone: ~0)."""
    climb_idle_cpus: float = 0.75
    """Climb when this many CPUs of the affinity mask sat idle while we were busy."""
    hold_s: float = 2.0
    """Busy time at a thread count before climbing from it."""
    max_hold_s: float = 32.0
    """Ceiling of the hold after climbs that were dropped again."""


@dataclass(frozen=True)
class Sample:
    """One window of busy engine time."""

    wall_s: float
    wait_s: float
    """Run-queue wait summed over this process's threads."""
    idle_cpus: float
    """Idle CPU time of the affinity mask's CPUs over wall time."""


@dataclass(frozen=True)
class State:
    threads: int
    max_threads: int
    busy_since_change_s: float = 0.0
    hold_s: float = Policy.hold_s
    last_was_climb: bool = False


def decide(state: State, sample: Sample, policy: Policy = Policy()) -> State:
    """The thread count after one window (the same state, time added, when nothing changes)."""
    busy = state.busy_since_change_s + sample.wall_s
    wait_share = sample.wait_s / (sample.wall_s * state.threads) if sample.wall_s > 0 else 0.0
    if state.threads > 1 and wait_share >= policy.drop_wait_share:
        got = math.floor(state.threads * (1.0 - min(wait_share, 1.0)) + 1e-9)
        hold = state.hold_s
        if state.last_was_climb and busy < state.hold_s:
            hold = min(2 * state.hold_s, policy.max_hold_s)  # that climb was premature
        threads = max(1, min(state.threads - 1, got))
        return State(threads, state.max_threads, 0.0, hold, last_was_climb=False)
    if (
        state.threads < state.max_threads
        and sample.idle_cpus >= policy.climb_idle_cpus
        and busy >= state.hold_s
    ):
        extra = max(1, math.floor(sample.idle_cpus + 1 - policy.climb_idle_cpus))
        threads = min(state.max_threads, state.threads + extra)
        return State(threads, state.max_threads, 0.0, state.hold_s, last_was_climb=True)
    hold = state.hold_s
    if state.last_was_climb and busy >= state.hold_s:
        hold = policy.hold_s  # the climb held: forget earlier back-offs
    return replace(state, busy_since_change_s=busy, hold_s=hold)


def name_model_thread(name: str = MODEL_THREAD_NAME) -> bool:
    """Give the calling thread an OS name (Linux ``prctl(PR_SET_NAME)``) that the threads it
    starts inherit; False where that is not possible (then every thread counts)."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(15, name.encode()[:15], 0, 0, 0)) == 0  # PR_SET_NAME
    except (OSError, AttributeError):
        return False


def _thread_name() -> str:
    try:
        return Path("/proc/thread-self/comm").read_text().strip()
    except OSError:
        return ""


def _task_waits_ns(name: str = "", names: dict[str, str] | None = None) -> dict[str, int]:
    """Run-queue wait so far of each of this process's threads (by tid), only those called
    ``name`` if given; ``names`` caches the threads' names between calls."""
    waits = {}
    names = {} if names is None else names
    try:
        tasks = list(_PROC_TASKS.iterdir())
    except OSError:
        return {}
    for task in tasks:
        try:
            if name:
                if task.name not in names:
                    names[task.name] = (task / "comm").read_text().strip()
                if names[task.name] != name:
                    continue
            waits[task.name] = int((task / "schedstat").read_text().split()[1])
        except (OSError, IndexError, ValueError):
            continue  # the thread ended meanwhile
    return waits


def _idle_ticks(cpus: set[int]) -> int:
    total = 0
    try:
        lines = _PROC_STAT.read_text().splitlines()
    except OSError:
        return 0
    for line in lines:
        name, _, rest = line.partition(" ")
        if name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in cpus:
            fields = rest.split()
            total += int(fields[3]) + int(fields[4])  # idle + iowait
    return total


@dataclass
class _Reading:
    at_s: float
    waits_ns: dict[str, int]
    idle_ticks: int


def _read(clock: Callable[[], float], cpus: set[int], name: str, names: dict[str, str]) -> _Reading:
    return _Reading(clock(), _task_waits_ns(name, names), _idle_ticks(cpus))


def _sample(before: _Reading, after: _Reading) -> Sample:
    # Only threads present at both readings: a new thread's whole history is not this window's.
    wait_ns = sum(
        ns - before.waits_ns[tid] for tid, ns in after.waits_ns.items() if tid in before.waits_ns
    )
    wall_s = after.at_s - before.at_s
    idle = (after.idle_ticks - before.idle_ticks) / _USER_HZ
    return Sample(wall_s, max(0, wait_ns) / 1e9, idle / wall_s if wall_s > 0 else 0.0)


@dataclass
class ThreadGovernor:
    """Adapts torch's intra-op threads on the engine thread; call :meth:`after_step` there."""

    max_threads: int
    set_threads: Callable[[int], None]
    policy: Policy = field(default_factory=Policy)
    clock: Callable[[], float] = time.monotonic
    cpus: set[int] = field(default_factory=lambda: set(os.sched_getaffinity(0)))
    thread_name: str = ""
    """Count only the threads of this OS name (the model's); empty: every thread."""
    drops: int = 0
    climbs: int = 0
    state: State = field(init=False)
    _start: _Reading | None = field(default=None, init=False)
    _last_step_s: float = field(default=0.0, init=False)
    _names: dict[str, str] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        self.state = State(self.max_threads, self.max_threads, hold_s=self.policy.hold_s)

    @classmethod
    def for_torch(
        cls, policy: Policy | None = None, also: Callable[[int], None] | None = None
    ) -> ThreadGovernor | None:
        """A governor over torch's pool at its current size (the ceiling); None at 1 thread.
        Call it on the thread that runs the model; where that thread was named with
        :func:`name_model_thread` before it first ran torch, only it and its workers count.
        `also` is told each new count too (llama.cpp's pool, when it runs the GPT)."""
        import torch

        threads = torch.get_num_threads()
        if threads <= 1:
            return None
        name = _thread_name()

        def set_threads(count: int) -> None:
            torch.set_num_threads(count)
            if also is not None:
                also(count)

        return cls(
            threads,
            set_threads,
            policy or Policy(),
            thread_name=name if name == MODEL_THREAD_NAME else "",
        )

    @property
    def threads(self) -> int:
        return self.state.threads

    def after_step(self, ran_model: bool = True) -> None:
        """After each engine step (cheap: reads /proc once per window)."""
        now = self.clock()
        if not ran_model or now - self._last_step_s > self.policy.gap_s:
            self._start = None  # the engine idled (or only waited on readers): a new window
        self._last_step_s = now
        if not ran_model:
            return
        if self._start is None:
            self._start = _read(self.clock, self.cpus, self.thread_name, self._names)
            return
        if now - self._start.at_s < self.policy.window_s:
            return
        end = _read(self.clock, self.cpus, self.thread_name, self._names)
        self.apply(_sample(self._start, end))
        self._start = end

    def apply(self, sample: Sample) -> None:
        """Decide on one window and set the pool if the count changed."""
        before = self.state.threads
        self.state = decide(self.state, sample, self.policy)
        after = self.state.threads
        if after == before:
            return
        self.set_threads(after)
        if after < before:
            self.drops += 1
        else:
            self.climbs += 1
        log.info(
            "threads: %d -> %d intra-op (waited for a CPU %.0f%% of %.2f s x %d threads, "
            "%.1f CPUs idle; next climb after %.0f s busy)",
            before,
            after,
            100 * sample.wait_s / (sample.wall_s * before) if sample.wall_s > 0 else 0,
            sample.wall_s,
            before,
            sample.idle_cpus,
            self.state.hold_s,
        )
