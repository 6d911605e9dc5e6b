"""Captions from word timings, with no server: readable cues in the caller's own text, and files
that real readers take: webvtt-py, srt, and ffmpeg's WebVTT and SRT demuxers (through PyAV, and
the ffmpeg command where it is installed)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from chattts_client import (
    Cue,
    Timeline,
    UtteranceEndEvent,
    cues,
    to_srt,
    to_webvtt,
    write_subtitles,
)
from chattts_client.subtitles import MAX_CUE_CHARS, MAX_CUE_S, subtitle_format
from subtitle_files import demux_cues, read_cues
from timed_words import RATE_HZ, utterance

NAVIGATION = (
    "In 200 m, turn left onto Main Street. Then keep right at the fork, and after about "
    "three kilometers you will arrive at your destination on the left."
)


def _words_of(text: str) -> list[tuple[str, str]]:
    """Each whitespace-separated word, as spoken and as written (punctuation stripped)."""
    return [(w.strip(".,"), w.strip(".,")) for w in text.split() if w.strip(".,")]


def _navigation_timeline(word_samples: int = 7200) -> Timeline:
    timeline = Timeline(NAVIGATION)
    first_end = NAVIGATION.index("Then")
    first = [("In", "In"), ("two", "200 m"), ("hundred", "200 m"), ("meters", "200 m")]
    first += _words_of(NAVIGATION[NAVIGATION.index("turn") : first_end])
    events = utterance(NAVIGATION, first, index=0, start_sample=0, word_samples=word_samples)
    timeline.observe(events[0])
    timeline.observe(events[1])
    second = _words_of(NAVIGATION[first_end:])
    start = events[1].sample_offset + events[1].num_samples + RATE_HZ // 2
    for event in utterance(
        NAVIGATION,
        second,
        index=1,
        start_sample=start,
        search_from=first_end,
        word_samples=word_samples,
    ):
        timeline.observe(event)
    return timeline


def test_cues_are_the_callers_text_split_for_reading_within_utterances() -> None:
    timeline = _navigation_timeline()
    cue_list = cues(timeline)
    texts = [c.text for c in cue_list]
    assert texts[0].startswith("In 200 m, turn left")  # written as sent, not as spoken
    assert all(len(t) <= MAX_CUE_CHARS for t in texts), texts
    assert all(0 < c.end_s - c.start_s <= MAX_CUE_S for c in cue_list)
    # Every word shown once, in order, with its punctuation; no cue crosses the utterance end.
    assert " ".join(texts) == NAVIGATION
    assert "Main Street." in texts[[i for i, t in enumerate(texts) if "Street" in t][0]]
    assert any(t.endswith("Main Street.") for t in texts)
    assert all(b.start_s >= a.end_s for a, b in zip(cue_list, cue_list[1:], strict=False))
    # A cue ends at its last word's end and the next starts at its first word's start.
    words = timeline.utterances[0].ordered_words()
    assert cue_list[0].start_s == words[0].start_s


def test_slow_speech_is_cut_at_seven_seconds() -> None:
    cue_list = cues(_navigation_timeline(word_samples=RATE_HZ))  # one word a second
    assert len(cue_list) > 4
    assert all(c.end_s - c.start_s <= MAX_CUE_S for c in cue_list)
    assert " ".join(c.text for c in cue_list) == NAVIGATION


def test_markdown_and_links_show_as_read_and_chinese_runs_without_spaces() -> None:
    text = "**Step 1:** Open [the docs](https://example.com/docs) now. 前方500元，左转。"
    spoken = [("Step", "Step"), ("one", "1"), ("Open", "Open"), ("the", "the"), ("docs", "docs")]
    spoken += [("now", "now")]
    zh = [("五", "500元"), ("百", "500元"), ("元", "500元"), ("左", "左"), ("转", "转")]
    zh = [("前", "前"), ("方", "方"), *zh]
    timeline = Timeline(text)
    for event in utterance(text, spoken, index=0, start_sample=0):
        timeline.observe(event)
    for event in utterance(
        text, zh, index=1, start_sample=RATE_HZ * 3, search_from=text.index("前")
    ):
        timeline.observe(event)
    assert [c.text for c in cues(timeline)] == ["Step 1: Open the docs now.", "前方500元，左转。"]


def test_an_utterance_without_word_timing_is_one_cue() -> None:
    timeline = Timeline()
    timeline.observe(
        UtteranceEndEvent(
            0, "Hello there.", 1.5, 0.1, 0.2, 9, "eos", 0, 36000, "Hello there.", 0, 12
        )
    )
    # An old server: no offsets, no caller's text; the cue follows the one before.
    timeline.observe(UtteranceEndEvent(1, "Bye now.", 0.5, 0.1, 0.2, 9, "eos"))
    assert cues(timeline) == [Cue(0.0, 1.5, "Hello there."), Cue(1.5, 2.0, "Bye now.")]


def _check_against_cues(path: Path, cue_list: list[Cue]) -> None:
    """The file read back by the format's own library holds exactly these cues (to the ms)."""
    want = [(round(c.start_s, 3), round(c.end_s, 3), c.text) for c in cue_list]
    got = [(round(a, 3), round(b, 3), text) for a, b, text in read_cues(path)]
    assert got == want


@pytest.mark.parametrize("suffix", [".vtt", ".srt"])
def test_files_parse_with_their_libraries_and_ffmpeg(tmp_path, suffix) -> None:
    timeline = _navigation_timeline()
    cue_list = cues(timeline)
    cue_list.append(Cue(cue_list[-1].end_s + 0.5, cue_list[-1].end_s + 1.0, "Tom & Jerry <3 --> x"))
    path = tmp_path / f"out{suffix}"
    write_subtitles(path, cue_list)
    _check_against_cues(path, cue_list)
    want = [
        (round(c.start_s * 1000), round(c.end_s * 1000) - round(c.start_s * 1000)) for c in cue_list
    ]
    demuxed = demux_cues(path)
    assert [(start, duration) for start, duration, _ in demuxed] == want
    if suffix == ".srt":  # SRT carries the text as is (WebVTT's is escaped)
        assert [text for _, _, text in demuxed] == [c.text for c in cue_list]


@pytest.mark.skipif(
    shutil.which("ffmpeg") is None, reason="no ffmpeg command (apt-get install ffmpeg)"
)
def test_the_ffmpeg_command_converts_each_format_into_the_other(tmp_path) -> None:
    cue_list = cues(_navigation_timeline())
    for ours, theirs in ((".vtt", ".srt"), (".srt", ".vtt")):
        source, converted = tmp_path / f"ours{ours}", tmp_path / f"ffmpeg{theirs}"
        write_subtitles(source, cue_list)
        subprocess.run(
            ["ffmpeg", "-nostdin", "-v", "error", "-y", "-i", str(source), str(converted)],
            check=True,
            timeout=60,
        )
        # ffmpeg accepts a file it cannot read as zero cues, so compare what it wrote.
        _check_against_cues(converted, cue_list)
        if theirs == ".srt":  # ffmpeg's SRT from our WebVTT is our SRT, byte for byte
            assert converted.read_text(encoding="utf-8") == to_srt(cue_list)


def test_the_format_comes_from_the_extension() -> None:
    assert subtitle_format("a/b.VTT") == "vtt" and subtitle_format("x.srt") == "srt"
    with pytest.raises(ValueError, match=r"\.vtt \(WebVTT\) or \.srt"):
        subtitle_format("captions.txt")
    assert to_webvtt([]) == "WEBVTT\n\n" and to_srt([]) == ""
    # Each cue ends with a blank line, the last one too (as ffmpeg writes them).
    assert to_srt([Cue(0, 1, "a"), Cue(1, 2, "b")]).endswith("00:00:02,000\nb\n\n")
    # A cue of no length still ends after it starts, as both formats need.
    assert "00:00:01.000 --> 00:00:01.001" in to_webvtt([Cue(1.0, 1.0, "x")])


def test_a_cleared_utterance_shows_only_what_was_spoken() -> None:
    text = "In 200 m, turn left onto Main Street."
    words = [("In", "In"), ("two", "200 m"), ("hundred", "200 m"), ("meters", "200 m")]
    words += [
        ("turn", "turn"),
        ("left", "left"),
        ("onto", "onto"),
        ("Main", "Main"),
        ("Street", "Street"),
    ]
    timeline = Timeline(text)
    cut = 6 * 7200
    for event in utterance(
        text, words, index=0, start_sample=0, spoken_until=cut, finish_reason="cleared"
    ):
        timeline.observe(event)
    assert timeline.utterances[0].end.source_end == len(text)  # the utterance's whole text...
    assert [c.text for c in cues(timeline)] == ["In 200 m, turn left"]  # ...but not its words
