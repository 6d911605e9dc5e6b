"""The thread governor's decisions (thread_governor.py) on made-up windows: it drops
threads when they wait for CPUs, climbs back only when CPUs sit idle and after a hold, backs
off from climbs that were dropped again, and ignores time the engine was idle. Its real effect
beside busy neighbours is tested end to end (tests/e2e/test_replicas_under_load.py)."""

from __future__ import annotations

import threading

from chattts_server.thread_governor import (
    Policy,
    Sample,
    State,
    ThreadGovernor,
    _Reading,
    _sample,
    _task_waits_ns,
    decide,
    name_model_thread,
)

POLICY = Policy()


def _window(wait_share: float, threads: int, idle_cpus: float = 0.0, wall_s: float = 0.5) -> Sample:
    return Sample(wall_s, wait_share * wall_s * threads, idle_cpus)


def test_alone_it_keeps_the_threads() -> None:
    state = State(2, 2)
    for _ in range(20):
        state = decide(state, _window(0.05, 2, idle_cpus=0.1))
    assert state.threads == 2


def test_threads_that_wait_half_the_time_drop_to_the_share_they_get() -> None:
    assert decide(State(2, 2), _window(0.5, 2)).threads == 1
    assert decide(State(16, 16), _window(0.5, 16)).threads == 8
    assert decide(State(16, 16), _window(0.9, 16)).threads == 1
    # Just past the threshold: at least one fewer.
    assert decide(State(4, 4), _window(POLICY.drop_wait_share, 4)).threads == 2
    assert decide(State(16, 16), _window(POLICY.drop_wait_share, 16)).threads == 11


def test_one_thread_never_drops() -> None:
    assert decide(State(1, 2), _window(0.9, 1)).threads == 1


def test_it_climbs_only_with_idle_cpus_and_after_the_hold() -> None:
    state = decide(State(2, 2), _window(0.5, 2))
    assert state.threads == 1
    # A neighbour still busy: no idle CPU, no climb however long.
    for _ in range(10):
        state = decide(state, _window(0.0, 1, idle_cpus=0.1))
    assert state.threads == 1
    # The neighbour went quiet: climb once the hold has passed, not before.
    state = State(1, 2, hold_s=POLICY.hold_s)
    steps = 0
    while state.threads == 1:
        state = decide(state, _window(0.0, 1, idle_cpus=1.0))
        steps += 1
    assert state.threads == 2
    assert steps * 0.5 >= POLICY.hold_s
    assert state.threads <= state.max_threads


def test_climb_adds_the_idle_cpus_up_to_the_ceiling() -> None:
    state = State(2, 8, busy_since_change_s=10.0)
    assert decide(state, _window(0.0, 2, idle_cpus=4.0)).threads == 6
    assert decide(state, _window(0.0, 2, idle_cpus=20.0)).threads == 8


def test_a_climb_dropped_at_once_doubles_the_hold_up_to_its_ceiling() -> None:
    state = State(1, 2, busy_since_change_s=10.0)
    holds = []
    for _ in range(10):
        state = decide(state, _window(0.0, 1, idle_cpus=1.0))
        assert state.threads == 2
        state = decide(state, _window(0.5, 2))  # the neighbour was only between its own steps
        assert state.threads == 1
        holds.append(state.hold_s)
        state = State(1, 2, busy_since_change_s=state.hold_s, hold_s=state.hold_s)
    assert holds[0] == 2 * POLICY.hold_s
    assert holds == sorted(holds)
    assert holds[-1] == POLICY.max_hold_s


def test_a_climb_that_holds_resets_the_back_off() -> None:
    state = State(2, 2, hold_s=POLICY.max_hold_s, last_was_climb=True)
    state = decide(state, _window(0.0, 2, wall_s=POLICY.max_hold_s))
    assert state.hold_s == POLICY.hold_s


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_windows_cover_busy_time_only_and_set_the_pool() -> None:
    clock = _Clock()
    set_to: list[int] = []
    governor = ThreadGovernor(2, set_to.append, clock=clock)
    samples: list[Sample] = []
    governor.apply = samples.append  # type: ignore[method-assign]
    for _ in range(4):  # steps 0.125 s apart: one window of 0.5 s
        governor.after_step()
        clock.now += 0.125
    governor.after_step()
    assert len(samples) == 1 and samples[0].wall_s == 0.5
    clock.now += 5.0  # the engine idled: that time is not a window
    governor.after_step()
    clock.now += 0.125
    governor.after_step(ran_model=False)  # steps that only waited on readers neither
    for _ in range(3):
        clock.now += 0.125
        governor.after_step()
    assert len(samples) == 1


def test_apply_sets_torch_threads_and_counts_changes() -> None:
    set_to: list[int] = []
    governor = ThreadGovernor(2, set_to.append)
    governor.apply(_window(0.6, 2))
    assert (set_to, governor.threads, governor.drops) == ([1], 1, 1)
    governor.apply(_window(0.0, 1, idle_cpus=1.0, wall_s=POLICY.hold_s))
    assert (set_to, governor.climbs) == ([1, 2], 1)


def test_the_proc_readings_this_machine_gives() -> None:
    waits = _task_waits_ns()
    assert waits and all(ns >= 0 for ns in waits.values())
    before = _Reading(0.0, {"1": 100, "2": 50}, 1000)
    after = _Reading(2.0, {"1": 1_000_000_100, "3": 7_000_000_000}, 1100)
    sample = _sample(before, after)
    assert sample.wait_s == 1.0  # thread 3 is new: its past is not this window's
    assert sample.wall_s == 2.0


def test_only_the_named_model_threads_count() -> None:
    seen: dict[str, object] = {}

    def run() -> None:
        seen["named"] = name_model_thread("governor-test")
        seen["waits"] = _task_waits_ns("governor-test")
        seen["all"] = _task_waits_ns()

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    assert seen["named"] is True
    assert len(seen["waits"]) == 1  # type: ignore[arg-type]
    assert len(seen["all"]) > 1  # type: ignore[arg-type]
