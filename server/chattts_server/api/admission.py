"""Stream admission: at most `max_streams` active, `max_queue` waiting, the rest refused at once."""

from __future__ import annotations

import asyncio
import collections
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager


class AdmissionRejected(Exception):
    """Refused: `code` is 'exhausted' (full) or 'unavailable' (not ready or draining)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class Admission:
    """Counts streams; FIFO wait queue. Lives on the event loop (no locks needed)."""

    def __init__(self, max_streams: int, max_queue: int) -> None:
        self.max_streams = max_streams
        self.max_queue = max_queue
        self.active = 0
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        self.accepting = False
        """False until the engine is warm, and again once draining starts."""
        self._idle = asyncio.Event()
        self._idle.set()

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    @asynccontextmanager
    async def stream(self, timeout_s: float | None = None) -> AsyncIterator[None]:
        """Hold a stream place for the body; raises AdmissionRejected or TimeoutError."""
        await self._acquire(timeout_s)
        try:
            yield
        finally:
            self._release()

    async def _acquire(self, timeout_s: float | None) -> None:
        if not self.accepting:
            raise AdmissionRejected(
                "unavailable", "server is not accepting streams (starting or draining)"
            )
        if self.active < self.max_streams and not self._waiters:
            self._take()
            return
        if len(self._waiters) >= self.max_queue:
            raise AdmissionRejected(
                "exhausted",
                f"server is full ({self.active} streams active, {len(self._waiters)} queued)",
            )
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await asyncio.wait_for(asyncio.shield(waiter), timeout_s)
        except BaseException:
            if waiter.done() and not waiter.cancelled() and waiter.exception() is None:
                self._release()  # granted just as we gave up: pass it on
            else:
                waiter.cancel()
            if waiter in self._waiters:
                self._waiters.remove(waiter)
            raise
        if not self.accepting:
            self._release()
            raise AdmissionRejected("unavailable", "server is draining")

    def _take(self) -> None:
        self.active += 1
        self._idle.clear()

    def _release(self) -> None:
        self.active -= 1
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                self._take()
                waiter.set_result(None)
                break
        if self.active == 0:
            self._idle.set()

    def stop_accepting(self) -> None:
        """Start draining: refuse new streams and wake queued ones so they get UNAVAILABLE."""
        self.accepting = False
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_exception(AdmissionRejected("unavailable", "server is draining"))

    async def wait_idle(self) -> None:
        await self._idle.wait()
