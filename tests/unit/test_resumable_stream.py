"""A resumable stream's own task (api/resume.py `ResumableStream`) against its attached call:
a CancelStream that lands in the same loop turn as a write completes still ends the stream."""

from __future__ import annotations

import asyncio

import pytest

from chattts_server.api.resume import Resumer
from chattts_server.metrics import Metrics
from chattts_server.stream.events import AudioOut


def _audio(offset: int) -> AudioOut:
    return AudioOut(bytes(480), offset, 240, 0, 24000, "pcm")


@pytest.mark.parametrize("turns", range(8))
def test_a_cancel_landing_as_a_write_completes_ends_the_stream(turns: int) -> None:
    """The call writes an event and, `turns` loop turns later, its reader reads CancelStream:
    the stream's task (waiting for that write) ends cancelled at every interleaving, instead
    of generating on (before Python 3.12, asyncio.wait_for returned the write's completion and
    swallowed a cancel that landed just after it: a LiveKit stream closed mid-utterance was
    generated to its end)."""

    async def test() -> None:
        stream = Resumer(20.0, 60.0, Metrics()).open(None)
        sent: list[int] = []
        first_write = asyncio.Event()

        async def generate() -> None:
            for n in range(100):
                await stream.send(_audio(n * 240))
                sent.append(n)

        async def write(event: object) -> None:
            first_write.set()

        async def cancel_later() -> None:
            await first_write.wait()
            for _ in range(turns):
                await asyncio.sleep(0)
            stream.cancel()

        stream.start(generate())
        canceller = asyncio.create_task(cancel_later())
        with pytest.raises(Exception, match="cancelled"):
            await stream.attach(write)
        await canceller
        assert stream.task is not None and stream.task.cancelled()
        assert len(sent) < 100

    asyncio.run(test())
