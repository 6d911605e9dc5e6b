"""The reader's queue (api/text_queue.py) with the real markdown front end, no engine: segments
tag their utterances and end with their SegmentDone; a replace rewrites the queue as the
segment's state says; a clear ends the queued segments; arrivals stamp each utterance."""

from __future__ import annotations

import asyncio

import pytest

from chattts_server.api.text_front_end import MarkdownText
from chattts_server.errors import InvalidRequestError
from chattts_server.stream.items import MarkAt, SegmentDone, Speak
from chattts_server.stream.segments import IfStarted, Outcome, State
from chattts_server.stream.text_queue import TextFragment, TextQueue
from chattts_server.text.release import ReleasePolicy


class Speaker:
    """The speaking side's answers, recorded."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def interrupt(self) -> None:
        self.calls.append(("interrupt",))

    def stop_segment(self, segment, at_word: bool) -> None:
        self.calls.append(("stop", segment.name, segment.revision, at_word))


def _queue() -> tuple[TextQueue, asyncio.Queue, Speaker]:
    queue: asyncio.Queue = asyncio.Queue()
    speaker = Speaker()
    text_queue = TextQueue(MarkdownText(ReleasePolicy(), markdown=False), queue, lambda: speaker)
    return text_queue, queue, speaker


def _items(queue: asyncio.Queue) -> list:
    items = []
    while not queue.empty():
        items.append(queue.get_nowait())
    for item in items:
        queue.put_nowait(item)
    return items


def _describe(items: list) -> list[str]:
    out = []
    for item in items:
        if isinstance(item, Speak):
            tag = f"@{item.segment.name}{item.segment.revision}" if item.segment else ""
            out.append(item.text.text + tag)
        elif isinstance(item, SegmentDone):
            out.append(f"end {item.segment.name}{item.segment.revision}")
        elif isinstance(item, MarkAt):
            out.append(f"mark {item.name}{' dropped' if item.dropped else ''}")
    return out


def test_a_segment_runs_to_the_next_flush_and_tags_its_utterances() -> None:
    tq, queue, _ = _queue()
    tq.apply(TextFragment("Go on."), 1.0)
    tq.apply(TextFragment("In 300 m", segment="t"), 2.0)
    tq.apply(TextFragment(" turn left.", flush=True), 3.0)
    tq.apply(TextFragment("After."), 4.0)
    tq.end()
    assert _describe(_items(queue)) == [
        "Go on.",
        "In 300 m turn left.@t0",
        "end t0",
        "After.",
    ]
    speaks = [i for i in _items(queue) if isinstance(i, Speak)]
    assert [s.received_at for s in speaks] == [1.0, 2.0, 4.0]


def test_replacing_a_pending_segment_puts_the_new_text_in_its_place() -> None:
    tq, queue, speaker = _queue()
    tq.apply(TextFragment("In 300 m turn left.", segment="t", flush=True), 1.0)
    tq.apply(TextFragment("Then more.", flush=True), 1.0)
    tq.apply(TextFragment("In 100 m turn left.", replace="t"), 2.0)
    assert _describe(_items(queue)) == [
        "end t0",
        "In 100 m turn left.@t1",
        "end t1",
        "Then more.",
    ]
    old = _items(queue)[0].segment
    assert old.outcome is Outcome.REPLACED and speaker.calls == []


def test_replacing_a_taken_segment_stops_it_at_once() -> None:
    tq, queue, speaker = _queue()
    tq.apply(TextFragment("In 300 m turn left.", segment="t", flush=True), 1.0)
    first = queue.get_nowait()
    first.segment.state = State.TAKEN  # the speaking side took it; no audio yet
    tq.apply(TextFragment("Now.", replace="t"), 2.0)
    assert first.segment.outcome is Outcome.REPLACED
    assert speaker.calls == [("stop", "t", 0, False)]


@pytest.mark.parametrize(
    ("how", "want", "outcome", "calls"),
    [
        (IfStarted.FINISH, ["part two.@t0", "end t0", "Now.@t1", "end t1"], None, []),
        (IfStarted.CUT, ["end t0", "Now.@t1", "end t1"], Outcome.CUT, [("stop", "t", 0, True)]),
        (IfStarted.DROP_NEW, ["part two.@t0", "end t0", "end t1"], None, []),
    ],
)
def test_replacing_a_speaking_segment_follows_if_started(how, want, outcome, calls) -> None:
    tq, queue, speaker = _queue()
    tq.apply(TextFragment("Part one. part two.", segment="t", flush=True), 1.0)
    first = queue.get_nowait()
    first.segment.state = State.SPEAKING
    tq.apply(TextFragment("Now.", replace="t", if_started=how), 2.0)
    assert _describe(_items(queue)) == want
    assert first.segment.outcome is outcome
    assert speaker.calls == calls
    if how is IfStarted.DROP_NEW:
        new = _items(queue)[-1].segment
        assert new.outcome is Outcome.NOT_SPOKEN
        assert tq.book.latest("t") is first.segment  # a later replace finds the speaking one


def test_a_clear_ends_queued_segments_and_drops_marks_in_order() -> None:
    tq, queue, speaker = _queue()
    tq.apply(TextFragment("One.", segment="a", flush=True), 1.0)
    tq.apply(TextFragment("Two.", mark="m"), 1.0)
    tq.apply(TextFragment("Three", segment="b"), 1.0)
    tq.apply(TextFragment("", clear=True), 2.0)
    assert _describe(_items(queue)) == ["end a0", "mark m dropped", "end b0"]
    assert [i.segment.outcome for i in _items(queue) if isinstance(i, SegmentDone)] == [
        Outcome.NOT_SPOKEN,
        Outcome.NOT_SPOKEN,
    ]
    assert speaker.calls == [("interrupt",)]


def test_naming_an_unfinished_segment_again_is_refused() -> None:
    tq, _, _ = _queue()
    tq.apply(TextFragment("One.", segment="a", flush=True), 1.0)
    with pytest.raises(InvalidRequestError) as err:
        tq.apply(TextFragment("Again.", segment="a"), 1.0)
    assert err.value.field_name == "text.segment"


def test_expiry_counts_from_the_message_that_began_the_segment() -> None:
    tq, queue, _ = _queue()
    tq.apply(TextFragment("Turn now.", segment="n", expires_in_ms=500, flush=True), 10.0)
    segment = queue.get_nowait().segment
    assert segment.expires_at == pytest.approx(10.5)
    assert not segment.expired(10.4) and segment.expired(10.5)
    segment.state = State.SPEAKING
    assert not segment.expired(99.0), "a segment that has sent audio never expires"
