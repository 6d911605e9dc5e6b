"""Scheduler unit tests: plain objects, no tensors. The runner's side of each step is a
hand-written `ModelOutput` (what it sampled), so each test reads as one step of the contract."""

import pytest

from chattts_server.engine.request import EngineRequest, RequestStatus
from chattts_server.engine.scheduler import Scheduler
from chattts_server.engine.step_io import ModelOutput, PreparedPrompt, Sampled
from chattts_server.engine.types import InvalidRequestError

SCHEDULER = Scheduler(num_slots=1, max_tokens=4096, prefill_chunk_tokens=64)


def req(name: str, prompt_len: int = 10, max_new: int = 20, final: bool = True) -> EngineRequest:
    """A request whose first pass has begun, as `EngineCore.add_request` leaves it."""
    request = EngineRequest(name, submitted_at=0.0)
    SCHEDULER.begin_pass(request, PreparedPrompt(prompt_len, max_new, final=final))
    return request


def budget(s: Scheduler, prompt_len: int, max_new: int | None, min_new: int = 0) -> int:
    request = EngineRequest("budget", submitted_at=0.0)
    s.begin_pass(request, PreparedPrompt(prompt_len, max_new, min_new))
    return request.max_new_tokens


def prefilled(s: Scheduler, *requests: EngineRequest) -> None:
    """Run the prefill steps the plan asks for, sampling a non-end token at each completion."""
    while any(not r.prefill_done for r in requests):
        plan = s.schedule()
        done = [c.slot_id for c in plan.prefill if c.completes_prompt]
        s.update_from_output(plan, ModelOutput(sampled=[Sampled(i, False) for i in done]))


def test_admits_into_free_slots_lowest_first_and_queues_the_rest():
    s = Scheduler(num_slots=2, max_tokens=100, prefill_chunk_tokens=64)
    a, b, c = req("a"), req("b"), req("c")
    for x in (a, b, c):
        s.add(x)
    plan = s.schedule()
    assert [(n.request_id, n.slot_id) for n in plan.new_slots] == [("a", 0), ("b", 1)]
    assert [ch.slot_id for ch in plan.prefill] == [0, 1]
    assert all(ch.completes_prompt for ch in plan.prefill)
    assert c.status is RequestStatus.WAITING and c.slot_id is None
    assert s.num_free_slots == 0


def test_prefill_is_chunked_within_the_step_budget():
    s = Scheduler(num_slots=2, max_tokens=200, prefill_chunk_tokens=16)
    a = req("a", prompt_len=40)
    s.add(a)
    starts = []
    for _ in range(3):
        plan = s.schedule()
        (chunk,) = plan.prefill
        starts.append((chunk.start, chunk.length, chunk.completes_prompt))
        s.update_from_output(
            plan, ModelOutput(sampled=[Sampled(0, False)] if chunk.completes_prompt else [])
        )
    assert starts == [(0, 16, False), (16, 16, False), (32, 8, True)]
    assert a.num_generated == 1
    plan = s.schedule()
    assert [(r.slot_id, r.position) for r in plan.decode] == [(0, 40)]


def test_end_token_finishes_with_eos_and_the_budget_with_max_tokens():
    s = Scheduler(num_slots=2, max_tokens=100, prefill_chunk_tokens=64)
    a, b = req("a", max_new=5), req("b", max_new=3)
    s.add(a)
    s.add(b)
    prefilled(s, a, b)
    plan = s.schedule()
    decisions = s.update_from_output(
        plan, ModelOutput(sampled=[Sampled(0, True), Sampled(1, False)])
    )
    assert decisions.finished == [a] and a.finish_reason == "eos"
    plan = s.schedule()
    decisions = s.update_from_output(plan, ModelOutput(sampled=[Sampled(1, False)]))
    assert decisions.finished == [b] and b.finish_reason == "max_tokens"
    assert b.num_generated == 3 and s.num_free_slots == 2


def test_finished_slot_is_reused_by_the_waiting_request():
    s = Scheduler(num_slots=1, max_tokens=100, prefill_chunk_tokens=64)
    a, b = req("a"), req("b")
    s.add(a)
    s.add(b)
    prefilled(s, a)
    plan = s.schedule()
    s.update_from_output(plan, ModelOutput(sampled=[Sampled(0, True)]))
    assert a.status is RequestStatus.FINISHED
    plan = s.schedule()
    assert plan.released == []  # a finished normally: the core flushed it already
    assert plan.new_slots[0].request_id == "b" and b.slot_id == 0


def test_cancel_frees_the_slot_at_the_next_schedule_before_any_work():
    s = Scheduler(num_slots=1, max_tokens=100, prefill_chunk_tokens=64)
    a, b = req("a"), req("b")
    s.add(a)
    s.add(b)
    prefilled(s, a)
    s.cancel(a)
    plan = s.schedule()
    assert plan.released == [0] and a.finish_reason == "cancelled"
    assert plan.decode == []
    assert plan.new_slots[0].request_id == "b" and b.slot_id == 0


def test_cancel_while_waiting_never_takes_a_slot():
    s = Scheduler(num_slots=1, max_tokens=100, prefill_chunk_tokens=64)
    a, b = req("a"), req("b")
    s.add(a)
    s.add(b)
    s.cancel(b)
    plan = s.schedule()
    assert plan.discarded == ["b"] and b.status is RequestStatus.FINISHED
    assert list(s.waiting) == []


def test_decode_batch_holds_every_ready_unpaused_request_in_slot_order():
    s = Scheduler(num_slots=4, max_tokens=100, prefill_chunk_tokens=64)
    reqs = [req(str(i)) for i in range(4)]
    for x in reqs:
        s.add(x)
    prefilled(s, *reqs)
    plan = s.schedule(is_paused=lambda x: x is reqs[2])
    assert [r.slot_id for r in plan.decode] == [0, 1, 3]


def test_max_streams_is_the_slot_count():
    s = Scheduler(num_slots=3, max_tokens=100, prefill_chunk_tokens=1000)
    for i in range(10):
        s.add(req(str(i)))
    s.schedule()
    assert len(s.running) == 3 and len(s.waiting) == 7


def test_budget_is_clamped_to_the_slot_and_a_prompt_that_leaves_no_room_is_refused():
    s = Scheduler(num_slots=1, max_tokens=50, prefill_chunk_tokens=64, max_new_tokens=30)
    assert budget(s, 40, None) == 10
    assert budget(s, 10, None) == 30
    assert budget(s, 10, 5) == 5
    with pytest.raises(InvalidRequestError):
        budget(s, 50, None)
    with pytest.raises(InvalidRequestError):
        budget(s, 45, None, min_new=8)
    assert budget(s, 40, 20) == 10  # the request's own cap is clamped to the slot too


def test_refine_pass_end_moves_to_the_code_pass_on_the_same_slot():
    s = Scheduler(num_slots=1, max_tokens=100, prefill_chunk_tokens=64)
    a = req("a", prompt_len=10, max_new=30, final=False)
    s.add(a)
    prefilled(s, a)
    plan = s.schedule()
    decisions = s.update_from_output(plan, ModelOutput(sampled=[Sampled(0, True)]))
    assert decisions.next_pass == [a] and decisions.finished == []
    s.begin_pass(a, PreparedPrompt(12, 30))
    plan = s.schedule()
    assert plan.prefill[0].slot_id == 0 and plan.prefill[0].length == 12
    assert plan.prefill[0].completes_prompt and a.slot_id == 0 and a.final_pass
    assert a.max_new_tokens == 30 and a.num_generated == 0


def test_a_slot_the_runner_failed_alone_ends_with_an_error_and_frees_its_slot():
    s = Scheduler(num_slots=2, max_tokens=100, prefill_chunk_tokens=64)
    a, b = req("a"), req("b")
    s.add(a)
    s.add(b)
    prefilled(s, a, b)
    plan = s.schedule()
    output = ModelOutput(sampled=[Sampled(0, False), Sampled(1, False)], failed={0: "nan"})
    decisions = s.update_from_output(plan, output)
    assert decisions.failed == [(a, "nan")] and a.finish_reason == "error"
    assert b.num_generated == 2 and a.num_generated == 1
    assert s.schedule().released == [0]
