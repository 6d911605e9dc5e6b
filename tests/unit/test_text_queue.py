"""A stream's text queue (stream/text_queue.py) with the real markdown front end, no engine: segments
tag their utterances and end with their SegmentDone; a replace rewrites the queue as the
segment's state says; a clear ends the queued segments; arrivals stamp each utterance."""

from __future__ import annotations

import pytest

from chattts_server.errors import InvalidRequestError
from chattts_server.stream.items import MarkAt, SegmentDone, Speak
from chattts_server.stream.segments import IfStarted, IllegalMove, Outcome, SegmentBook, State
from chattts_server.stream.text_front_end import MarkdownText
from chattts_server.stream.text_queue import Stop, TextFragment, TextQueue
from chattts_server.text.release import ReleasePolicy


def _queue() -> TextQueue:
    return TextQueue(MarkdownText(ReleasePolicy(), markdown=False))


def _stops(stops: list[Stop]) -> list[tuple]:
    return [
        (
            s.reason,
            s.at_word,
            s.segment.name if s.segment else None,
            s.segment.revision if s.segment else None,
        )
        for s in stops
    ]


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
    tq = _queue()
    tq.apply(TextFragment("Go on."), 1.0)
    tq.apply(TextFragment("In 300 m", segment="t"), 2.0)
    tq.apply(TextFragment(" turn left.", flush=True), 3.0)
    tq.apply(TextFragment("After."), 4.0)
    tq.end()
    assert _describe(list(tq.pending)) == [
        "Go on.",
        "In 300 m turn left.@t0",
        "end t0",
        "After.",
    ]
    speaks = [i for i in list(tq.pending) if isinstance(i, Speak)]
    assert [s.received_at for s in speaks] == [1.0, 2.0, 4.0]


def test_replacing_a_pending_segment_puts_the_new_text_in_its_place() -> None:
    tq = _queue()
    tq.apply(TextFragment("In 300 m turn left.", segment="t", flush=True), 1.0)
    tq.apply(TextFragment("Then more.", flush=True), 1.0)
    assert tq.apply(TextFragment("In 100 m turn left.", replace="t"), 2.0) == []
    assert _describe(list(tq.pending)) == [
        "end t0",
        "In 100 m turn left.@t1",
        "end t1",
        "Then more.",
    ]
    old = list(tq.pending)[0].segment
    assert old.state.outcome is Outcome.REPLACED


def test_replacing_a_taken_segment_stops_it_at_once() -> None:
    tq = _queue()
    tq.apply(TextFragment("In 300 m turn left.", segment="t", flush=True), 1.0)
    first = tq.pending.popleft()
    first.segment.move(State.TAKEN)  # the stream took it; no audio yet
    stops = tq.apply(TextFragment("Now.", replace="t"), 2.0)
    assert first.segment.state.outcome is Outcome.REPLACED
    assert _stops(stops) == [("replaced", False, "t", 0)]


@pytest.mark.parametrize(
    ("how", "want", "outcome", "calls"),
    [
        (IfStarted.FINISH, ["part two.@t0", "end t0", "Now.@t1", "end t1"], None, []),
        (IfStarted.CUT, ["end t0", "Now.@t1", "end t1"], Outcome.CUT, [("cut", True, "t", 0)]),
        (IfStarted.DROP_NEW, ["part two.@t0", "end t0", "end t1"], None, []),
    ],
)
def test_replacing_a_speaking_segment_follows_if_started(how, want, outcome, calls) -> None:
    tq = _queue()
    tq.apply(TextFragment("Part one. part two.", segment="t", flush=True), 1.0)
    first = tq.pending.popleft()
    first.segment.move(State.TAKEN)
    first.segment.move(State.SPEAKING)
    stops = tq.apply(TextFragment("Now.", replace="t", if_started=how), 2.0)
    assert _describe(list(tq.pending)) == want
    assert first.segment.state.outcome is outcome
    assert _stops(stops) == calls
    if how is IfStarted.DROP_NEW:
        new = list(tq.pending)[-1].segment
        assert new.state.outcome is Outcome.NOT_SPOKEN
        assert tq.book.in_force("t") is first.segment  # a later replace finds the speaking one


def test_a_clear_ends_queued_segments_and_drops_marks_in_order() -> None:
    tq = _queue()
    tq.apply(TextFragment("One.", segment="a", flush=True), 1.0)
    tq.apply(TextFragment("Two.", mark="m"), 1.0)
    tq.apply(TextFragment("Three", segment="b"), 1.0)
    stops = tq.apply(TextFragment("", clear=True), 2.0)
    assert _describe(list(tq.pending)) == ["end a0", "mark m dropped", "end b0"]
    assert [i.segment.state.outcome for i in tq.pending if isinstance(i, SegmentDone)] == [
        Outcome.NOT_SPOKEN,
        Outcome.NOT_SPOKEN,
    ]
    assert _stops(stops) == [("cleared", False, None, None)]


def test_naming_an_unfinished_segment_again_is_refused() -> None:
    tq = _queue()
    tq.apply(TextFragment("One.", segment="a", flush=True), 1.0)
    with pytest.raises(InvalidRequestError) as err:
        tq.apply(TextFragment("Again.", segment="a"), 1.0)
    assert err.value.field_name == "text.segment"


def test_expiry_counts_from_the_message_that_began_the_segment() -> None:
    tq = _queue()
    tq.apply(TextFragment("Turn now.", segment="n", expires_in_ms=500, flush=True), 10.0)
    segment = tq.pending.popleft().segment
    assert segment.expires_at == pytest.approx(10.5)
    assert not segment.expired(10.4) and segment.expired(10.5)
    segment.move(State.TAKEN)
    segment.move(State.SPEAKING)
    assert not segment.expired(99.0), "a segment that has sent audio never expires"


def test_revisions_count_every_replace_and_a_refused_one_ends_where_it_was_refused() -> None:
    """tts.proto SegmentEnd.revision: "0 for the text sent with `segment`, then 1, 2, ... for
    each replace". A DROP_NEW replace of a speaking segment takes a number too, and its
    SegmentEnd comes where the revision it refused to replace ends, before a later one's audio."""
    tq = _queue()
    tq.apply(TextFragment("In 300 m turn left. Then keep on.", segment="t", flush=True), 1.0)
    speaking = tq.pending.popleft().segment
    speaking.move(State.TAKEN)
    speaking.move(State.SPEAKING)
    tq.apply(TextFragment("In 200 m.", replace="t", if_started=IfStarted.DROP_NEW), 2.0)
    tq.apply(TextFragment("In 100 m.", replace="t", if_started=IfStarted.FINISH), 3.0)
    assert _describe(list(tq.pending)) == [
        "Then keep on.@t0",
        "end t0",
        "end t1",
        "In 100 m.@t2",
        "end t2",
    ]
    tq.apply(TextFragment("Now.", replace="t", if_started=IfStarted.FINISH), 4.0)
    revisions = [i.segment.revision for i in tq.pending if isinstance(i, SegmentDone)]
    assert revisions == [0, 1, 2, 3]


def test_a_segment_moves_only_as_its_table_allows() -> None:
    segment = SegmentBook().revise("t", 0.0, 0)
    with pytest.raises(IllegalMove):
        segment.move(State.SPEAKING)  # never taken for synthesis
    segment.move(State.TAKEN)
    segment.move(State.SPEAKING)
    with pytest.raises(IllegalMove):
        segment.move(State.REPLACED)  # started: a replace cuts or finishes it
    segment.end(State.CUT)
    segment.end(State.NOT_SPOKEN)  # it has its outcome: a later end changes nothing
    assert segment.report() is Outcome.CUT and segment.reported
