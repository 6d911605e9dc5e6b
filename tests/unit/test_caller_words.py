"""`CallerWords`: a stream's word timings as the caller's own words, each once, with the
punctuation and space that follow them (what the LiveKit and Pipecat adapters hand their
frameworks)."""

from __future__ import annotations

from dataclasses import replace

from chattts_client.caller_words import CallerWords
from timed_words import RATE_HZ, utterance

WORD = 7200  # samples per spoken word in these utterances


def test_a_stretch_said_as_several_words_is_one_word_with_its_punctuation() -> None:
    text = "**Walk** 200 m, then turn. Done"
    words = [
        ("walk", "Walk"),
        ("two", "200 m"),
        ("hundred", "200 m"),
        ("meters", "200 m"),
        ("then", "then"),
        ("turn", "turn"),
    ]
    timings, _ = utterance(text, words, index=0, start_sample=0)
    got = CallerWords(lambda: text).take(timings)
    assert [w.text for w in got] == ["**Walk** ", "200 m, ", "then ", "turn. "]
    assert "".join(w.text for w in got) == text[: text.index("Done")]
    two_hundred = got[1]
    assert (two_hundred.start_sample, two_hundred.end_sample) == (WORD, 4 * WORD)
    assert two_hundred.end_s == 4 * WORD / RATE_HZ


def test_words_come_once_across_events_and_resent_words_are_skipped() -> None:
    text = "One two. Three four."
    first, _ = utterance(text, [("one", "One"), ("two", "two")], index=0, start_sample=0)
    second, _ = utterance(
        text,
        [("three", "Three"), ("four", "four")],
        index=1,
        start_sample=2 * WORD,
        search_from=8,
    )
    words = CallerWords(lambda: text)
    taken = [w.text for w in words.take(first)]
    assert words.take(first) == []  # the same timings again (e.g. repeated up to a cut)
    taken += [w.text for w in words.take(second)]
    assert taken == ["One ", "two. ", "Three ", "four."]


def test_chinese_characters_keep_their_punctuation_and_sourceless_words_are_skipped() -> None:
    text = "你好，世界。"
    timings, _ = utterance(
        text, [("你", "你"), ("好", "好"), ("世", "世"), ("界", "界")], index=0, start_sample=0
    )
    inserted = replace(timings.words[2], has_source=False, source_text="", text="嗯")
    timings = replace(timings, words=(*timings.words[:2], inserted, *timings.words[2:]))
    assert [w.text for w in CallerWords(lambda: text).take(timings)] == ["你", "好，", "世", "界。"]


def test_an_opening_mark_goes_with_the_next_word_a_closing_one_does_not() -> None:
    """After a clear, the text it dropped ends the gap before the next word: its final period
    is not that word's."""
    text = 'Dropped text. It was cut.Next, "quoted" words.'
    words = [("next", "Next"), ("quoted", "quoted"), ("words", "words")]
    timings, _ = utterance(text, words, index=0, start_sample=0, search_from=25)
    assert [w.text for w in CallerWords(lambda: text).take(timings)] == [
        "Next, ",
        '"quoted" ',
        "words.",
    ]
