"""What a new stream is sent when a lost one goes on elsewhere, and how its events come back
on the caller's timeline (chattts_client/continuation.py)."""

from __future__ import annotations

from chattts_client import (
    AudioChunkEvent,
    Clear,
    Flush,
    Mark,
    MarkEvent,
    Replace,
    Segment,
    SegmentEndEvent,
    UtteranceEndEvent,
)
from chattts_client.continuation import IDENTITY, Heard, continuation_plan
from chattts_client.messages import WordTiming, WordTimingsEvent


def _chunk(offset: int, n: int, utterance: int, heard: int) -> AudioChunkEvent:
    return AudioChunkEvent(b"\0\0" * n, offset, n, utterance, 24000, "LINEAR16", heard)


def _heard(*events: object) -> Heard:
    heard = Heard()
    for event in events:
        heard.observe(event)  # type: ignore[arg-type]
    return heard


def test_the_new_stream_starts_at_the_first_word_not_wholly_heard() -> None:
    sent = ["Turn left here. ", "Then keep ", "right."]
    heard = _heard(_chunk(0, 4800, 0, 4), _chunk(4800, 4800, 0, 9))
    plan = continuation_plan(sent, heard)
    assert plan.items == (" here. ", "Then keep ", "right.")
    assert (plan.from_source, plan.from_word) == (9, 2)
    timeline = plan.timeline
    assert timeline.sample_base == 9600 and timeline.utterance_base == 0
    # " here. " is the caller's 9..16, "Then keep " 16..26: the new text maps straight on.
    assert [timeline.source(k) for k in (0, 1, 7, 17)] == [9, 10, 16, 26]
    moved = timeline.event(_chunk(0, 100, 0, 6))
    assert (moved.sample_offset, moved.utterance_index, moved.heard_source_end) == (9600, 0, 15)


def test_after_an_utterance_ended_the_next_one_keeps_its_index() -> None:
    heard = _heard(
        _chunk(0, 4800, 0, 4),
        UtteranceEndEvent(0, "a", 0.2, 0, 0, 1, "eos", 0, 4800, "Turn left.", 0, 10),
        _chunk(4800, 100, 1, 11),
    )
    plan = continuation_plan(["Turn left. ", "Go on."], heard)
    assert plan.items == ("Go on.",) and plan.timeline.utterance_base == 1
    end = plan.timeline.event(
        UtteranceEndEvent(0, "go on", 0.2, 0, 0, 1, "eos", 0, 10, "Go on.", 0, 6)
    )
    assert (end.utterance_index, end.sample_offset, end.source_start, end.source_end) == (
        1,
        4900,
        11,
        17,
    )


def test_answered_marks_and_ended_segments_are_not_sent_again() -> None:
    sent = [
        Segment("turn", "In 300 m turn left."),
        Mark("after-turn"),
        Replace("turn", "Now turn left.", if_started="finish"),
        Mark("end", "Then straight on."),
    ]
    heard = _heard(
        _chunk(0, 9600, 0, 19),
        SegmentEndEvent("turn", 0, "spoken", 9600, 0.4, "In 300 m turn left."),
        MarkEvent("after-turn", 9600, 0.4, False),
    )
    plan = continuation_plan(sent, heard)
    assert plan.items == (
        Replace("turn", "Now turn left.", if_started="finish"),
        Mark("end", "Then straight on."),
    )
    # The new stream's revision 0 of "turn" is the caller's revision 1.
    end = plan.timeline.event(SegmentEndEvent("turn", 0, "spoken", 100, 0.0, "Now turn left."))
    assert (end.revision, end.sample_offset) == (1, 9700)
    mark = plan.timeline.event(MarkEvent("end", 200, 200 / 24000, False))
    assert mark.sample_offset == 9800 and abs(mark.offset_s - 9800 / 24000) < 1e-9


def test_text_before_a_clear_still_to_come_is_not_sent_but_its_marks_are() -> None:
    sent = ["One two. ", Mark("m", "Three four. "), Flush("five. "), Clear("Stop.")]
    heard = _heard(_chunk(0, 2400, 0, 3))
    plan = continuation_plan(sent, heard)
    assert plan.items == (Mark("m"), Flush(""), Clear("Stop."))
    assert plan.timeline.source(0) == len("One two. Three four. five. ")


def test_a_clear_already_heard_is_not_sent_again() -> None:
    plan = continuation_plan(["Hello there. ", Clear("New text now.")], _heard(_chunk(0, 1, 0, 17)))
    assert plan.items == ("text now.",)


def test_word_timings_move_to_the_callers_text_and_timeline() -> None:
    plan = continuation_plan(["Alpha beta gamma."], _heard(_chunk(0, 2400, 0, 5)))
    word = WordTiming("beta", 0, 2400, 0.0, 0.1, 1, 5, "beta", True)
    event = plan.timeline.event(WordTimingsEvent(0, (word,), "TIMING_ESTIMATE"))
    moved = event.words[0]  # type: ignore[union-attr]
    assert (moved.start_sample, moved.end_sample, moved.source_start, moved.source_end) == (
        2400,
        4800,
        6,
        10,
    )
    assert IDENTITY.event(event) is event
