"""Scheduler unit tests: plain objects, no tensors."""

import pytest

from chattts_server.engine.scheduler import Phase, Scheduler, Sequence


def seq(name: str, prompt_len: int = 10, max_new: int = 20) -> Sequence:
    return Sequence(request_id=name, prompt_len=prompt_len, max_new_tokens=max_new)


def test_admits_into_free_slots_lowest_first_and_queues_the_rest():
    s = Scheduler(num_slots=2, max_tokens=100, prefill_chunk_tokens=64)
    a, b, c = seq("a"), seq("b"), seq("c")
    for x in (a, b, c):
        s.add(x)
    plan = s.schedule()
    assert [ch.seq for ch in plan.prefill] == [a, b]
    assert (a.slot_id, b.slot_id) == (0, 1)
    assert c.phase is Phase.WAITING and c.slot_id is None
    assert s.num_free_slots == 0


def test_prefill_is_chunked_within_the_step_budget():
    s = Scheduler(num_slots=2, max_tokens=200, prefill_chunk_tokens=16)
    a = seq("a", prompt_len=40)
    s.add(a)
    starts = []
    for _ in range(3):
        plan = s.schedule()
        (chunk,) = plan.prefill
        starts.append((chunk.start, chunk.length, chunk.completes_prompt))
        a.num_prefilled += chunk.length
    assert starts == [(0, 16, False), (16, 16, False), (32, 8, True)]
    assert s.schedule().decode == [a]


def test_finished_slot_is_reused_by_the_waiting_request():
    s = Scheduler(num_slots=1, max_tokens=100, prefill_chunk_tokens=64)
    a, b = seq("a"), seq("b")
    s.add(a)
    s.add(b)
    s.schedule()
    s.finish(a)
    assert a.phase is Phase.FINISHED and a.slot_id is None
    plan = s.schedule()
    assert plan.prefill[0].seq is b and b.slot_id == 0


def test_cancel_frees_the_slot_at_the_next_schedule_before_any_work():
    s = Scheduler(num_slots=1, max_tokens=100, prefill_chunk_tokens=64)
    a, b = seq("a"), seq("b")
    s.add(a)
    s.add(b)
    plan = s.schedule()
    a.num_prefilled = a.prompt_len
    s.cancel(a)
    plan = s.schedule()
    assert plan.aborted == [a]
    assert a not in plan.decode
    assert plan.prefill[0].seq is b and b.slot_id == 0


def test_cancel_while_waiting_never_takes_a_slot():
    s = Scheduler(num_slots=1, max_tokens=100, prefill_chunk_tokens=64)
    a, b = seq("a"), seq("b")
    s.add(a)
    s.add(b)
    s.cancel(b)
    plan = s.schedule()
    assert plan.aborted == [b] and b.phase is Phase.FINISHED
    assert list(s.waiting) == []


def test_decode_batch_holds_every_ready_unpaused_sequence_in_slot_order():
    s = Scheduler(num_slots=4, max_tokens=100, prefill_chunk_tokens=64)
    seqs = [seq(str(i)) for i in range(4)]
    for x in seqs:
        s.add(x)
    s.schedule()
    for x in seqs:
        x.num_prefilled = x.prompt_len
    plan = s.schedule(is_paused=lambda x: x is seqs[2])
    assert plan.decode == [seqs[0], seqs[1], seqs[3]]


def test_max_streams_is_the_slot_count():
    s = Scheduler(num_slots=3, max_tokens=100, prefill_chunk_tokens=1000)
    seqs = [seq(str(i)) for i in range(10)]
    for x in seqs:
        s.add(x)
    s.schedule()
    assert len(s.running) == 3 and len(s.waiting) == 7


def test_request_that_cannot_fit_a_slot_is_refused():
    s = Scheduler(num_slots=1, max_tokens=50, prefill_chunk_tokens=64)
    with pytest.raises(ValueError):
        s.add(seq("big", prompt_len=40, max_new=20))


def test_restart_keeps_the_slot_for_a_second_pass():
    s = Scheduler(num_slots=1, max_tokens=100, prefill_chunk_tokens=64)
    a = seq("a", prompt_len=10)
    s.add(a)
    s.schedule()
    a.num_prefilled, a.num_generated = 10, 5
    s.restart(a, prompt_len=12, max_new_tokens=30)
    plan = s.schedule()
    assert plan.prefill[0].seq is a and plan.prefill[0].length == 12 and a.slot_id == 0
