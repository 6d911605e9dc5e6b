"""SSML in (text/ssml) as a stream: spans into the caller's document, the navigation prompts,
split invariance of streamed documents, and the timeline's stream items. No model, no server:
the elements, errors and limits are in test_ssml.py."""

from __future__ import annotations

import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chattts_server.errors import InvalidRequestError
from chattts_server.text.normalize import TextNormalizer
from chattts_server.text.release import ReleasePolicy
from chattts_server.text.ssml import Break, Item, MarkPart, SpeechItem, SsmlStream
from navigation_ssml import PROMPTS, TAG_WORDS
from ssml_items import items, readout


@pytest.fixture(scope="module")
def normalize() -> TextNormalizer:
    return TextNormalizer()


# -- spans into the caller's document -------------------------------------------------------


def test_spans_point_at_the_callers_words_in_code_points() -> None:
    doc = '<speak>Café <say-as interpret-as="characters">12B</say-as> &amp; Élan</speak>'
    (item,) = items(doc)
    assert isinstance(item, SpeechItem)
    words = {item.text.text[a:b]: item.text.span(a, b) for a, b in _word_ranges(item.text.text)}
    span = words["Café"]
    assert span is not None and doc[span[0] : span[1]] == "Café"
    span = words["two"]
    assert span is not None and doc[span[0] : span[1]] == "12B"
    span = words["Élan"]
    assert span is not None and doc[span[0] : span[1]] == "Élan"
    span = item.text.span(item.text.text.index("&"), item.text.text.index("&") + 1)
    assert span is not None and doc[span[0] : span[1]] == "&amp;"


def _word_ranges(text: str) -> list[tuple[int, int]]:
    return [(m.start(), m.end()) for m in re.finditer(r"\w+", text)]


def test_spans_of_a_stream_count_everything_sent_and_a_clear_starts_a_new_document() -> None:
    stream = SsmlStream(ReleasePolicy())
    first = "<speak>Turn left now. "
    stream.feed(first)
    stream.clear()
    second = "<speak>Keep right.</speak>"
    (item,) = stream.feed(second)
    assert isinstance(item, SpeechItem)
    span = item.text.span()
    assert span is not None and (first + second)[span[0] : span[1]] == "Keep right."
    assert stream.end() == []


# -- navigation prompts and streaming -------------------------------------------------------


@pytest.mark.parametrize("prompt", PROMPTS, ids=[p.name for p in PROMPTS])
def test_navigation_prompts_speak_their_words_breaks_and_marks(prompt, normalize) -> None:
    found = items(prompt.ssml)
    said = _said(normalize, found)
    for words in prompt.says:
        assert " ".join(_words(words)) in said, (words, said)
    for word in TAG_WORDS:
        assert not re.search(rf"\b{word}\b", said), (word, said)
    assert tuple(i.duration_s for i in found if isinstance(i, Break)) == prompt.breaks
    assert tuple(i.name for i in found if isinstance(i, MarkPart)) == prompt.marks


def _words(text: str) -> list[str]:
    return re.findall(r"[\u4e00-\u9fff]|[^\W_]+", text.lower())


def _said(normalize: TextNormalizer, found: list[Item]) -> str:
    return " ".join(
        w for i in found if isinstance(i, SpeechItem) for w in _words(normalize(i.text.text))
    )


def streamed(fragments: list[str]) -> list[Item]:
    stream = SsmlStream(ReleasePolicy())
    out: list[Item] = []
    for fragment in fragments:
        out += stream.feed(fragment)
    return out + stream.end()


def reading(normalize: TextNormalizer, found: list[Item]) -> list[object]:
    """What a listener gets: the spoken words with their speed, silences and marks in order
    (utterance borders may differ: the release policy starts a stream's speech early)."""
    out: list[object] = []
    for item in found:
        if isinstance(item, SpeechItem):
            out += [(w, item.speed) for w in _words(normalize(item.text.text))]
        else:
            out.append(item)
    return out


@settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_any_split_of_a_document_reads_as_the_document_sent_whole(
    data: st.DataObject, normalize: TextNormalizer
) -> None:
    prompt = data.draw(st.sampled_from(PROMPTS), label="prompt")
    doc = prompt.ssml
    cuts = sorted(data.draw(st.sets(st.integers(1, len(doc) - 1), max_size=40), label="cuts"))
    fragments = [doc[a:b] for a, b in zip([0, *cuts], [*cuts, len(doc)], strict=True)]
    whole = reading(normalize, items(doc))
    assert reading(normalize, streamed([doc])) == whole
    assert reading(normalize, streamed(fragments)) == whole


def test_a_stream_may_send_one_document_after_another() -> None:
    first, second = "<speak>Turn left.</speak>\n", '<speak><mark name="b"/>Keep right.</speak>'
    sent = first + second
    whole = streamed([sent])
    assert readout(whole) == [("Turn left.", 5), MarkPart("b"), ("Keep right.", 5)]
    assert readout(streamed([sent[:20], sent[20:31], sent[31:]])) == readout(whole)
    last = whole[-1]
    assert isinstance(last, SpeechItem)
    span = last.text.span()
    assert span is not None and sent[span[0] : span[1]] == "Keep right."
    assert streamed([]) == [] and streamed(["  \n"]) == []


def test_a_stream_speaks_each_sentence_as_soon_as_it_is_whole() -> None:
    stream = SsmlStream(ReleasePolicy())
    assert readout(stream.feed('<speak>Turn left.<break time="5')) == [("Turn left.", 5)]
    assert readout(stream.feed('00ms"/> Then keep <say-as interpret-as="digits">1')) == [Break(0.5)]
    assert readout(stream.feed("2</say-as> lanes.")) == [("Then keep one two lanes.", 5)]
    with pytest.raises(InvalidRequestError, match="no element found, inside <speak>"):
        stream.end()


def test_a_stream_cuts_only_where_the_document_does_not_where_a_fragment_ends() -> None:
    """The release policy's first-words rule would cut "Heavy traffic on I-405" before "NB."
    arrived, and "NB" would be read on its own."""
    doc = "<speak><p>Heavy traffic on I-405 NB.</p></speak>"
    cut = doc.index(" NB.") + 2
    assert readout(streamed([doc[:cut], doc[cut:]])) == [("Heavy traffic on I-405 NB.", 5)]


def test_flush_and_idle_release_buffered_text_but_not_an_open_tag() -> None:
    stream = SsmlStream(ReleasePolicy(idle_ms=600))
    assert stream.feed("<speak>Turn left <say-as interpret-as='digits'>4") == []
    assert stream.quiet_deadline_ms() == 600
    assert readout(stream.on_quiet(600)) == [("Turn left", 5)]
    assert stream.quiet_deadline_ms() is None
    assert readout(stream.feed("2</say-as></speak>")) == []
    assert readout(stream.end()) == [("four two", 5)]


# -- as the timeline's stream items (stream/ssml_text.py) --------------------------------------


def test_stream_items_carry_speed_silence_marks_and_the_callers_own_text() -> None:
    from chattts_server.stream.items import MarkAt, Silence, Speak
    from chattts_server.stream.ssml_text import SsmlText, ssml_stream_items

    doc = (
        '<speak>In <say-as interpret-as="cardinal">200</say-as> m, turn left.<break time="1s"/>'
        '<prosody rate="slow">Keep right.</prosody><mark name="kept"/></speak>'
    )
    whole = ssml_stream_items(doc, 30.0, 5, False, "text")
    assert [type(i) for i in whole] == [Speak, Silence, Speak, MarkAt]
    first, silence, second, mark = whole
    assert isinstance(first, Speak) and first.speed == 5
    assert first.source == 'In <say-as interpret-as="cardinal">200</say-as> m, turn left.'
    assert silence == Silence(1.0)
    assert isinstance(second, Speak) and (second.text.text, second.source) == ("Keep right.",) * 2
    assert second.speed == 3
    assert mark == MarkAt("kept")
    streamed = SsmlText(ReleasePolicy(), "text.text", False)
    out = [item for k in range(0, len(doc), 9) for item in streamed.feed(doc[k : k + 9])]
    out += streamed.end()
    assert [i.source if isinstance(i, Speak) else i for i in out] == [
        'In <say-as interpret-as="cardinal">200</say-as> m, turn left.',
        Silence(1.0),
        "Keep right.",
        MarkAt("kept"),
    ]
