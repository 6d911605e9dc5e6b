"""SSML's `<lexicon uri="NAME"/>` (text/ssml/elements.py) naming a server lexicon, read for its
whole document after the stream's lexicons (api/ssml_text.py), and `<lookup ref>` reading one
first for its text; unknown names and a misplaced element refused naming line and column; a
streamed document read the same in any split."""

from __future__ import annotations

import pytest

from chattts_server.errors import InvalidRequestError
from chattts_server.stream.items import Speak, StreamItem
from chattts_server.stream.ssml_text import SsmlText, ssml_stream_items
from chattts_server.text.lexicon import Lexicon, Lexicons
from chattts_server.text.lexicon_library import LexiconLibrary
from chattts_server.text.release import ReleasePolicy

NAV = Lexicon.build("nav", [("I-95", "Interstate ninety-five"), ("SFO", "San Francisco")])
BRANDS = Lexicon.build("brands", [("SFO", "the airport")])
LIBRARY = LexiconLibrary([NAV, BRANDS])
DOC = '<speak>\n  <lexicon uri="nav" xml:id="n"/>\n  Take I-95 to SFO.</speak>'


def whole(doc: str, lexicons: Lexicons | None = None) -> list[StreamItem]:
    return ssml_stream_items(doc, 30.0, 5, False, "text", lexicons, LIBRARY)


def said(items: list[StreamItem]) -> list[str]:
    return [i.text.text for i in items if isinstance(i, Speak)]


def test_a_named_server_lexicon_is_read_for_the_document() -> None:
    (speak,) = whole(DOC)
    assert isinstance(speak, Speak)
    assert speak.text.text == "Take Interstate ninety-five to San Francisco."
    at = speak.text.text.index("Interstate")
    span = speak.text.span(at, at + 22)
    assert span is not None and DOC[span[0] : span[1]] == "I-95"  # the caller's own grapheme
    assert speak.source == "Take I-95 to SFO."


def test_the_documents_lexicons_come_after_the_streams() -> None:
    doc = '<speak><lexicon uri="brands"/>Take I-95 to SFO.</speak>'
    assert said(whole(doc, Lexicons((NAV,)))) == ["Take Interstate ninety-five to the airport."]
    assert said(whole("<speak>Take I-95 to SFO.</speak>", Lexicons((NAV,)))) == [
        "Take Interstate ninety-five to San Francisco."
    ]


BOTH = '<speak><lexicon uri="nav" xml:id="n"/><lexicon uri="brands" xml:id="b"/>'


def test_a_lookup_reads_its_lexicon_first_for_the_text_inside() -> None:
    doc = BOTH + 'Fly to SFO, <lookup ref="n">not SFO, </lookup>and I-95.</speak>'
    items = whole(doc)
    assert said(items) == [
        "Fly to the airport,",
        "not San Francisco,",
        "and Interstate ninety-five.",
    ]
    inside = items[1]
    assert isinstance(inside, Speak)
    at = inside.text.text.index("San")
    span = inside.text.span(at, at + len("San Francisco"))
    assert span is not None and doc[span[0] : span[1]] == "SFO"  # the SFO inside the lookup


def test_the_innermost_lookup_wins() -> None:
    doc = BOTH + '<lookup ref="n">SFO <lookup ref="b">SFO</lookup> SFO.</lookup></speak>'
    assert said(whole(doc)) == ["San Francisco", "the airport", "San Francisco."]


@pytest.mark.parametrize(
    "doc, message",
    [
        (BOTH + "<lookup>Hi.</lookup></speak>", "<lookup> needs a ref attribute"),
        (
            BOTH + '<lookup ref="x">Hi.</lookup></speak>',
            '<lookup> ref="x" names no <lexicon xml:id> of the document (known: n, b)',
        ),
        (
            '<speak><lexicon uri="nav" xml:id="n"/><lexicon uri="brands" xml:id="n"/>Hi.</speak>',
            'column 39: <lexicon> xml:id="n" names another <lexicon> already',
        ),
        (
            BOTH + '<lookup ref="n">Hi.</lookup><lexicon uri="nav"/></speak>',
            "<lexicon> must come first in <speak>",
        ),
        (
            '<speak><lexicon uri="roads"/>Hi.</speak>',
            'SSML line 1, column 8: <lexicon> uri="roads" names no lexicon (known: nav, brands)',
        ),
        (
            '<speak>Hi.\n<lexicon uri="nav"/></speak>',
            "SSML line 2, column 1: <lexicon> must come first in <speak>",
        ),
        (
            '<speak><p><lexicon uri="nav"/>Hi.</p></speak>',
            "SSML line 1, column 11: <lexicon> must come first in <speak>",
        ),
        ("<speak><lexicon/>Hi.</speak>", "column 8: <lexicon> needs a uri attribute"),
    ],
)
def test_a_bad_lexicon_element_is_refused_naming_line_and_column(doc: str, message: str) -> None:
    with pytest.raises(InvalidRequestError) as info:
        whole(doc)
    assert info.value.field_name == "text" and message in info.value.description


def test_a_server_without_lexicons_says_how_to_load_one() -> None:
    with pytest.raises(InvalidRequestError, match="this server has no lexicons: .*--lexicon"):
        ssml_stream_items('<speak><lexicon uri="nav"/>Hi.</speak>', 30.0, 5, False, "text")


def test_a_streamed_document_reads_the_same_in_any_split_and_each_document_alone() -> None:
    lookup = BOTH + 'SFO, <lookup ref="n">SFO</lookup>.</speak>'
    sent = DOC + "\n<speak>Then I-95 again.</speak>" + lookup
    expected = [
        "Take Interstate ninety-five to San Francisco.",
        "Then I-95 again.",
        "the airport,",
        "San Francisco",
    ]
    assert said(whole(DOC)) + ["Then I-95 again."] + said(whole(lookup)) == expected
    for size in (1, 5, 17, len(sent)):
        stream = SsmlText(ReleasePolicy(), "text.text", False, None, LIBRARY)
        out = [i for k in range(0, len(sent), size) for i in stream.feed(sent[k : k + size])]
        assert said(out + stream.end()) == expected, size
