"""W3C PLS 1.0 lexicons read (text/pls.py): what is taken from a lexeme, and every refusal named
by line and column; `--lexicon` files (text/lexicon_library.py) named by file and line, too large
ones refused before they are read."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import pytest

from chattts_server.text.lexicon_library import LexiconFileError, LexiconLibrary, load_lexicon
from chattts_server.text.pls import (
    MAX_LEXEMES,
    MAX_PLS_BYTES,
    PLS_NAMESPACE,
    PlsEntry,
    PlsError,
    read_pls,
)

REPO = Path(__file__).resolve().parents[2]
HEAD = f'<lexicon version="1.0" xmlns="{PLS_NAMESPACE}" alphabet="ipa" xml:lang="en-US">'


def lexicon(*lexemes: str) -> str:
    """A PLS document: the root on line 1, each lexeme on a line of its own from line 2."""
    return "\n".join([HEAD, *lexemes, "</lexicon>"])


def lexeme(grapheme: str, alias: str) -> str:
    return f"<lexeme><grapheme>{grapheme}</grapheme><alias>{alias}</alias></lexeme>"


def refusal(document: str | bytes) -> PlsError:
    with pytest.raises(PlsError) as info:
        read_pls(document)
    return info.value


def refusal_and_peak(document: str) -> tuple[PlsError, int]:
    """The refusal, and the most memory reading took at once: what was done before it, which a
    slow machine does not change (an expansion or a parse takes megabytes)."""
    tracemalloc.start()
    try:
        return refusal(document), tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_each_grapheme_of_a_lexeme_is_read_as_its_alias() -> None:
    doc = lexicon(
        "<lexeme><grapheme>I-95</grapheme><grapheme>I 95</grapheme>"
        "<alias>Interstate ninety-five</alias></lexeme>",
        lexeme("中关村", "中关村科技园"),
    )
    assert read_pls(doc) == [
        PlsEntry("I-95", "Interstate ninety-five", 2),
        PlsEntry("I 95", "Interstate ninety-five", 2),
        PlsEntry("中关村", "中关村科技园", 3),
    ]


def test_the_preferred_alias_wins_else_the_first_and_phonemes_are_skipped() -> None:
    doc = lexicon(
        '<lexeme><grapheme>NYC</grapheme><phoneme prefer="true">ˈnu jɔrk</phoneme>'
        '<alias>New York City</alias><alias prefer="true">the city</alias></lexeme>',
        "<lexeme><grapheme>LA</grapheme><alias>Los Angeles</alias><alias>L A</alias>"
        "<example>I flew to LA.</example></lexeme>",
    )
    assert [(e.grapheme, e.alias) for e in read_pls(doc)] == [
        ("NYC", "the city"),
        ("LA", "Los Angeles"),
    ]


def test_whitespace_is_normalized_and_the_first_lexeme_of_a_grapheme_wins() -> None:
    doc = lexicon(
        lexeme("  Zhongguancun\n\t St ", " Jong gwan\n tsun  Street "),
        lexeme("Zhongguancun St", "not this one"),
    )
    assert [(e.grapheme, e.alias) for e in read_pls(doc)] == [
        ("Zhongguancun St", "Jong gwan tsun Street")
    ]


def test_meta_metadata_xml_lang_and_vendor_alphabets_are_accepted() -> None:
    doc = (
        f'<?xml version="1.0" encoding="UTF-8"?>\n<lexicon version="1.0" xmlns="{PLS_NAMESPACE}" '
        'alphabet="x-microsoft-ups"><meta name="author" content="nav team"/><metadata>'
        '<rdf:RDF xmlns:rdf="http://www.w3.org/1999/02/22-rdf-syntax-ns#"><rdf:x>any</rdf:x>'
        "</rdf:RDF></metadata>\n<!-- a comment -->" + lexeme("SFO", "San Francisco") + "</lexicon>"
    )
    assert read_pls(doc) == [PlsEntry("SFO", "San Francisco", 3)]
    for alphabet in ("ipa", "x-sampa", "x-microsoft-sapi", "x-cmu"):
        assert read_pls(HEAD.replace("ipa", alphabet) + "</lexicon>") == []


def test_bytes_are_read_in_their_declared_encoding_and_text_as_text() -> None:
    doc = '<?xml version="1.0" encoding="ISO-8859-1"?>\n' + lexicon(lexeme("café", "coffee"))
    assert read_pls(doc.encode("iso-8859-1")) == [PlsEntry("café", "coffee", 3)]
    assert read_pls(doc) == [PlsEntry("café", "coffee", 3)]  # inline: already text
    assert "not valid text" in refusal("\ud800").message


@pytest.mark.parametrize(
    "document, line, column, message",
    [
        ("no markup at all", 1, 1, "not XML: a PLS document is <lexicon>"),
        ("", 1, 1, "no root element"),
        (HEAD + "\n" + lexeme("a", "b"), 2, 56, "no element found, inside <lexicon>"),
        (HEAD + "\n<lexeme><grapheme>a</alias></lexeme></lexicon>", 2, 22, "mismatched tag"),
        (
            '<?xml version="1.0"?>\n<!DOCTYPE lexicon [<!ENTITY a "b">]>\n' + lexicon(),
            2,
            19,
            "a document type declaration",
        ),
        (lexicon(lexeme("&a;", "b")), 2, 19, "undefined entity"),
        ("<speak/>", 1, 1, "the root element must be <lexicon>, not <speak>"),
        ('<lexicon version="1.0" alphabet="ipa"/>', 1, 1, "not in the PLS namespace"),
        (HEAD.replace('version="1.0"', 'version="2.0"'), 1, 1, 'has version="2.0"'),
        (HEAD.replace(' version="1.0"', ""), 1, 1, "has no version"),
        (HEAD.replace("ipa", "cmu"), 1, 1, 'alphabet="cmu" is not a PLS 1.0 alphabet'),
        (HEAD.replace(' alphabet="ipa"', ""), 1, 1, "needs an alphabet attribute"),
        (
            lexicon(
                lexeme("a", "b"), "  <lexeme><grapheme>x</grapheme><phoneme>ks</phoneme></lexeme>"
            ),
            3,
            3,
            "<lexeme> has no <alias>: ChatTTS cannot speak phonemes",
        ),
        (lexicon("<lexeme><alias>b</alias></lexeme>"), 2, 1, "<lexeme> has no <grapheme>"),
        (lexicon(lexeme(" ", "b")), 2, 9, "<grapheme> is empty"),
        (lexicon(lexeme("a", "")), 2, 31, "<alias> is empty"),
        (lexicon(lexeme("a" * 129, "b")), 2, 9, "<grapheme> is 129 characters; the limit is 128"),
        (lexicon(lexeme("a", "[Stts] hi")), 2, 31, "ChatTTS structural token [Stts]"),
        (lexicon(lexeme("a", "b<b/>")), 2, 39, "<alias> holds text only, not <b>"),
        (
            lexicon('<lexeme><grapheme>a</grapheme><alias prefer="yes">b</alias></lexeme>'),
            2,
            31,
            'prefer="yes"; it is true or false',
        ),
        (lexicon("<entry/>"), 2, 1, "<entry> is not a PLS element here, inside <lexicon>"),
        (lexicon("stray words"), 3, 1, "text directly inside <lexicon> is not PLS"),
        (lexicon() + "<lexicon/>", 2, 11, "junk after document element"),
        (lexicon("<lexeme><grapheme>é</grapheme><é/></lexeme>"), 2, 31, "<é> is not a PLS"),
    ],
    ids=lambda v: v if isinstance(v, str) and len(v) < 40 else None,
)
def test_a_bad_document_is_refused_naming_line_and_column(
    document: str, line: int, column: int, message: str
) -> None:
    error = refusal(document)
    assert message in error.message
    assert (error.line, error.column) == (line, column), str(error)
    assert str(error).startswith(f"line {line}, column {column}: ")


def test_the_billion_laughs_are_refused_at_the_doctype_before_any_expansion() -> None:
    entities = "".join(f'<!ENTITY l{i} "{f"&l{i - 1};" * 10}">' for i in range(1, 10))
    doc = f'<!DOCTYPE lexicon [<!ENTITY l0 "lol">{entities}]>' + lexicon(lexeme("&l9;", "x"))
    error, peak_bytes = refusal_and_peak(doc)
    assert "document type declaration" in error.message and peak_bytes < 1 << 20


def test_too_many_lexemes_are_refused_and_ten_thousand_load() -> None:
    many = lexicon(*(lexeme(f"w{i}", "x") for i in range(MAX_LEXEMES + 1)))
    error = refusal(many)
    assert f"over {MAX_LEXEMES} lexemes" in error.message and error.line == MAX_LEXEMES + 2
    hundred_k = lexicon(*(lexeme(f"w{i}", "x") for i in range(100_000)))
    assert f"over {MAX_LEXEMES} lexemes" in refusal(hundred_k).message
    assert len(read_pls(lexicon(*(lexeme(f"w{i}", "x") for i in range(10_000))))) == 10_000


def test_a_document_over_the_byte_limit_is_refused_before_it_is_parsed() -> None:
    huge = HEAD + " " * (10 << 20)  # not even closed: never parsed
    error, peak_bytes = refusal_and_peak(huge)
    assert f"the limit is {MAX_PLS_BYTES}" in error.message and error.line == 1
    assert peak_bytes < 1 << 20  # not even encoded: 10 MiB


def test_a_server_file_error_names_the_file_line_and_column(tmp_path: Path) -> None:
    bad = tmp_path / "nav.pls"
    bad.write_text(lexicon(lexeme("a", "b"), "<lexeme><grapheme>x</grapheme></lexeme>"))
    with pytest.raises(LexiconFileError) as info:
        load_lexicon(bad)
    assert str(info.value) == f"{bad} line 3, column 1: <lexeme> has no <alias> (what to say)"
    with pytest.raises(LexiconFileError, match="cannot read .*missing.pls"):
        load_lexicon(tmp_path / "missing.pls")


def test_a_server_file_over_the_limit_is_refused_from_its_size(tmp_path: Path) -> None:
    big = tmp_path / "big.pls"
    with big.open("wb") as f:
        f.truncate(10 << 20)  # sparse: 10 MB of NULs, which no parser is shown
    with pytest.raises(LexiconFileError, match=f"10485760 bytes; the limit is {MAX_PLS_BYTES}"):
        load_lexicon(big)


def test_the_library_names_each_file_by_its_base_name(tmp_path: Path) -> None:
    (tmp_path / "brands.pls").write_text(lexicon(lexeme("I-95", "the ninety-five")))
    library = LexiconLibrary.load([REPO / "examples/lexicons/nav.pls", tmp_path / "brands.pls"])
    assert library.names == ["nav", "brands"]
    assert library.known() == "known: nav, brands"
    assert LexiconLibrary().known().startswith("this server has no lexicons")
    nav = library.get("nav")
    assert nav is not None and nav.keys["I-95"] == "Interstate ninety-five"
    assert library.default is not None  # both, merged: the later file wins
    assert library.default.lexicons[0].keys["I-95"] == "the ninety-five"
