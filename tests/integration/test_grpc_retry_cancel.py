"""gRPC's own retries as the client library configures them (`chattts_client.resilience`),
against a bare grpc.aio server that plays a replica refusing, pushing back or hanging: a minimal
reproduction in grpcio alone, no chattts server.

- A stream cancelled by its caller completes at once, in every state a barge-in can find it:
  before any response, during a retry's backoff, after a response, with a reader waiting. (The
  Pipecat adapter's "barge-in hang" blamed on retries did not come from grpcio: its test's 1 s
  start timeout met a dead target's retries. With grpcio 1.85 nothing hangs; this pins it.)
- The caller's own cancel is never retried; a server's CANCELLED before any response is.
- Attempts are capped (5, 1.5 s of backoff in all), and `grpc-retry-pushback-ms` is honoured: a
  delay when given, no retry when negative.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

import grpc
import pytest

from chattts_client.resilience import SERVICE, SERVICE_CONFIG, channel_options

METHOD = f"/{SERVICE}/StreamingSynthesize"


class Replica:
    """Answers StreamingSynthesize with raw bytes: refuses the first `refusals` attempts with
    `refusal` (and `pushback_ms`, if given), then echoes each request once it says "answer"."""

    def __init__(
        self,
        refusals: int = 0,
        refusal: grpc.StatusCode = grpc.StatusCode.UNAVAILABLE,
        pushback_ms: str | None = None,
    ) -> None:
        self.refusals = refusals
        self.refusal = refusal
        self.pushback_ms = pushback_ms
        self.attempts: list[float] = []
        self.cancelled = asyncio.Event()

    async def handle(
        self, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[bytes]:
        self.attempts.append(time.monotonic())
        if len(self.attempts) <= self.refusals:
            if self.pushback_ms is not None:
                context.set_trailing_metadata((("grpc-retry-pushback-ms", self.pushback_ms),))
            await context.abort(self.refusal, "refused")
        try:
            async for request in requests:
                if request == b"answer":
                    yield b"audio"
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            self.cancelled.set()
            raise


async def _serve(replica: Replica) -> tuple[grpc.aio.Server, int]:
    server = grpc.aio.server()
    handler = grpc.stream_stream_rpc_method_handler(replica.handle)
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(SERVICE, {"StreamingSynthesize": handler}),)
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, port


def _run(test) -> None:  # type: ignore[no-untyped-def]
    asyncio.run(asyncio.wait_for(test(), 60))


def _channel(port: int) -> grpc.aio.Channel:
    return grpc.aio.insecure_channel(
        f"127.0.0.1:{port}", options=channel_options(SERVICE_CONFIG, keepalive=True)
    )


@pytest.mark.parametrize(
    "state", ["before any response", "in a retry's backoff", "after a response", "reader waiting"]
)
def test_a_cancelled_stream_completes_at_once(state: str) -> None:
    async def test() -> None:
        replica = Replica(refusals=1 if state == "in a retry's backoff" else 0, pushback_ms=None)
        server, port = await _serve(replica)
        async with _channel(port) as channel:
            call = channel.stream_stream(METHOD)()
            reader = None
            await call.write(b"hello")
            if state == "after a response":
                await call.write(b"answer")
                assert await call.read() == b"audio"
            if state == "reader waiting":
                reader = asyncio.ensure_future(call.read())
            await asyncio.sleep(0.05)  # in the backoff: the first retry waits 0-100 ms (jitter)
            call.cancel()
            assert call.done()  # at once: the cancel itself ends the call, waiting on nothing
            assert await call.code() == grpc.StatusCode.CANCELLED
            if reader is not None:
                with pytest.raises(asyncio.CancelledError):
                    await reader
            if state != "in a retry's backoff":
                await replica.cancelled.wait()  # bounded by _run
            attempts = len(replica.attempts)
            await asyncio.sleep(0.3)
            assert len(replica.attempts) == attempts  # the caller's cancel is not retried
        await server.stop(0)

    _run(test)


def test_a_servers_cancelled_before_any_response_is_resent() -> None:
    async def test() -> None:
        replica = Replica(refusals=1, refusal=grpc.StatusCode.CANCELLED)
        server, port = await _serve(replica)
        async with _channel(port) as channel:
            call = channel.stream_stream(METHOD)()
            await call.write(b"answer")
            assert await call.read() == b"audio"
            assert len(replica.attempts) == 2
            call.cancel()
        await server.stop(0)

    _run(test)


def test_attempts_are_capped() -> None:
    async def test() -> None:
        replica = Replica(refusals=100)
        server, port = await _serve(replica)
        async with _channel(port) as channel:
            call = channel.stream_stream(METHOD)()
            await call.write(b"answer")
            assert await call.code() == grpc.StatusCode.UNAVAILABLE
            assert len(replica.attempts) == 5  # maxAttempts
        await server.stop(0)

    _run(test)


@pytest.mark.parametrize("pushback_ms", ["700", "-1"])
def test_pushback_is_honoured(pushback_ms: str) -> None:
    async def test() -> None:
        replica = Replica(refusals=1, pushback_ms=pushback_ms)
        server, port = await _serve(replica)
        async with _channel(port) as channel:
            call = channel.stream_stream(METHOD)()
            if pushback_ms == "-1":  # the server says: do not retry
                # The replica refuses as the call starts, so its refusal may end the call before
                # the write, which then raises it: either way, no retry.
                with contextlib.suppress(grpc.aio.AioRpcError):
                    await call.write(b"answer")
                assert await call.code() == grpc.StatusCode.UNAVAILABLE
                assert len(replica.attempts) == 1
            else:
                await call.write(b"answer")
                assert await call.read() == b"audio"
                first, second = replica.attempts
                assert second - first >= 0.7
                call.cancel()
        await server.stop(0)

    _run(test)
