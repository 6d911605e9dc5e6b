"""Sentence buffering of streamed text."""

from chattts_server.text_buffer import SentenceBuffer, split_sentences


def test_fragments_join_until_a_sentence_end():
    b = SentenceBuffer()
    assert b.feed("Turn le") == []
    assert b.feed("ft in 200 met") == []
    assert b.feed("ers. Then") == ["Turn left in 200 meters."]
    assert b.pending == " Then"
    assert b.flush() == ["Then"]
    assert b.flush() == []


def test_sentence_end_at_the_end_of_a_fragment_releases_it():
    b = SentenceBuffer()
    assert b.feed("Hello there!") == ["Hello there!"]
    assert b.feed("好的。然后") == ["好的。"]
    assert b.flush() == ["然后"]


def test_a_period_after_a_digit_waits_for_more_text():
    b = SentenceBuffer()
    assert b.feed("Pi is 3.") == []
    assert b.feed("14 roughly. ") == ["Pi is 3.14 roughly."]


def test_control_tokens_are_never_split_and_pass_through():
    assert split_sentences("Wait [uv_break] a moment [laugh]. Go [lbreak]") == [
        "Wait [uv_break] a moment [laugh].",
        "Go [lbreak]",
    ]


def test_newlines_end_sentences_and_whitespace_is_normalised():
    assert split_sentences("first line\nsecond   line\n\n") == ["first line", "second line"]


def test_over_long_text_is_cut_at_a_space_before_the_limit():
    b = SentenceBuffer(max_chars=20)
    out = b.feed("word " * 10)
    assert out and all(len(s) <= 20 for s in out)
    assert " ".join(out + b.flush()) == " ".join(["word"] * 10)


def test_long_cut_does_not_split_a_control_token():
    b = SentenceBuffer(max_chars=16)
    out = b.feed("aaaaaaaaaaaa[uv_break]bbbbbbbbbbbbbbbbb")
    assert all("[uv_br" not in s or "[uv_break]" in s for s in out)


def test_empty_and_whitespace_only_text_yield_nothing():
    assert split_sentences("   \n  ") == []
