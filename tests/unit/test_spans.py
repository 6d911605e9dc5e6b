"""Word spans in the caller's own text, without the model (text/spans.py, text/words.py): through
markdown, the release policy, our normalization, WeTextProcessing and ChatTTS's own normalizer,
"500元" keeps its span while it is spoken as 五百元, markup is in no span, and any split of a
text into fragments gives the spans of the text sent whole."""

from __future__ import annotations

import logging
import re
from importlib import resources

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chattts_server.text import readable, rules_en, rules_zh, symbols
from chattts_server.text.normalize import TextNormalizer
from chattts_server.text.release import ReleasePolicy, TextReleaser
from chattts_server.text.spans import SpanMap, Traced, align, utf16_offset
from chattts_server.text.stream import StreamText, Utterance, utterances_traced
from chattts_server.text.words import SpokenWord, spoken_words
from llm_replies import REPLIES, tokens


@pytest.fixture(scope="module")
def normalize() -> TextNormalizer:
    return TextNormalizer()


@pytest.fixture(scope="module")
def chattts_normalizer():
    from ChatTTS.norm import Normalizer

    homophones = resources.files("ChatTTS").joinpath("res", "homophones_map.json")
    return Normalizer(str(homophones), logging.getLogger("upstream-normalizer"))


def spoken(
    utterances: list[Utterance], normalize: TextNormalizer, chattts_normalizer
) -> list[list[SpokenWord]]:
    """Each utterance's spoken words, as the engine would speak them (PromptBuilder's path)."""
    return [spoken_words(normalize.spoken(u, chattts_normalizer)) for u in utterances]


def streamed(fragments: list[str], policy: ReleasePolicy | None = None) -> list[Utterance]:
    text = StreamText(policy or ReleasePolicy())
    out: list[Utterance] = []
    for fragment in fragments:
        out += text.feed_traced(fragment)
    return out + text.flush_traced()


def read_as(source: str, words: list[SpokenWord]) -> list[tuple[str, str | None]]:
    """(spoken word, the caller's text it spans)."""
    return [(w.text, None if w.span is None else source[w.span[0] : w.span[1]]) for w in words]


# -- the span map -------------------------------------------------------------------------


def test_a_span_map_composes_slices_and_shifts() -> None:
    inner = SpanMap.identity(5, offset=10)  # a middle text that is source[10:15]
    outer = SpanMap(((0, 2), (0, 2), None, (4, 5)))
    assert outer.compose(inner).ranges == ((10, 12), (10, 12), None, (14, 15))
    assert outer[1:3].ranges == ((0, 2), None)
    assert outer.shift(7).span() == (7, 12)
    assert SpanMap.run(3, None).span() is None


def test_the_aligner_maps_changed_runs_to_what_they_replaced() -> None:
    source, derived = "in 200 m turn", "in two hundred meters turn"
    spans = align(source, derived)
    start = derived.index("two")
    assert spans.span(start, start + len("two hundred meters")) == (3, 8)
    assert spans.span(0, 2) == (0, 2)
    assert spans.span(len(derived) - 4) == (9, 13)
    assert align("a b", "a X b").span(2, 3) is None  # inserted: from no caller text


def test_a_substitution_traces_each_replacement_to_its_match() -> None:
    traced = Traced.source("x", offset=0) + Traced.source(" pay $5 & go", offset=100)
    out = traced.sub(rules_en._CURRENCY, rules_en._currency).sub(re.compile(r"\s?&\s?"), " and ")
    assert out.text == "x pay five dollars and go"
    assert out.span(6, 18) == (105, 107)  # "five dollars" <- "$5"
    assert out.span(19, 22) == (108, 109)  # "and" <- "&", not its spaces


PATTERNS = [p for p, _ in rules_en.RULES + rules_zh.RULES] + [
    readable._URL,
    readable._DOMAIN,
    symbols._INSIDE_WORD,
    *(p for p, _ in symbols._RUNS["en"] + symbols._RUNS["zh"]),
]


@settings(max_examples=150, deadline=None)
@given(
    text=st.lists(
        st.sampled_from([*"ab 12.,:-$元m/&x@#。，\n\t", "km", "PM", "I-", "http://"]), max_size=30
    ).map("".join),
    index=st.integers(0, len(PATTERNS) - 1),
)
def test_a_traced_substitution_gives_exactly_re_sub_s_text(text: str, index: int) -> None:
    pattern = PATTERNS[index]
    traced = Traced.source(text).sub(pattern, "<\\g<0>>")
    assert traced.text == pattern.sub("<\\g<0>>", text)
    assert len(traced.spans) == len(traced.text)


def test_utf16_offsets_count_astral_characters_twice() -> None:
    text = "a🙂b"
    assert utf16_offset(text, 2) == 3
    assert text[2] == "b"


# -- spoken words and their spans ------------------------------------------------------------

CASES = [
    (
        "In 200 m turn left.",
        [("In", "In"), ("two hundred meters", "200 m"), ("turn", "turn"), ("left", "left")],
    ),
    (
        "前方500元右转",
        [("前", "前"), ("方", "方"), ("五百元", "500元"), ("右", "右"), ("转", "转")],
    ),
    (
        "Meet at 3:45 PM today.",
        [("Meet", "Meet"), ("at", "at"), ("three forty five p m", "3:45 PM"), ("today", "today")],
    ),
    (
        "Take the I-95 north.",
        [("Take", "Take"), ("the", "the"), ("I ninety five", "I-95"), ("north", "north")],
    ),
    ("It costs $4.50.", [("It", "It"), ("costs", "costs"), ("four dollars fifty", "$4.50")]),
    (
        "**Step 1:** Open the *Wi-Fi* settings.",
        [
            ("Step", "Step"),
            ("one", "1"),
            ("Open", "Open"),
            ("the", "the"),
            ("Wi", "Wi"),
            ("Fi", "Fi"),
            ("settings", "settings"),
        ],
    ),
    (
        "Read [the docs](https://example.com/docs) or https://example.com/a now.",
        [
            ("Read", "Read"),
            ("the", "the"),
            ("docs", "docs"),
            ("or", "or"),
            ("example dot com slash a", "https://example.com/a"),
            ("now", "now"),
        ],
    ),
    (
        "请访问 https://example.com/docs 查看详情",
        [
            ("请", "请"),
            ("访", "访"),
            ("问", "问"),
            ("example 点 com 斜杠 docs", "https://example.com/docs"),
            ("查", "查"),
            ("看", "看"),
            ("详", "详"),
            ("情", "情"),
        ],
    ),
    (
        "1. Turn left.\n2. Continue for 200 m\n- Exit",
        [
            ("Turn", "Turn"),
            ("left", "left"),
            ("Continue", "Continue"),
            ("for", "for"),
            ("two hundred meters", "200 m"),
            ("Exit", "Exit"),
        ],
    ),
    ("Wait [uv_break] here!", [("Wait", "Wait"), ("here", "here")]),
]


@pytest.mark.parametrize("text, expected", CASES, ids=[c[0][:24] for c in CASES])
def test_each_spoken_word_spans_the_word_or_number_it_came_from(
    text: str, expected: list[tuple[str, str]], normalize: TextNormalizer, chattts_normalizer
) -> None:
    whole = utterances_traced(text, 30.0, 5)
    words = [w for u in spoken(whole, normalize, chattts_normalizer) for w in u]
    assert read_as(text, words) == expected
    # Token by token, as an LLM streams it: the same words, the same spans.
    by_token = [w for u in spoken(streamed(tokens(text)), normalize, chattts_normalizer) for w in u]
    assert read_as(text, by_token) == expected


def test_markup_list_numbers_and_added_periods_are_in_no_span() -> None:
    text = "## Your *route*\n\n1. Turn **left**\n2. Exit `now`"
    covered = {
        i for u in utterances_traced(text, 30.0, 5) for r in u.spans.ranges if r for i in range(*r)
    }
    assert {text[i] for i in covered} <= set("YourouteTnlftExitw ")
    assert not covered & {i for i, c in enumerate(text) if c in "#*`12."}


def spans_of(words: list[list[SpokenWord]]) -> list[tuple[str, tuple[int, int] | None]]:
    return [(w.text, w.span) for u in words for w in u]


@pytest.mark.parametrize("reply", REPLIES, ids=[r.name for r in REPLIES])
def test_spans_are_in_order_disjoint_and_inside_the_reply(
    reply, normalize: TextNormalizer, chattts_normalizer
) -> None:
    words = [
        w for u in spoken(streamed(tokens(reply.text)), normalize, chattts_normalizer) for w in u
    ]
    assert words
    spans = [w.span for w in words if w.span is not None]
    assert len(spans) == len(words)  # every word spoken comes from the reply
    for (a, b), (c, d) in zip(spans, spans[1:], strict=False):
        assert 0 <= a < b <= c < d <= len(reply.text)
    for word, (a, b) in zip(words, spans, strict=True):
        source = reply.text[a:b]
        # A word that is not spelled as written still comes from a word or a number.
        assert re.search(r"[^\W_]", source), (word, source)


# -- any split gives the spans of the whole ----------------------------------------------------

PIECES = [
    "200 m",
    "500元",
    "3:45 PM",
    "I-95",
    "$4.50",
    "**Step 1:**",
    "*Wi-Fi*",
    "[the docs](https://example.com/docs)",
    "https://example.com/a",
    "请访问",
    "查看详情",
    "Turn",
    "left.",
    "then",
    "`code`",
    "1. ",
    "- ",
    "## ",
    "，",
    "。",
    "🙂",
    "[uv_break]",
]


@st.composite
def texts_and_splits(draw: st.DrawFn) -> tuple[str, list[str]]:
    if draw(st.booleans(), label="reply"):
        text = draw(st.sampled_from(REPLIES), label="which").text
    else:
        parts = draw(
            st.lists(
                st.tuples(st.sampled_from(PIECES), st.sampled_from([" ", " ", "\n"])),
                min_size=1,
                max_size=14,
            )
        )
        text = "".join(p + sep for p, sep in parts)
    cuts = sorted(draw(st.sets(st.integers(1, max(1, len(text) - 1)), max_size=30), label="cuts"))
    bounds = [0, *(c for c in cuts if c < len(text)), len(text)]
    return text, [text[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]


SENTENCES_ONLY = ReleasePolicy(clause_min_words=0, max_words=0, first_words=0, idle_ms=0)
"""Utterances end at sentence ends only: the same utterances whatever the split, so the same
normalization (with the default policy a split may move an utterance border, "查看详情" then
"200 m left." reads the number in English, whole it is read in Chinese: other words)."""

_WORD = re.compile(r"[\u4e00-\u9fff]|[^\W_\u4e00-\u9fff]+")


def front_end_words(utterances: list[Utterance]) -> list[tuple[str, tuple[int, int] | None]]:
    """The words of the released utterances (before normalization) and their spans."""
    return [
        (m.group(), u.span(m.start(), m.end())) for u in utterances for m in _WORD.finditer(u.text)
    ]


SPLIT_SETTINGS = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@SPLIT_SETTINGS
@given(case=texts_and_splits())
def test_any_fragment_split_releases_the_words_and_spans_of_the_text_sent_whole(
    case: tuple[str, list[str]],
) -> None:
    text, fragments = case
    whole = front_end_words(streamed([text]))
    assert front_end_words(streamed(fragments)) == whole
    for word, span in whole:
        assert span is not None and text[span[0] : span[1]] == word


@SPLIT_SETTINGS
@given(case=texts_and_splits())
def test_any_fragment_split_speaks_the_words_and_spans_of_the_text_sent_whole(
    case: tuple[str, list[str]], normalize: TextNormalizer, chattts_normalizer
) -> None:
    text, fragments = case
    whole = spans_of(spoken(streamed([text], SENTENCES_ONLY), normalize, chattts_normalizer))
    split = spans_of(spoken(streamed(fragments, SENTENCES_ONLY), normalize, chattts_normalizer))
    assert split == whole
    for _, span in whole:
        assert span is None or 0 <= span[0] < span[1] <= len(text)


def test_spans_count_the_whole_stream_across_a_clear() -> None:
    text = StreamText(ReleasePolicy())
    sent = ["Never mind ", "this. ", "Turn left at ", "the café.\n"]
    text.feed_traced(sent[0])
    text.clear()
    out = [u for fragment in sent[1:] for u in text.feed_traced(fragment)] + text.flush_traced()
    stream = "".join(sent)
    assert [stream[slice(*u.span())] for u in out] == ["this.", "Turn left at the café."]


def test_the_releaser_s_string_api_is_its_traced_one() -> None:
    releaser = TextReleaser(ReleasePolicy(first_words=2))
    traced = TextReleaser(ReleasePolicy(first_words=2))
    for fragment in ["One two", " three four. ", "Five"]:
        assert releaser.feed(fragment) == [
            u.text for u in traced.feed_traced(Traced.source(fragment))
        ]
