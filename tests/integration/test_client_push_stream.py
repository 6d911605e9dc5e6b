"""The client's push stream (AsyncTTSClient.open_stream) against a fake in-process
TextToSpeech servicer (tests/helpers/fake_tts.py): each call sent as it is made, marks, clear,
end_input and cancel."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from chattts_client import (
    AsyncTTSClient,
    AudioChunkEvent,
    MarkEvent,
    UtteranceEndEvent,
    make_config,
)
from fake_tts import CALL_TIMEOUT_S, CHUNK_SAMPLES, NUM_CHUNKS, TOKEN


def test_push_stream_sends_each_call_as_it_is_made_and_yields_events(fake) -> None:  # type: ignore[no-untyped-def]
    """Text pushed after audio came back (requests and responses flow at once), a mark, a clear
    with a mark at the cut, end_input half-closes; the timeline keeps the text and events."""
    servicer, target = fake

    async def run():  # type: ignore[no-untyped-def]
        async with AsyncTTSClient(target, token=TOKEN) as client:
            stream = client.open_stream(config=make_config(voice="alice"), timeout=CALL_TIMEOUT_S)
            stream.push("one ")
            events = []
            async with stream:
                async for event in stream:
                    events.append(event)
                    if isinstance(event, UtteranceEndEvent) and event.text == "one ":
                        stream.mark("turn-1", "two ")
                    elif isinstance(event, MarkEvent) and event.name == "turn-1":
                        stream.flush()
                        stream.clear("three", mark="cut")
                    elif isinstance(event, UtteranceEndEvent) and event.text == "three":
                        stream.end_input()
                        stream.end_input()  # idempotent
                        with pytest.raises(RuntimeError, match="ended"):
                            stream.push("four")
            return events, stream

    events, stream = asyncio.run(asyncio.wait_for(run(), 2 * CALL_TIMEOUT_S))
    requests = servicer.stream_requests
    assert requests[0].config.voice.preset == "alice"
    sent = [(r.text.text, r.text.flush, r.text.clear, r.text.mark) for r in requests[1:]]
    assert sent == [
        ("one ", False, False, ""),
        ("two ", False, False, "turn-1"),
        ("", True, False, ""),
        ("", False, True, ""),
        ("", False, False, "cut"),  # a mark at the cut, before the text after it
        ("three", False, False, ""),
        ("", False, False, ""),  # end_input: the text's end, in band (`last`)
    ]
    assert [r.text.seq for r in requests[1:]] == [1, 2, 3, 4, 5, 6, 7]
    assert requests[-1].text.last and not any(r.text.last for r in requests[1:-1])
    marks = [e for e in events if isinstance(e, MarkEvent)]
    assert [m.name for m in marks] == ["turn-1", "cut"]
    assert marks[0].sample_offset == 2 * NUM_CHUNKS * CHUNK_SAMPLES and not marks[0].dropped
    assert stream.sent_text == "one two three" and stream.input_ended
    assert stream.timeline.marks == marks  # the stream's timeline saw every event
    assert stream.stats.num_chunks == 6 * NUM_CHUNKS and stream.stats.num_utterances == 6
    assert servicer.metadata[0]["authorization"] == f"Bearer {TOKEN}"


def test_push_stream_cancel_ends_the_call(fake) -> None:  # type: ignore[no-untyped-def]
    _, target = fake

    async def run():  # type: ignore[no-untyped-def]
        async with AsyncTTSClient(target) as client:
            stream = client.open_stream(timeout=CALL_TIMEOUT_S)
            stream.push("one")  # never half-closed: only the cancel ends the call
            first = await stream.__anext__()
            stream.cancel()
            rest = [e async for e in stream]  # ends: no CancelledError into this task
            return first, rest, await stream.call.code()  # type: ignore[attr-defined]

    first, rest, code = asyncio.run(asyncio.wait_for(run(), 2 * CALL_TIMEOUT_S))
    assert isinstance(first, AudioChunkEvent) and rest == []
    assert code == grpc.StatusCode.CANCELLED
