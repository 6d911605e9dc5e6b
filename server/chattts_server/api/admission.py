"""Stream admission: at most `max_streams` active, `max_queue` waiting, the rest refused at once.

Waiting streams are ordered by priority, then arrival: a navigation prompt that arrives behind
a queue of caption streams takes the next free place. `reserved_slots` of the places are for
INTERACTIVE streams only, so such a prompt finds a place at once even while a backlog holds
every other one. A full queue takes a more urgent stream still: the newest of the least urgent
waiters is refused (RESOURCE_EXHAUSTED) to make room.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from ..engine.utterance import Priority

NOT_READY = "server is not ready: its model is loading, or failed"


class AdmissionRejected(Exception):
    """Refused: `code` is 'exhausted' (full) or 'unavailable' (not ready)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(order=True)
class _Waiter:
    priority: Priority
    arrival: int
    future: asyncio.Future[None] = field(compare=False)


class Admission:
    """Counts streams; a priority queue of waiters. Lives on the event loop (no locks)."""

    def __init__(self, max_streams: int, max_queue: int, reserved_slots: int = 0) -> None:
        if not 0 <= reserved_slots < max_streams:
            raise ValueError(f"reserved_slots must be in [0, {max_streams - 1}]")
        self.max_streams = max_streams
        self.max_queue = max_queue
        self.reserved_slots = reserved_slots
        """Places only INTERACTIVE streams may take."""
        self.active = 0
        self._waiters: list[_Waiter] = []
        """A heap: the most urgent class, then the earliest arrival, first."""
        self._arrivals = itertools.count()
        self.ready = False
        """True once the engine is warm (and False again if it fails): until then every stream
        is refused UNAVAILABLE."""
        self.draining = False
        """A drain began. Health says so and the doors are shut (listeners closed, GOAWAY on
        every gRPC connection), so no new caller arrives; a stream that still reaches admission
        came in before the doors shut (one the gRPC transport had taken, a request on an HTTP
        keep-alive connection a proxy opened earlier) and is served like a queued one: refused,
        it would fail its caller behind a proxy that cannot resend it."""
        self._idle = asyncio.Event()
        self._idle.set()

    @property
    def accepting(self) -> bool:
        """Ready and not draining: what health reports."""
        return self.ready and not self.draining

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    @property
    def held(self) -> int:
        """Streams active or queued: what a drain waits for."""
        return self.active + len(self._waiters)

    def waiting_by_priority(self) -> dict[Priority, int]:
        counts = dict.fromkeys(Priority, 0)
        for waiter in self._waiters:
            counts[waiter.priority] += 1
        return counts

    def limit(self, priority: Priority) -> int:
        """How many streams may be active for a stream of `priority` to take a place."""
        if priority is Priority.INTERACTIVE:
            return self.max_streams
        return self.max_streams - self.reserved_slots

    @asynccontextmanager
    async def stream(
        self, timeout_s: float | None = None, priority: Priority = Priority.DEFAULT
    ) -> AsyncIterator[None]:
        """Hold a stream place for the body; raises AdmissionRejected or TimeoutError."""
        await self._acquire(timeout_s, priority)
        try:
            yield
        finally:
            self._release()

    async def _acquire(self, timeout_s: float | None, priority: Priority) -> None:
        if not self.ready:
            raise AdmissionRejected("unavailable", NOT_READY)
        ahead = any(w.priority <= priority for w in self._waiters)
        if self.active < self.limit(priority) and not ahead:
            self._take()
            return
        if len(self._waiters) >= self.max_queue and not self._displace(priority):
            raise AdmissionRejected(
                "exhausted",
                f"server is full ({self.active} streams active, {len(self._waiters)} queued)",
            )
        waiter = _Waiter(priority, next(self._arrivals), asyncio.get_running_loop().create_future())
        heapq.heappush(self._waiters, waiter)
        try:
            async with asyncio.timeout(timeout_s):
                await asyncio.shield(waiter.future)
        except BaseException:
            future = waiter.future
            if future.done() and not future.cancelled() and future.exception() is None:
                self._release()  # granted just as we gave up: pass it on
            else:
                future.cancel()
            self._forget(waiter)
            raise

    def _displace(self, priority: Priority) -> bool:
        """Make room in a full queue for a stream of `priority` by refusing the newest of the
        least urgent waiters, if they are less urgent than it. Returns whether it did."""
        if not self._waiters:
            return False
        last = max(self._waiters)
        if last.priority <= priority:
            return False
        self._forget(last)
        last.future.set_exception(
            AdmissionRejected(
                "exhausted",
                f"server is full; a {priority.label} stream took this {last.priority.label} "
                "stream's place in the queue",
            )
        )
        return True

    def _forget(self, waiter: _Waiter) -> None:
        if waiter in self._waiters:
            self._waiters.remove(waiter)
            heapq.heapify(self._waiters)

    def _take(self) -> None:
        self.active += 1
        self._idle.clear()

    def _release(self) -> None:
        self.active -= 1
        self._grant()
        if self.active == 0:
            self._idle.set()

    def _grant(self) -> None:
        """Give free places to waiters, most urgent first; one that may not take a reserved
        place waits, and so does everyone behind it (all less urgent or later)."""
        while self._waiters:
            head = self._waiters[0]
            if head.future.done():  # gave up (timeout, cancel) and not yet forgotten
                heapq.heappop(self._waiters)
                continue
            if self.active >= self.limit(head.priority):
                return
            heapq.heappop(self._waiters)
            self._take()
            head.future.set_result(None)

    def drain(self) -> None:
        """A drain began: health turns NOT_SERVING; streams that still reach admission are
        served (see `draining`), and `wait_idle` tells when the last one is done."""
        self.draining = True

    async def wait_idle(self) -> None:
        """Until no stream is active and none waits."""
        await self._idle.wait()
