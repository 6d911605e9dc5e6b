"""The client library's socket object for WebSocket contexts (chattts_client.ws_contexts)
against the real server: each context's events are its own and end with its close, barge-in
opens the next turn on the same socket, a context's error is raised by that context alone."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from chattts_client.ws_contexts import Context, ContextAudio, ContextError, ContextSocket
from httputil import TOKEN, fixed

RATE = 24000


@pytest.fixture
def url(contexts_url: str) -> str:
    return contexts_url


async def _socket(url: str) -> ContextSocket:
    return await ContextSocket.connect(url, api_key=TOKEN, audio_format="pcm", **fixed(24))


async def _events(context: Context) -> list[ContextAudio | dict[str, Any]]:
    return [event async for event in context]


def _samples(events: list[ContextAudio | dict[str, Any]]) -> int:
    return sum(len(e.audio) // 2 for e in events if isinstance(e, ContextAudio))


def test_two_voices_each_hear_their_own_events_to_their_close(url) -> None:
    async def run() -> dict[str, list[ContextAudio | dict[str, Any]]]:
        async with await _socket(url) as ws:
            contexts = [
                await ws.open(name, voice=f"seed:{n + 1}", audio_format="pcm", **fixed(24, n))
                for n, name in enumerate(("left", "right"))
            ]
            for context in contexts:
                await context.send(f"{context.context_id}: turn here. ")
                await context.mark("after")
                await context.send("Then keep going.")
                await context.close()
            heard = await asyncio.gather(*(_events(c) for c in contexts))
            return {c.context_id: events for c, events in zip(contexts, heard, strict=True)}

    heard = asyncio.run(run())
    for context_id, events in heard.items():
        assert all(e.context_id == context_id for e in events if isinstance(e, ContextAudio))
        messages = [e for e in events if isinstance(e, dict)]
        assert all(m["context_id"] == context_id for m in messages)
        assert messages[-1]["type"] == "context_closed" and messages[-1]["reason"] == "closed"
        ends = [m for m in messages if m["type"] == "utterance_end"]
        assert sum(m["num_samples"] for m in ends) == _samples(events) > 0
        assert round(messages[-1]["audio_duration_s"] * RATE) == _samples(events)
        assert [m["name"] for m in messages if m["type"] == "mark"] == ["after"]


def test_barge_in_closes_a_turn_now_and_the_next_turn_speaks_on_the_same_socket(url) -> None:
    async def run() -> tuple[dict[str, Any] | None, list[ContextAudio | dict[str, Any]], str]:
        async with await _socket(url) as ws:
            first = await ws.open("turn")
            await first.send("A long answer that goes on and on. " * 4, flush=True)
            async for event in first:
                if isinstance(event, ContextAudio):
                    break  # the user spoke
            await first.close(immediate=True)
            second = await ws.open("turn-2")
            await second.send("Sure, go ahead.")
            await second.close()
            rest = await _events(second)
            async for _ in first:  # what was in flight, then its close
                pass
            again = await ws.open("turn")  # the first id, free once its context closed
            await again.send("Yes.")
            await again.close()
            await _events(again)
            assert again.closed is not None
            return first.closed, rest, again.closed["reason"]

    closed, rest, again = asyncio.run(run())
    assert closed is not None and closed["reason"] == "immediate"
    assert _samples(rest) > 0 and rest[-1]["type"] == "context_closed" and again == "closed"


def test_a_context_error_is_its_own_and_the_other_context_speaks(url, contexts_server) -> None:
    max_contexts = contexts_server.config.limits.ws_max_contexts

    async def run() -> tuple[ContextError, ContextError, list[ContextAudio | dict[str, Any]]]:
        async with await _socket(url) as ws:
            good = await ws.open("good")
            await good.send("Still here.")
            bad = await ws.open("bad", voice="no-such-voice")
            with pytest.raises(ContextError) as bad_config:
                await _events(bad)
            extra = [await ws.open(f"extra-{n}") for n in range(max_contexts)]
            for context in extra:
                await context.send("Hello.")
            with pytest.raises(ContextError) as over:
                await _events(extra[-1])  # one over --ws-max-contexts
            await good.close()
            await extra[0].close(immediate=True)
            heard = await _events(good)
            await _events(extra[0])
            return bad_config.value, over.value, heard

    bad_config, over, heard = asyncio.run(run())
    assert bad_config.context_id == "bad" and bad_config.error["param"] == "config.voice"
    assert over.context_id == f"extra-{max_contexts - 1}" and over.code
    assert _samples(heard) > 0 and heard[-1]["reason"] == "closed"


def test_an_error_naming_no_context_is_raised_once_by_the_next_call(url) -> None:
    """A context id the server cannot read (a tab in it): its error names no context, so the
    socket's next call raises it, once; the socket and its other contexts go on."""

    async def run() -> tuple[ContextError, list[ContextAudio | dict[str, Any]]]:
        async with await _socket(url) as ws:
            bad = await ws.open("tab\there")
            await bad.send("Nothing.")
            good = await ws.open("good")
            raised = None
            for _ in range(2400):  # until the error comes back (120 s: a loaded machine is slow)
                try:
                    await good.send("")
                except ContextError as exc:
                    raised = exc
                    break
                await asyncio.sleep(0.05)
            assert raised is not None
            await good.send("Still here.")
            await good.close()
            return raised, await _events(good)

    raised, heard = asyncio.run(run())
    assert raised.context_id is None and raised.error["param"] == "context_id"
    assert _samples(heard) > 0 and heard[-1]["reason"] == "closed"
