"""The client's side of the stream's timeline, with no server: the new events from their
protobuf messages, marks on the way out, and `Timeline.heard_text` (what a listener heard at a
playback position, in the caller's own text) for barge-in."""

from __future__ import annotations

import pytest

from chattts_client import (
    MODEL_SAMPLE_RATE_HZ,
    Clear,
    Flush,
    Mark,
    MarkEvent,
    Timeline,
    UtteranceEndEvent,
    WordTimingsEvent,
    event_from_pb,
    make_config,
)
from chattts_client.messages import text_input
from chattts_proto.chattts.v1 import tts_pb2
from timed_words import RATE_HZ, utterance

WORD = 7200  # samples a word lasts in these tests (0.3 s)

# --- messages -------------------------------------------------------------------------------


def test_mark_and_word_timings_events_from_their_messages() -> None:
    mark = event_from_pb(
        tts_pb2.StreamingSynthesizeResponse(
            mark=tts_pb2.Mark(name="turn-1", sample_offset=48000, offset_s=2.0, dropped=True)
        )
    )
    assert mark == MarkEvent("turn-1", 48000, 2.0, True)
    word = tts_pb2.WordTiming(
        text="two hundred meters",
        start_sample=100,
        end_sample=900,
        start_s=100 / RATE_HZ,
        end_s=900 / RATE_HZ,
        source_start=3,
        source_end=8,
        source_text="200 m",
        has_source=True,
    )
    timings = event_from_pb(
        tts_pb2.SynthesizeResponse(
            word_timings=tts_pb2.WordTimings(
                utterance_index=2, words=[word], source=tts_pb2.TIMING_MODEL_ATTENTION
            )
        )
    )
    assert isinstance(timings, WordTimingsEvent)
    assert timings.utterance_index == 2 and timings.source == "TIMING_MODEL_ATTENTION"
    (w,) = timings.words
    assert (w.text, w.start_sample, w.end_sample, w.source_text) == (
        "two hundred meters",
        100,
        900,
        "200 m",
    )
    assert (w.source_start, w.source_end, w.has_source) == (3, 8, True)


def test_utterance_end_carries_its_offsets_and_the_callers_text() -> None:
    end = event_from_pb(
        tts_pb2.StreamingSynthesizeResponse(
            utterance_end=tts_pb2.UtteranceEnd(
                utterance_index=1,
                text="two hundred meters",
                finish_reason="cleared",
                sample_offset=24000,
                num_samples=1200,
                source_text="200 m",
                source_start=3,
                source_end=8,
            )
        )
    )
    assert isinstance(end, UtteranceEndEvent)
    assert (end.sample_offset, end.num_samples) == (24000, 1200)
    assert (end.source_text, end.source_start, end.source_end) == ("200 m", 3, 8)


def test_marks_go_out_on_text_input() -> None:
    assert text_input(Mark("end-of-turn")).text == tts_pb2.TextInput(mark="end-of-turn")
    assert text_input(Mark("m", "Bye.")).text == tts_pb2.TextInput(text="Bye.", mark="m")
    assert text_input("Hi. ", mark="m").text == tts_pb2.TextInput(text="Hi. ", mark="m")
    # A mark after the cut of a clear, or riding with a flush.
    assert text_input(Clear("New."), mark="m").text == tts_pb2.TextInput(
        text="New.", clear=True, mark="m"
    )
    assert text_input(Flush("Go."), mark="m").text == tts_pb2.TextInput(
        text="Go.", flush=True, mark="m"
    )
    with pytest.raises(ValueError, match="own name"):
        text_input(Mark("a"), mark="b")


def test_word_timing_is_asked_for_in_the_config() -> None:
    assert make_config(word_timing=True).word_timing is True
    assert make_config().word_timing is False
    assert MODEL_SAMPLE_RATE_HZ == 24000


# --- what was heard -------------------------------------------------------------------------

TEXT = "In 200 m, turn left. Then keep right."
FIRST = [
    ("In", "In"),
    ("two", "200 m"),
    ("hundred", "200 m"),
    ("meters", "200 m"),
    ("turn", "turn"),
    ("left", "left"),
]
SECOND = [("Then", "Then"), ("keep", "keep"), ("right", "right")]


def _two_utterances(timeline: Timeline, *, words: bool = True) -> None:
    first = utterance(TEXT, FIRST, index=0, start_sample=0)
    second = utterance(TEXT, SECOND, index=1, start_sample=6 * WORD, search_from=20)
    for timings, end in (first, second):
        if words:
            timeline.observe(timings)
        timeline.observe(end)


def test_heard_text_is_the_callers_text_cut_after_the_last_word_played() -> None:
    timeline = Timeline()
    for item in timeline.track([TEXT]):
        assert item == TEXT
    _two_utterances(timeline)
    assert timeline.heard_text(0) == ""
    assert timeline.heard_text(WORD) == "In"
    # "200 m" was spoken as three words: it is heard once the last of them is.
    assert timeline.heard_text(3 * WORD) == "In"
    assert timeline.heard_text(4 * WORD - 1) == "In"
    assert timeline.heard_text(4 * WORD) == "In 200 m"
    assert timeline.heard_text(5 * WORD + 10) == "In 200 m, turn"
    assert timeline.heard_text(6 * WORD) == "In 200 m, turn left."  # the utterance, whole
    assert timeline.heard_text(8 * WORD) == "In 200 m, turn left. Then keep"
    assert timeline.heard_text(played_s=8 * WORD / RATE_HZ) == "In 200 m, turn left. Then keep"
    assert timeline.heard_text(10**9) == TEXT
    with pytest.raises(ValueError, match="played_samples or played_s"):
        timeline.heard_text()


def test_without_word_timing_heard_text_stops_at_the_last_whole_utterance() -> None:
    timeline = Timeline(TEXT)
    _two_utterances(timeline, words=False)
    assert timeline.heard_text(6 * WORD - 1) == ""
    assert timeline.heard_text(6 * WORD) == "In 200 m, turn left."
    assert timeline.heard_text(9 * WORD) == TEXT


def test_after_a_clear_the_dropped_text_is_not_heard_and_since_picks_a_turn() -> None:
    before = "In 200 m, turn left onto Main Street. "
    after = "Rerouting. Turn right."
    timeline = Timeline()
    items = list(timeline.track([before]))
    turn_start = timeline.num_sent_chars
    items += list(timeline.track([Clear(after), Mark("turn-2")]))
    assert items == [before, Clear(after), Mark("turn-2")]
    text = before + after
    assert timeline.text == text
    words = [*FIRST, ("onto", "onto"), ("Main", "Main"), ("Street", "Street")]
    # The clear cut utterance 0 after "left": its timings stop there.
    cut = 6 * WORD
    for event in utterance(
        text, words, index=0, start_sample=0, spoken_until=cut, finish_reason="cleared"
    ):
        timeline.observe(event)
    rerouting = [("Rerouting", "Rerouting"), ("Turn", "Turn"), ("right", "right")]
    for event in utterance(text, rerouting, index=1, start_sample=cut, search_from=len(before)):
        timeline.observe(event)
    timeline.observe(MarkEvent("turn-2", cut + 3 * WORD, (cut + 3 * WORD) / RATE_HZ, False))
    assert timeline.heard_text(cut) == "In 200 m, turn left"  # a cleared utterance: its words
    assert timeline.heard_text(cut + WORD) == "In 200 m, turn left Rerouting"
    assert timeline.heard_text(cut + 3 * WORD) == "In 200 m, turn left Rerouting. Turn right."
    assert timeline.heard_text(cut + 2 * WORD, since=turn_start) == "Rerouting. Turn"
    assert [m.name for m in timeline.marks] == ["turn-2"]


def test_heard_text_without_tracking_reads_the_text_the_server_echoed() -> None:
    timeline = Timeline()
    first, end = utterance(TEXT, FIRST, index=0, start_sample=0)
    timeline.observe(first)
    # Words only (the utterance has not ended): what lies between them is not known.
    assert timeline.heard_text(5 * WORD) == "In 200 m turn"
    timeline.observe(end)  # its source_text is the utterance's own text, punctuation included
    assert timeline.heard_text(5 * WORD) == "In 200 m, turn"


def test_a_batch_sent_again_replaces_the_same_words() -> None:
    timeline = Timeline(TEXT)
    timings, end = utterance(TEXT, FIRST, index=0, start_sample=0)
    timeline.observe(WordTimingsEvent(0, timings.words[:2], timings.source))
    timeline.observe(WordTimingsEvent(0, timings.words[1:], timings.source))
    timeline.observe(WordTimingsEvent(0, timings.words[:3], timings.source))
    assert timeline.utterances[0].ordered_words() == list(timings.words)
    assert timeline.timing_source == "TIMING_ESTIMATE"


def test_the_rate_of_the_audio_converts_seconds() -> None:
    from chattts_client import AudioChunkEvent

    timeline = Timeline(TEXT)
    timeline.observe(AudioChunkEvent(b"", 0, 0, 0, 48000, "OGG_OPUS"))
    assert timeline.sample_rate_hz == 48000 and timeline.to_samples(None, 0.5) == 24000
