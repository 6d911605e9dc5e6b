"""The text release policy of StreamingSynthesize, as plain calls (no clock, no server)."""

from __future__ import annotations

from chattts_server.text.duration import estimate_duration_s, max_segment_s
from chattts_server.text.release import ReleasePolicy, TextReleaser, count_words, split_sentences

# Sentence ends only: the behaviour before the policy had clause and word rules.
SENTENCES_ONLY = ReleasePolicy(clause_min_words=0, max_words=0, first_words=0)


def test_fragments_join_until_a_sentence_end():
    b = TextReleaser(SENTENCES_ONLY)
    assert b.feed("Turn le") == []
    assert b.feed("ft in 200 met") == []
    assert b.feed("ers. Then") == ["Turn left in 200 meters."]
    assert b.pending == " Then"
    assert b.flush() == ["Then"]
    assert b.flush() == []


def test_sentence_end_at_the_end_of_a_fragment_releases_it():
    b = TextReleaser()
    assert b.feed("Hello there!") == ["Hello there!"]
    assert b.feed("好的。然后") == ["好的。"]
    assert b.flush() == ["然后"]


def test_a_period_after_a_digit_waits_for_more_text():
    b = TextReleaser()
    assert b.feed("Pi is 3.") == []
    assert b.feed("14 roughly. ") == ["Pi is 3.14 roughly."]


def test_a_title_before_a_name_is_no_sentence_end_and_waits_at_the_end_of_the_buffer():
    b = TextReleaser(SENTENCES_ONLY)
    assert b.feed("Continue toward St.") == []
    assert b.feed(" Louis. Dr. Lee is on Main St. Then") == [
        "Continue toward St. Louis.",
    ]
    assert b.flush() == ["Dr. Lee is on Main St. Then"]
    assert split_sentences("Exit at Elm St. now.") == ["Exit at Elm St. now."]
    assert split_sentences("Stop at Elm St.") == ["Stop at Elm St."]


def test_control_tokens_are_never_split_and_pass_through():
    assert split_sentences("Wait [uv_break] a moment [laugh]. Go [lbreak]") == [
        "Wait [uv_break] a moment [laugh].",
        "Go [lbreak]",
    ]


def test_newlines_end_sentences_and_whitespace_is_normalised():
    assert split_sentences("first line\nsecond   line\n\n") == ["first line", "second line"]


def test_empty_and_whitespace_only_text_yield_nothing():
    assert split_sentences("   \n  ") == []


def test_caption_words_without_punctuation_are_released_as_they_come():
    policy = ReleasePolicy(first_words=4, max_words=10)
    b = TextReleaser(policy)
    released: list[tuple[int, str]] = []
    for i in range(30):
        for utterance in b.feed(f"w{i} "):
            released.append((i, utterance))
    # The first utterance once its 4th word is complete, then every 10 words.
    assert released[0] == (3, "w0 w1 w2 w3")
    assert [count_words(u) for _, u in released] == [4, 10, 10]
    assert b.flush() == ["w24 w25 w26 w27 w28 w29"]


def test_a_word_at_the_end_of_the_buffer_is_not_cut():
    b = TextReleaser(ReleasePolicy(first_words=2))
    assert b.feed("Hel") == []
    assert b.feed("lo wor") == []  # "wor" may still grow
    assert b.feed("ld again") == ["Hello world"]


def test_the_first_utterance_may_end_at_any_clause():
    b = TextReleaser(ReleasePolicy(clause_min_words=6))
    assert b.feed("Sure, here is") == ["Sure,"]
    # Later clauses need clause_min_words words.
    assert b.feed(" what you asked, and") == []
    assert b.feed(" a bit more, then") == ["here is what you asked, and a bit more,"]


def test_commas_and_colons_inside_numbers_are_no_boundaries():
    b = TextReleaser(ReleasePolicy(clause_min_words=1, max_words=0, first_words=0))
    assert b.feed("about 1,000 people at 10:30 today") == []
    assert b.feed(", then") == ["about 1,000 people at 10:30 today,"]


def test_word_limit_prefers_a_clause_in_its_second_half():
    b = TextReleaser(ReleasePolicy(first_words=0, clause_min_words=0, max_words=8))
    out = b.feed("one two three four five, six seven eight nine ten ")
    assert out == ["one two three four five,"]


def test_cjk_characters_count_as_words():
    b = TextReleaser(ReleasePolicy(first_words=4))
    assert b.feed("前方两") == []
    assert b.feed("百米右转") == ["前方两百"]
    assert count_words("前方 [uv_break] ok") == 3


def test_clear_drops_buffered_text_and_restarts_the_first_rule():
    b = TextReleaser(ReleasePolicy(first_words=3))
    assert b.feed("a b c d ") == ["a b c"]
    b.feed("e f")
    b.clear()
    assert b.pending == ""
    assert b.feed("x y z w") == ["x y z"]


def test_idle_pending_says_when_a_timer_should_fire():
    b = TextReleaser(ReleasePolicy(idle_ms=500))
    assert not b.idle_pending
    b.feed("half a sen")
    assert b.idle_pending
    assert b.flush() == ["half a sen"]
    assert not TextReleaser(ReleasePolicy(idle_ms=0, first_words=0)).idle_pending


def test_long_sentences_are_cut_to_fit_the_token_cap_at_clauses():
    sentence = (
        "Turn left in two hundred meters, then keep right for one point five kilometers, "
        "take exit twelve B onto the M twenty five toward London, and continue to junction nine."
    )
    budget_s = max_segment_s(384)
    pieces = split_sentences(sentence, budget_s)
    assert len(pieces) > 1
    assert all(estimate_duration_s(p) <= budget_s for p in pieces)
    assert all(p.endswith((",", ".")) for p in pieces)  # every cut at a clause stop
    assert " ".join(pieces) == sentence


def test_a_clause_over_the_budget_is_cut_between_words_and_chinese_between_characters():
    budget_s = 3.0
    english = split_sentences(
        "and continue for thirty miles until you reach the services.", budget_s
    )
    assert len(english) == 2 and all(estimate_duration_s(p) <= budget_s for p in english)
    chinese = split_sentences("前方两百米右转然后沿沈海高速行驶三十五公里在十二B出口离开", budget_s)
    assert len(chinese) > 1 and all(estimate_duration_s(p) <= budget_s for p in chinese)
    assert "".join(chinese) == "前方两百米右转然后沿沈海高速行驶三十五公里在十二B出口离开"


def test_a_streamed_buffer_past_the_budget_is_cut_even_with_every_rule_off():
    b = TextReleaser(ReleasePolicy(0, 0, 0, 0, max_segment_s=3.0))
    out = b.feed("word " * 40)
    assert out and all(estimate_duration_s(p) <= 3.0 for p in out)
    assert " ".join(out + b.flush()).split() == ["word"] * 40


def test_policy_bounds():
    import pytest

    with pytest.raises(ValueError, match="idle_ms"):
        ReleasePolicy(idle_ms=-1).check()
    with pytest.raises(ValueError, match="max_words"):
        ReleasePolicy(max_words=1000).check()
    ReleasePolicy().check()


def test_a_piece_and_its_prompt_fit_the_positions_sized_from_the_estimate():
    """What the lead sizes defaults with: cap + prompt of the longest piece fit a slot."""
    from chattts_server.text.duration import max_prompt_tokens

    cap = 384
    budget_s = max_segment_s(cap)
    longest = split_sentences("短" * 200, budget_s)[0]
    assert len(longest) + 8 <= max_prompt_tokens(budget_s)
    english = split_sentences("a " * 300, budget_s)[0]
    assert len(english.split()) + 8 <= max_prompt_tokens(budget_s)


def test_default_slot_positions_fit_the_longest_piece_with_a_10_s_reference_voice():
    from chattts_server.api.voices import MAX_REFERENCE_S
    from chattts_server.config import EngineConfig
    from chattts_server.text.duration import slot_tokens_needed

    engine = EngineConfig()
    needed = slot_tokens_needed(engine.max_new_tokens, MAX_REFERENCE_S)
    assert needed > engine.max_new_tokens + MAX_REFERENCE_S * 46
    assert engine.max_tokens >= needed
