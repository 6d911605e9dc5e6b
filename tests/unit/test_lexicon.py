"""Pronunciation lexicons applied to text (text/lexicon.py): whole words, the longest first, Chinese
anywhere, case as written, never inside a link, each alias traced to the caller's grapheme, the
later lexicon winning for the same grapheme, and a cost that does not grow with the lexicon."""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import pytest

from chattts_server.text.lexicon import Lexicon, Lexicons, apply_lexicons
from chattts_server.text.normalize import TextNormalizer
from chattts_server.text.spans import Traced
from chattts_server.text.stream import utterances_traced

NAV = Lexicon.build(
    "nav",
    [
        ("I-95", "Interstate ninety-five"),
        ("Zhongguancun St", "Jong gwan tsun Street"),
        ("中关村", "中关村科技园"),
        ("New York", "the big apple"),
        ("New York City", "the city"),
        ("do", "DO"),
        ("US", "the United States"),
    ],
)


def read(text: str, *lexicons: Lexicon) -> str:
    return Lexicons(lexicons or (NAV,)).apply(Traced.source(text)).text


@pytest.mark.parametrize(
    "text, spoken",
    [
        ("Take I-95 north.", "Take Interstate ninety-five north."),
        ("(I-95)", "(Interstate ninety-five)"),
        ("I-95, then I-95.", "Interstate ninety-five, then Interstate ninety-five."),
        ("走I-95上", "走Interstate ninety-five上"),  # next to Chinese: still a word of its own
        ("I-955 XI-95 I-95th I-95_b", "I-955 XI-95 I-95th I-95_b"),  # inside longer words: kept
        ("done do undo", "done DO undo"),
        ("前方中关村大街右转", "前方中关村科技园大街右转"),  # Chinese: anywhere
        ("US us Us", "the United States us Us"),  # case as written
    ],
)
def test_whole_words_are_replaced_chinese_anywhere_case_as_written(text: str, spoken: str) -> None:
    assert read(text) == spoken


def test_the_longest_grapheme_wins_leftmost_first_without_overlap() -> None:
    assert read("New York City and New York") == "the city and the big apple"
    overlap = Lexicon.build("o", [("中关", "A"), ("关村", "B")])
    assert read("中关村", overlap) == "A村"  # the leftmost match, then on from its end


def test_a_space_in_a_grapheme_matches_any_run_of_whitespace() -> None:
    for gap in (" ", "   ", "\n", " \t "):
        text = f"Go to Zhongguancun{gap}St now"
        found = Lexicons((NAV,)).apply(Traced.source(text))
        assert found.text == "Go to Jong gwan tsun Street now"
        start = found.text.index("Jong")
        assert found.span(start, start + len("Jong gwan tsun Street")) == (6, 20 + len(gap))
    assert read("Zhongguancun  Street") == "Zhongguancun  Street"  # "St" must end a word


def test_the_alias_is_traced_to_the_callers_grapheme() -> None:
    text = Traced.source("Take I-95 north", offset=100)
    out = Lexicons((NAV,)).apply(text)
    alias = out.text.index("Interstate")
    assert {out.span(k, k + 1) for k in range(alias, alias + 22)} == {(105, 109)}
    assert out.span(0, 4) == (100, 104) and out.span(len(out) - 5) == (110, 115)
    # Through markdown first: the spans still point at the caller's "I-95", markup excluded.
    (utterance,) = utterances_traced("Take **I-95** north.", 30.0, 5)
    out = Lexicons((NAV,)).apply(utterance)
    assert out.text == "Take Interstate ninety-five north."
    assert out.span(5, 27) == (7, 11)


def test_nothing_found_is_the_same_text() -> None:
    text = Traced.source("Turn left in 200 m.")
    assert Lexicons((NAV,)).apply(text) is text
    assert apply_lexicons(None, text) is text and apply_lexicons(Lexicons(()), text) is text


@pytest.mark.parametrize(
    "text",
    [
        "See https://I-95.example.com/closures now",
        "See www.I-95.org/map now",
        "See I-95.example.com now",
        "Write to I-95@example.com now",
        "Open I-95.md now",
        "Open notes/I-95/README.md now",
    ],
)
def test_never_inside_a_link_address_or_file_name(text: str) -> None:
    assert read(text) == text
    assert read(f"{text} and I-95.") == f"{text} and Interstate ninety-five."


def test_a_markdown_link_target_is_gone_before_the_lexicon() -> None:
    (utterance,) = utterances_traced("See [docs](https://I-95.example.com) for I-95.", 30.0, 5)
    out = Lexicons((NAV,)).apply(utterance).text
    assert out == "See docs for Interstate ninety-five."


def test_applied_before_numbers_are_spelled_out() -> None:
    """The normalizer reads "I-95" as "I ninety five"; the lexicon's alias comes first."""
    normalize = TextNormalizer()
    assert "ninety five" in normalize("Take I-95 north.")
    spoken = normalize.traced(Lexicons((NAV,)).apply(Traced.source("Take I-95 north.")))
    assert "Interstate ninety" in spoken.text
    at = spoken.text.index("Interstate")
    assert spoken.span(at, at + 10) == (5, 9)  # still the caller's "I-95"


def test_the_later_lexicon_wins_for_the_same_grapheme_the_longest_still_first() -> None:
    brands = Lexicon.build("brands", [("I-95", "the ninety-five"), ("New", "nu")])
    assert read("I-95", NAV, brands) == "the ninety-five"
    assert read("I-95", brands, NAV) == "Interstate ninety-five"
    assert read("New York", NAV, brands) == "the big apple"  # longer, from the earlier one
    merged = Lexicon.merge("server", [NAV, brands])
    assert read("I-95 New York do", merged) == "the ninety-five the big apple DO"
    assert merged.num_graphemes == NAV.num_graphemes + 1


def test_the_first_entry_of_a_grapheme_wins_within_a_lexicon() -> None:
    lexicon = Lexicon.build("x", [("SFO", "first"), (" SFO ", "second"), ("", "none")])
    assert read("SFO", lexicon) == "first" and lexicon.num_graphemes == 1


class _CountingKeys(Mapping[str, str]):
    """A lexicon's keys that count their lookups."""

    def __init__(self, keys: Mapping[str, str]) -> None:
        self.keys, self.lookups = keys, 0

    def __getitem__(self, key: str) -> str:
        self.lookups += 1
        return self.keys[key]

    def get(self, key: str, default: object = None):  # type: ignore[override]
        self.lookups += 1
        return self.keys.get(key, default)

    def __iter__(self) -> Iterator[str]:
        return iter(self.keys)

    def __len__(self) -> int:
        return len(self.keys)


def _lookups(num_graphemes: int, text: str) -> int:
    words = [f"{a}{b}{c}" for a in "abcdefghij" for b in "klmnopqrst" for c in "uvwxyz"] * 9
    entries = [(f"{w}{k}", "x") for k, w in enumerate(words[:num_graphemes])]
    lexicon = Lexicon.build("n", [("I-95", "Interstate"), *entries])
    counting = _CountingKeys(lexicon.keys)
    Lexicons((Lexicon(lexicon.name, counting, lexicon.first_chars, 12, 1),)).apply(
        Traced.source(text)
    )
    return counting.lookups


def test_the_lookups_per_text_do_not_grow_with_the_lexicon() -> None:
    text = "Take I-95 north toward the bridge, then keep right at the fork for two miles. " * 3
    small, large = _lookups(10, text), _lookups(5000, text)
    assert large <= 2 * len(text)  # a few per place a grapheme could start, never per lexeme
    assert large <= 3 * small
