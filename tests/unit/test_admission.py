"""Admission (api/admission.py) with priorities: waiting streams go by class, then arrival;
reserved places are for INTERACTIVE streams only; a full queue makes room for a more urgent
stream by refusing the newest of the least urgent. Plain asyncio, no server, no sleeps: each
stream is a task holding its place until the test releases it."""

from __future__ import annotations

import asyncio

import pytest

from chattts_server.api.admission import Admission, AdmissionRejected
from chattts_server.engine.utterance import Priority

BULK, DEFAULT, NAV = Priority.BULK, Priority.DEFAULT, Priority.INTERACTIVE


class Streams:
    """Streams that enter admission and hold their place until `end(name)`."""

    def __init__(self, admission: Admission) -> None:
        self.admission = admission
        self.admitted: list[str] = []
        self.refused: dict[str, str] = {}
        self._done: dict[str, asyncio.Event] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}

    async def _hold(self, name: str, priority: Priority) -> None:
        try:
            async with self.admission.stream(None, priority):
                self.admitted.append(name)
                await self._done[name].wait()
        except AdmissionRejected as exc:
            self.refused[name] = exc.code

    async def start(self, name: str, priority: Priority) -> None:
        self._done[name] = asyncio.Event()
        self._tasks[name] = asyncio.create_task(self._hold(name, priority))
        await _settle()

    async def end(self, name: str) -> None:
        self._done[name].set()
        await self._tasks[name]
        await _settle()


async def _settle() -> None:
    for _ in range(5):  # let woken tasks run up to their next wait
        await asyncio.sleep(0)


def _run(test) -> None:
    asyncio.run(test())


def test_waiting_streams_go_by_priority_then_arrival() -> None:
    async def test() -> None:
        admission = Admission(max_streams=1, max_queue=8)
        admission.ready = True
        s = Streams(admission)
        await s.start("holder", BULK)
        for name, priority in [("b1", BULK), ("d1", DEFAULT), ("n1", NAV), ("b2", BULK)]:
            await s.start(name, priority)
        await s.start("n2", NAV)
        assert s.admitted == ["holder"] and admission.waiting == 5
        for name in ["holder", "n1", "n2", "d1", "b1"]:
            await s.end(name)
        assert s.admitted == ["holder", "n1", "n2", "d1", "b1", "b2"]
        await s.end("b2")
        assert admission.active == 0

    _run(test)


def test_reserved_places_are_for_interactive_streams_only() -> None:
    async def test() -> None:
        admission = Admission(max_streams=3, max_queue=8, reserved_slots=1)
        admission.ready = True
        s = Streams(admission)
        for name in ["b1", "b2", "b3"]:
            await s.start(name, BULK)
        await s.start("d1", DEFAULT)
        # Two places for bulk and default; the third is held for a navigation prompt.
        assert s.admitted == ["b1", "b2"] and admission.waiting == 2
        await s.start("n1", NAV)
        assert s.admitted == ["b1", "b2", "n1"]  # at once, past the queue
        await s.end("n1")  # its place is reserved again: nobody waiting may take it
        assert s.admitted == ["b1", "b2", "n1"] and admission.active == 2
        await s.end("b1")
        assert s.admitted[-1] == "d1"  # the more urgent waiter, though it came later
        assert admission.waiting_by_priority() == {NAV: 0, DEFAULT: 0, BULK: 1}

    _run(test)


def test_a_full_queue_refuses_the_newest_least_urgent_waiter_for_a_more_urgent_one() -> None:
    async def test() -> None:
        admission = Admission(max_streams=1, max_queue=2)
        admission.ready = True
        s = Streams(admission)
        await s.start("holder", DEFAULT)
        await s.start("b1", BULK)
        await s.start("b2", BULK)
        await s.start("b3", BULK)  # the queue is full of its own class: refused
        assert s.refused == {"b3": "exhausted"}
        await s.start("n1", NAV)  # displaces b2, the newest bulk waiter
        assert s.refused == {"b3": "exhausted", "b2": "exhausted"}
        await s.start("n2", NAV)  # displaces b1
        await s.start("n3", NAV)  # nothing less urgent left to displace
        assert set(s.refused) == {"b1", "b2", "b3", "n3"}
        await s.end("holder")
        assert s.admitted == ["holder", "n1"]

    _run(test)


def test_reserved_slots_must_leave_a_place_for_other_streams() -> None:
    with pytest.raises(ValueError):
        Admission(max_streams=2, max_queue=1, reserved_slots=2)


def test_a_drain_serves_what_reaches_it_and_says_when_the_last_is_done() -> None:
    """The doors shut in a drain (listeners, GOAWAY): what still reaches admission came in
    before, and is served like the queued streams (refused, a call behind a proxy that cannot
    resend it would fail)."""

    async def test() -> None:
        admission = Admission(max_streams=1, max_queue=4)
        admission.ready = True
        s = Streams(admission)
        await s.start("holder", DEFAULT)
        await s.start("q1", DEFAULT)
        await s.start("q2", BULK)
        admission.drain()
        assert not admission.accepting  # what health reports
        await s.start("late", DEFAULT)  # e.g. a request on a keep-alive connection
        assert s.refused == {} and admission.waiting == 3
        idle = asyncio.create_task(admission.wait_idle())
        for name in ["holder", "q1", "late"]:
            await s.end(name)
        assert s.admitted == ["holder", "q1", "late", "q2"] and not idle.done()
        await s.end("q2")
        await asyncio.wait_for(idle, 1)

    _run(test)


def test_a_server_not_ready_refuses_every_stream() -> None:
    async def test() -> None:
        admission = Admission(max_streams=2, max_queue=4)
        s = Streams(admission)
        await s.start("early", NAV)
        admission.ready = True
        await s.start("on time", DEFAULT)
        admission.ready = False  # the engine failed
        await s.start("after", DEFAULT)
        assert s.refused == {"early": "unavailable", "after": "unavailable"}
        assert s.admitted == ["on time"]

    _run(test)


def test_a_waiter_cancelled_as_its_place_comes_is_not_admitted() -> None:
    """A waiting stream whose client goes away in the same loop turn as a place is granted to
    it ends cancelled and passes the place on (asyncio.wait_for before Python 3.12 swallowed
    such a cancel: the stream went on, admitted, for a client that had gone)."""

    async def test() -> None:
        admission = Admission(max_streams=1, max_queue=8)
        admission.ready = True
        s = Streams(admission)
        await s.start("holder", DEFAULT)
        admitted: list[str] = []

        async def wait() -> None:
            async with admission.stream(60.0, DEFAULT):
                admitted.append("waiter")

        waiter = asyncio.create_task(wait())
        await _settle()
        assert admission.waiting == 1
        s._done["holder"].set()
        await s._tasks["holder"]  # the holder's place is granted to the waiter...
        waiter.cancel()  # ...in the same turn as its client goes away
        with pytest.raises(asyncio.CancelledError):
            await waiter
        assert admitted == [] and admission.active == 0 and admission.waiting == 0

    _run(test)
