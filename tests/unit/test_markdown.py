"""The text front end for LLM output, without the model: markdown read as a person would
(text/markdown.py), links and symbols (readable.py, symbols.py), and the property that matters
for token streams: any split of a reply into fragments reads exactly as the reply sent whole."""

from __future__ import annotations

import logging
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chattts_server.text.markdown import MarkdownReader, strip_markdown
from chattts_server.text.normalize import TextNormalizer
from chattts_server.text.readable import readable
from chattts_server.text.release import ReleasePolicy
from chattts_server.text.stream import SENTENCE_END_GRACE_MS, StreamText, utterances
from chattts_server.text.symbols import speakable
from llm_replies import REPLIES, tokens


@pytest.fixture(scope="module")
def normalize() -> TextNormalizer:
    return TextNormalizer()


def streamed(fragments: list[str], policy: ReleasePolicy | None = None) -> list[str]:
    text = StreamText(policy or ReleasePolicy())
    out: list[str] = []
    for fragment in fragments:
        out += text.feed(fragment)
    return out + text.flush()


@pytest.mark.parametrize(
    "markdown, read",
    [
        ("**Step 1:** Open the *Wi-Fi* settings", "Step 1: Open the Wi-Fi settings"),
        ("## Summary ##", "Summary."),
        ("1. First item\n2) Second item.", "First item.\nSecond item."),
        ("- one\n  * nested\n+ three", "one.\nnested.\nthree."),
        ("> quoted **bold** text", "quoted bold text"),
        ("See [the docs](https://x.org/a) and ![a cat](cat.png).", "See the docs and a cat."),
        ("Run `pip install x` now", "Run pip install x now"),
        ("a\n\n---\n\nb", "a\n\n\n\nb"),
        ("| a | b |\n|---|:-:|\n| 1 | 2 |", "a, b.\n\n1, 2."),
        ("before\n```python\nprint('x')\n```\nafter", "before\n\n\n\nafter"),
        ("~~old~~ new, snake_case_name, 5 * 3", "old new, snake_case_name, 5 * 3"),
        ("**重要**提示：请打开设置", "重要提示：请打开设置"),
        ("- 第一项\n- 第二项", "第一项。\n第二项。"),
    ],
)
def test_markdown_is_read_as_its_words(markdown: str, read: str) -> None:
    assert strip_markdown(markdown) == read


def test_a_marker_split_over_tokens_is_held_until_it_is_known() -> None:
    reader = MarkdownReader()
    assert reader.feed("**") == ""
    assert reader.feed("Step") == ""
    assert reader.feed(" 1") == ""  # still inside the strong run
    assert reader.feed(":**") == ""  # closed, but ":**" may be followed by more markers
    assert reader.feed(" Open") == "Step 1: "
    assert reader.feed(" the\n") == "Open the\n"


def test_a_list_item_arriving_in_pieces_reads_its_words_not_its_number() -> None:
    reader = MarkdownReader()
    out = "".join(reader.feed(t) for t in ["1", ".", " Turn", " left", "\n", "2", ". Exit\n"])
    assert out == "Turn left.\nExit.\n"


def test_an_unclosed_marker_holds_back_a_bounded_amount() -> None:
    reader = MarkdownReader()
    out = reader.feed("*" + "word " * 60)  # 300 characters, never closed
    assert "word" in out and len(out) > 100


def test_a_sentence_end_at_a_fragment_end_is_released_after_a_short_quiet() -> None:
    text = StreamText(ReleasePolicy(idle_ms=600))
    assert text.feed("Turn left.") == []  # may yet be "left.md"
    assert text.quiet_deadline_ms() == SENTENCE_END_GRACE_MS
    assert text.on_quiet(SENTENCE_END_GRACE_MS) == ["Turn left."]
    # A new sentence in the next fragment releases it at once; a continuation joins it.
    assert text.feed("Then exit.") == []
    assert text.feed("Now") == ["Then exit."]
    assert streamed(["Visit example.", "com/docs."]) == ["Visit example.com/docs."]


@pytest.mark.parametrize(
    "fragments",
    [[" "], ["\n", "\n\n", "\t", " "], [""], ["", " ", "\n"], ["🎉", " ", "\n"]],
)
def test_whitespace_and_empty_fragments_are_no_utterance(fragments: list[str]) -> None:
    assert streamed(fragments) == []


def test_spaces_tabs_and_newlines_between_fragments_separate_words_and_sentences() -> None:
    got = streamed(["Hello", " ", "world", "\t", "again", "\n", "New", " ", "line"])
    assert got == ["Hello world again", "New line"]


def test_plain_text_keeps_every_character() -> None:
    text = StreamText(ReleasePolicy(), markdown=False)
    assert text.feed("Use *this* and **that**.") + text.flush() == ["Use *this* and **that**."]
    assert utterances("**a** b.", 10.0, 5, markdown=False) == ["**a** b."]


@pytest.mark.parametrize(
    "text, lang, read",
    [
        ("Go to https://www.example.com/docs?x=1.", "en", "Go to example dot com slash docs ."),
        ("mail name.last@example.co.uk", "en", "mail name dot last at example dot co dot uk"),
        ("open src/main.py and notes.txt", "en", "open src slash main dot py and notes dot txt"),
        ("ask @alice_b on example.org", "en", "ask at alice underscore b on example dot org"),
        ("#launch day", "en", "hashtag launch day"),
        ("看 https://example.cn/a 吧", "zh", "看 example 点 cn 斜杠 a 吧"),
    ],
)
def test_links_addresses_files_and_handles_are_read_as_said(
    text: str, lang: str, read: str
) -> None:
    assert " ".join(readable(text, lang).split()) == read  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "text, lang, said",
    [
        ("Ready? Yes: done; ok… (really) — fine!", "en", "Ready. Yes, done. ok. really, fine."),
        ("Wi-Fi and/or café “quoted”", "en", "Wi Fi and or cafe quoted"),
        ("好的！真的吗？是：对；（好）", "zh", "好的。真的吗。是，对。好，"),
    ],
)
def test_unsayable_punctuation_becomes_the_break_it_marks(text: str, lang: str, said: str) -> None:
    assert speakable(text, lang) == said  # type: ignore[arg-type]


def test_no_warning_from_chattts_for_symbols_and_emoji(
    normalize: TextNormalizer, caplog: pytest.LogCaptureFixture
) -> None:
    from importlib import resources

    from ChatTTS.norm import Normalizer

    upstream = Normalizer(
        str(resources.files("ChatTTS").joinpath("res", "homophones_map.json")),
        logging.getLogger("upstream-normalizer"),
    )
    caplog.set_level(logging.DEBUG)
    for reply in REPLIES:
        for utterance in utterances(reply.text, 30.0, 5):
            spoken = normalize(utterance)
            upstream(spoken, True, True)
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert warnings == []


def spoken_words(normalize: TextNormalizer, utterance_list: list[str]) -> list[str]:
    """The words spoken, a CJK character counting as a word (utterance borders may differ)."""
    spoken = " ".join(normalize(u) for u in utterance_list).lower()
    return re.findall(r"[\u4e00-\u9fff]|[^\W_]+", spoken)


@pytest.mark.parametrize("reply", REPLIES, ids=[r.name for r in REPLIES])
def test_each_reply_reads_its_words_and_no_markup(reply, normalize: TextNormalizer) -> None:
    said = " ".join(spoken_words(normalize, streamed(tokens(reply.text))))
    for words in reply.says:
        expected = " ".join(re.findall(r"[\u4e00-\u9fff]|[^\W_]+", words.lower()))
        assert expected in said, (words, said)
    for words in reply.never:
        assert words not in said, (words, said)


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_any_fragment_split_reads_as_the_reply_sent_whole(
    data: st.DataObject, normalize: TextNormalizer
) -> None:
    reply = data.draw(st.sampled_from(REPLIES), label="reply")
    text = reply.text
    cuts = sorted(data.draw(st.sets(st.integers(1, len(text) - 1), max_size=40), label="cuts"))
    fragments = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
    whole = spoken_words(normalize, streamed([text]))
    assert spoken_words(normalize, streamed(fragments)) == whole


@pytest.mark.parametrize("first", ["[", "(", "“", "!["])
def test_a_line_whose_first_token_holds_no_word_yet_is_not_taken_for_a_rule(first: str) -> None:
    reader = MarkdownReader()
    rest = {"[": "the docs](https://x.org/a) now", "![": "a cat](c.png) here"}.get(
        first, "see below) now"
    )
    assert reader.feed(first) == ""
    out = reader.feed(rest + "\n")
    assert out == strip_markdown(first + rest) + "\n" and re.search(r"[a-z]{3}", out)


def test_a_flush_before_any_text_on_a_line_keeps_the_line() -> None:
    # A mark or a flush with nothing buffered used to decide the empty line as a rule, and
    # the line's text that followed was skipped.
    reader = MarkdownReader()
    assert reader.flush() == ""
    assert reader.feed("Turn **left** now") + reader.flush() == "Turn left now"
    assert reader.feed("\n") + reader.flush() == "\n"
    assert reader.feed("  ") + reader.flush() == ""
    assert reader.feed("- then stop") + reader.end() == "then stop."
