"""Scheduler unit tests: plain objects, no tensors. The runner's side of each step is a
hand-written `ModelOutput` (what it sampled, flushed, prepared), so each test reads as one step
of the contract."""

import numpy as np
import pytest

from chattts_server.engine.request import EngineRequest, RequestStatus
from chattts_server.engine.scheduler import Scheduler
from chattts_server.engine.step_io import FinishedAudio, ModelOutput, PreparedPrompt, Sampled
from chattts_server.engine.utterance import Priority
from chattts_server.errors import EngineError, InvalidRequestError

END = FinishedAudio(pcm=np.zeros(0, np.float32), text="", codes=np.zeros((0, 4), np.int64))


def add(
    s: Scheduler, name: str, prompt_len: int = 10, max_new: int = 20, final: bool = True
) -> EngineRequest:
    """A request queued with its first pass, as `EngineCore.add_request` leaves it."""
    request = EngineRequest(name, submitted_at=0.0)
    s.add(request, PreparedPrompt(prompt_len, max_new, final=final, state=f"pass of {name}"))
    return request


def budget(s: Scheduler, prompt_len: int, max_new: int | None, min_new: int = 0) -> int:
    request = EngineRequest("budget", submitted_at=0.0)
    s.add(request, PreparedPrompt(prompt_len, max_new, min_new))
    return request.max_new_tokens


def prefilled(s: Scheduler, *requests: EngineRequest) -> None:
    """Run the prefill steps the plan asks for, sampling a non-end token at each completion."""
    while any(not r.prefill_done for r in requests):
        plan = s.schedule()
        done = [c.slot_id for c in plan.prefill if c.completes_prompt]
        s.update_from_output(plan, ModelOutput(sampled=[Sampled(i, False) for i in done]))


def test_admits_into_free_slots_lowest_first_and_queues_the_rest():
    s = Scheduler(num_slots=2, max_tokens=100, prefill_chunk_tokens=64)
    _, _, c = add(s, "a"), add(s, "b"), add(s, "c")
    plan = s.schedule()
    assert [(n.request_id, n.slot_id) for n in plan.new_slots] == [("a", 0), ("b", 1)]
    assert [ch.slot_id for ch in plan.prefill] == [0, 1]
    assert all(ch.completes_prompt for ch in plan.prefill)
    assert c.status is RequestStatus.WAITING and c.slot_id is None
    assert s.num_free_slots == 0


def test_prefill_is_chunked_within_the_step_budget():
    s = Scheduler(num_slots=2, max_tokens=200, prefill_chunk_tokens=16)
    a = add(s, "a", prompt_len=40)
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
    # The decode row carries the pass's one token count, the sampler's as well.
    assert [(r.slot_id, r.position, r.num_generated) for r in plan.decode] == [(0, 40, 1)]


def test_end_token_finishes_with_eos_and_the_budget_with_max_tokens():
    s = Scheduler(num_slots=2, max_tokens=100, prefill_chunk_tokens=64)
    a, b = add(s, "a", max_new=5), add(s, "b", max_new=3)
    prefilled(s, a, b)
    plan = s.schedule()
    decisions = s.update_from_output(
        plan, ModelOutput(sampled=[Sampled(0, True), Sampled(1, False)])
    )
    assert decisions.completed == [] and a.pass_end == "eos"
    # The next plan flushes 'a' (its slot is free from then on) and decodes 'b' alone.
    plan = s.schedule()
    assert plan.slots_to_flush == [0] and [r.slot_id for r in plan.decode] == [1]
    assert a.finish_reason == "eos" and a.status is RequestStatus.FINISHED
    decisions = s.update_from_output(
        plan, ModelOutput(sampled=[Sampled(1, False)], flushed={0: END})
    )
    assert decisions.completed == [(a, END)] and b.pass_end == "max_tokens"
    plan = s.schedule()
    assert plan.slots_to_flush == [1] and plan.decode == [] and plan.has_model_work
    assert s.update_from_output(plan, ModelOutput(flushed={1: END})).completed == [(b, END)]
    assert b.finish_reason == "max_tokens" and b.num_generated == 3
    assert s.num_free_slots == 2 and not s.has_requests


def test_finished_slot_is_reused_by_the_waiting_request_in_its_flush_plan():
    s = Scheduler(num_slots=1, max_tokens=100, prefill_chunk_tokens=64)
    a, b = add(s, "a"), add(s, "b")
    prefilled(s, a)
    plan = s.schedule()
    s.update_from_output(plan, ModelOutput(sampled=[Sampled(0, True)]))
    plan = s.schedule()
    # 'a' finished normally: flushed (not released), and its slot taken by 'b' in the same step.
    assert plan.slots_to_flush == [0] and plan.released == []
    assert plan.new_slots[0].request_id == "b" and b.slot_id == 0
    decisions = s.update_from_output(
        plan, ModelOutput(sampled=[Sampled(0, False)], flushed={0: END})
    )
    assert decisions.completed == [(a, END)] and b.num_generated == 1


def test_cancel_frees_the_slot_at_the_next_schedule_before_any_work():
    s = Scheduler(num_slots=1, max_tokens=100, prefill_chunk_tokens=64)
    a, b = add(s, "a"), add(s, "b")
    prefilled(s, a)
    s.cancel(a)
    plan = s.schedule()
    assert plan.released == [0] and a.finish_reason == "cancelled"
    assert plan.decode == []
    assert plan.new_slots[0].request_id == "b" and b.slot_id == 0


def test_cancel_after_the_end_token_releases_instead_of_flushing():
    s = Scheduler(num_slots=1, max_tokens=100, prefill_chunk_tokens=64)
    a = add(s, "a")
    prefilled(s, a)
    plan = s.schedule()
    s.update_from_output(plan, ModelOutput(sampled=[Sampled(0, True)]))
    s.cancel(a)
    plan = s.schedule()
    assert plan.released == [0] and plan.slots_to_flush == [] and a.finish_reason == "cancelled"


def test_cancel_while_waiting_never_takes_a_slot():
    s = Scheduler(num_slots=1, max_tokens=100, prefill_chunk_tokens=64)
    _, b = add(s, "a"), add(s, "b")
    s.cancel(b)
    plan = s.schedule()
    assert b.status is RequestStatus.FINISHED and b.pass_state is None  # its prompt dropped
    assert list(s.waiting) == [] and [n.request_id for n in plan.new_slots] == ["a"]


def test_the_runners_pass_state_goes_back_with_the_slot_and_is_held_by_no_one_after():
    s = Scheduler(num_slots=1, max_tokens=100, prefill_chunk_tokens=64)
    a, b = add(s, "a"), add(s, "b")
    assert a.pass_state == "pass of a" and b.pass_state == "pass of b"
    (seat,) = s.schedule().new_slots
    assert (seat.request_id, seat.state) == ("a", "pass of a") and a.pass_state is None


def test_decode_batch_holds_every_ready_unpaused_request_in_slot_order():
    s = Scheduler(num_slots=4, max_tokens=100, prefill_chunk_tokens=64)
    reqs = [add(s, str(i)) for i in range(4)]
    prefilled(s, *reqs)
    plan = s.schedule(is_paused=lambda x: x is reqs[2])
    assert [r.slot_id for r in plan.decode] == [0, 1, 3]


def test_max_streams_is_the_slot_count():
    s = Scheduler(num_slots=3, max_tokens=100, prefill_chunk_tokens=1000)
    for i in range(10):
        add(s, str(i))
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
    # The refused requests were never queued: nothing of theirs reaches a plan.
    assert len(s.waiting) == 4 and len(s.schedule().new_slots) == 1


def test_refine_pass_end_moves_to_the_code_pass_on_the_same_slot():
    s = Scheduler(num_slots=1, max_tokens=100, prefill_chunk_tokens=64)
    a = add(s, "a", prompt_len=10, max_new=30, final=False)
    prefilled(s, a)
    plan = s.schedule()
    decisions = s.update_from_output(plan, ModelOutput(sampled=[Sampled(0, True)]))
    assert decisions.completed == [] and a.pass_end == "eos"
    # The next plan asks for the audio-code prompt, and computes nothing else for the slot.
    plan = s.schedule()
    assert plan.next_pass == [0] and plan.slots_to_flush == [] and not plan.decode
    s.update_from_output(plan, ModelOutput(prepared={0: PreparedPrompt(12, 30)}))
    plan = s.schedule()
    assert plan.prefill[0].slot_id == 0 and plan.prefill[0].length == 12
    assert plan.prefill[0].completes_prompt and a.slot_id == 0 and a.final_pass
    assert a.max_new_tokens == 30 and a.num_generated == 0 and a.pass_end is None


def test_a_code_pass_prompt_that_does_not_fit_fails_the_request_alone():
    s = Scheduler(num_slots=2, max_tokens=100, prefill_chunk_tokens=64)
    a, b = add(s, "a", final=False), add(s, "b")
    prefilled(s, a, b)
    plan = s.schedule()
    s.update_from_output(plan, ModelOutput(sampled=[Sampled(0, True), Sampled(1, False)]))
    plan = s.schedule()
    assert plan.next_pass == [0] and [r.slot_id for r in plan.decode] == [1]
    output = ModelOutput(sampled=[Sampled(1, False)], prepared={0: PreparedPrompt(100, None)})
    ((failed, error),) = s.update_from_output(plan, output).failed
    assert failed is a and isinstance(error, InvalidRequestError) and a.finish_reason == "error"
    assert s.schedule().released == [0] and b.num_generated == 3


def test_a_slot_the_runner_failed_alone_ends_with_an_error_and_frees_its_slot():
    s = Scheduler(num_slots=2, max_tokens=100, prefill_chunk_tokens=64)
    a, b = add(s, "a"), add(s, "b")
    prefilled(s, a, b)
    plan = s.schedule()
    nan = EngineError("nan")
    output = ModelOutput(
        sampled=[Sampled(0, False), Sampled(1, False)],
        audio={0: [np.zeros(4, np.float32)], 1: [np.ones(4, np.float32)]},
        failed={0: nan},
    )
    decisions = s.update_from_output(plan, output)
    assert decisions.failed == [(a, nan)] and a.finish_reason == "error"
    assert [r for r, _ in decisions.audio] == [b]  # a failed request's audio is not sent
    assert b.num_generated == 2 and a.num_generated == 1
    assert s.schedule().released == [0]


def test_a_step_that_raises_fails_every_request_of_its_plan_the_flushed_ones_too():
    s = Scheduler(num_slots=2, max_tokens=100, prefill_chunk_tokens=64)
    a, b, c = add(s, "a"), add(s, "b"), add(s, "c")
    prefilled(s, a, b)
    plan = s.schedule()
    s.update_from_output(plan, ModelOutput(sampled=[Sampled(0, True), Sampled(1, False)]))
    plan = s.schedule()  # flushes 'a', gives its slot to 'c', decodes 'b'
    assert plan.slots_to_flush == [0] and plan.new_slots[0].request_id == "c"
    assert set(s.abandon(plan)) == {a, b, c}
    assert all(r.finish_reason == "error" for r in (a, b, c)) and not s.has_requests
    assert sorted(s.schedule().released) == [0, 0, 1]


def add_at(s: Scheduler, name: str, priority: Priority, prompt_len: int = 10) -> EngineRequest:
    request = EngineRequest(name, submitted_at=0.0, priority=priority)
    s.add(request, PreparedPrompt(prompt_len, 20))
    return request


def test_a_free_slot_goes_to_the_most_urgent_waiter_then_the_earliest():
    s = Scheduler(num_slots=1, max_tokens=100, prefill_chunk_tokens=64)
    holder = add_at(s, "holder", Priority.BULK)
    prefilled(s, holder)
    add_at(s, "bulk-1", Priority.BULK)
    add_at(s, "default", Priority.DEFAULT)
    add_at(s, "nav-1", Priority.INTERACTIVE)
    add_at(s, "nav-2", Priority.INTERACTIVE)
    seated = []
    for _ in range(4):
        s.cancel(s.running[0])
        plan = s.schedule()
        seated += [n.request_id for n in plan.new_slots]
        s.update_from_output(plan, ModelOutput(sampled=[Sampled(0, False)]))
    assert seated == ["nav-1", "nav-2", "default", "bulk-1"]


def test_the_prefill_budget_goes_to_the_most_urgent_class_first():
    s = Scheduler(num_slots=3, max_tokens=200, prefill_chunk_tokens=32)
    add_at(s, "bulk-a", Priority.BULK, prompt_len=30)
    add_at(s, "bulk-b", Priority.BULK, prompt_len=30)
    plan = s.schedule()
    assert [(c.slot_id, c.start, c.length) for c in plan.prefill] == [(0, 0, 30), (1, 0, 2)]
    s.update_from_output(plan, ModelOutput(sampled=[Sampled(0, False)]))
    add_at(s, "nav", Priority.INTERACTIVE, prompt_len=40)
    plan = s.schedule()
    # nav (slot 2) arrived last, behind bulk-b's unfinished prompt, and takes the whole budget.
    assert [n.slot_id for n in plan.new_slots] == [2]
    assert [(c.slot_id, c.start, c.length) for c in plan.prefill] == [(2, 0, 32)]
    s.update_from_output(plan, ModelOutput(sampled=[Sampled(0, False)]))
    plan = s.schedule()
    assert [(c.slot_id, c.start, c.length) for c in plan.prefill] == [(2, 32, 8), (1, 2, 24)]
    s.update_from_output(plan, ModelOutput(sampled=[Sampled(0, False), Sampled(2, False)]))
    plan = s.schedule()
    # Decode rows stay in slot order: priority decides who is prefilled, not the batch layout.
    assert [r.slot_id for r in plan.decode] == [0, 2]
    assert [(c.slot_id, c.start, c.length) for c in plan.prefill] == [(1, 26, 4)]


def test_within_a_class_the_prefill_budget_goes_by_arrival():
    s = Scheduler(num_slots=2, max_tokens=200, prefill_chunk_tokens=16)
    first = add_at(s, "first", Priority.DEFAULT, prompt_len=16)
    add_at(s, "second", Priority.DEFAULT, prompt_len=48)
    plan = s.schedule()  # first in slot 0 takes the budget; second (slot 1) waits for it
    assert [(c.slot_id, c.length) for c in plan.prefill] == [(0, 16)]
    s.update_from_output(plan, ModelOutput(sampled=[Sampled(0, False)]))
    s.cancel(first)
    add_at(s, "third", Priority.DEFAULT, prompt_len=40)
    plan = s.schedule()
    assert [(n.request_id, n.slot_id) for n in plan.new_slots] == [("third", 0)]
    # The lower slot arrived later: second's prompt goes first.
    assert [(c.slot_id, c.length) for c in plan.prefill] == [(1, 16)]


def test_less_urgent_rows_skip_decode_steps_until_an_interactive_first_audio():
    s = Scheduler(num_slots=4, max_tokens=200, prefill_chunk_tokens=64, interactive_hold_tokens=3)
    bulk, default = add_at(s, "bulk", Priority.BULK), add_at(s, "default", Priority.DEFAULT)
    prefilled(s, bulk, default)
    assert (default.slot_id, bulk.slot_id) == (0, 1)  # seated by class first
    assert [r.slot_id for r in s.schedule().decode] == [0, 1]
    nav = add_at(s, "nav", Priority.INTERACTIVE)
    late = add_at(s, "late-bulk", Priority.BULK)
    decoded, prefills = [], []
    for _ in range(3):
        plan = s.schedule()
        decoded.append([r.slot_id for r in plan.decode])
        prefills.append([c.slot_id for c in plan.prefill])
        sampled = [Sampled(r.slot_id, False) for r in plan.decode]
        done = [Sampled(c.slot_id, False) for c in plan.prefill if c.completes_prompt]
        s.update_from_output(plan, ModelOutput(sampled=sampled + done))
    # nav (slot 2) prefills and decodes alone while it has no audio; late-bulk (slot 3) holds
    # its slot but its prefill waits too.
    assert (nav.slot_id, late.slot_id) == (2, 3)
    assert decoded == [[], [2], [2]] and prefills == [[2], [], []]
    nav.record_audio(100, now=1.0)  # its first chunk went out: everyone runs again
    plan = s.schedule()
    assert [r.slot_id for r in plan.decode] == [0, 1, 2]
    assert [c.slot_id for c in plan.prefill] == [3]


def test_the_hold_ends_after_its_token_bound_even_without_audio():
    s = Scheduler(num_slots=2, max_tokens=200, prefill_chunk_tokens=64, interactive_hold_tokens=2)
    bulk = add_at(s, "bulk", Priority.BULK)
    prefilled(s, bulk)
    nav = add_at(s, "nav", Priority.INTERACTIVE)
    prefilled(s, nav)  # its prefill samples token 1
    plan = s.schedule()
    assert [r.slot_id for r in plan.decode] == [1]
    s.update_from_output(plan, ModelOutput(sampled=[Sampled(1, False)]))
    assert nav.num_generated == 2 and nav.first_audio_at is None
    assert [r.slot_id for r in s.schedule().decode] == [0, 1]
