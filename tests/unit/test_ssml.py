"""SSML in (text/ssml): every element of the table, the errors and the safety limits. No model,
no server: spans, navigation prompts and streamed documents are in test_ssml_stream.py, the same
documents through the real server in tests/integration/test_ssml_e2e.py."""

from __future__ import annotations

import re

import pytest

from chattts_server.errors import InvalidRequestError
from chattts_server.text.release import ReleasePolicy
from chattts_server.text.ssml import (
    Break,
    Item,
    MarkPart,
    SpeechItem,
    SpokenText,
    SsmlStream,
    parse_ssml,
)
from chattts_server.text.ssml.document import MAX_DEPTH
from chattts_server.text.ssml.say_as import say_as
from ssml_items import items, readout


def spoken(found: list[Item]) -> str:
    return " ".join(i.text.text for i in found if isinstance(i, SpeechItem))


# -- the table, element by element ----------------------------------------------------------


def test_speak_is_the_root_and_its_text_is_read() -> None:
    assert readout(items("<speak>Turn left.</speak>")) == [("Turn left.", 5)]
    ns = '<speak version="1.1" xmlns="http://www.w3.org/2001/10/synthesis" xml:lang="en-US">'
    assert readout(items(ns + "Turn left.</speak>")) == [("Turn left.", 5)]


def test_p_and_s_end_sentences_and_xml_whitespace_is_a_space() -> None:
    doc = "<speak><p>Turn\n   left</p><p><s>Keep right</s><s>then exit</s></p></speak>"
    assert readout(items(doc)) == [("Turn left", 5), ("Keep right", 5), ("then exit", 5)]
    assert readout(items("<speak>Turn\nleft</speak>")) == [("Turn left", 5)]


@pytest.mark.parametrize(
    "tag, seconds",
    [
        ('<break time="500ms"/>', 0.5),
        ('<break time="1.5s"/>', 1.5),
        ('<break time="10s"/>', 10.0),
        ('<break strength="x-weak"/>', 0.25),
        ('<break strength="weak"/>', 0.5),
        ('<break strength="medium"/>', 0.75),
        ('<break strength="strong"/>', 1.0),
        ('<break strength="x-strong"/>', 1.25),
        ("<break/>", 0.75),
        ('<break time="200ms" strength="x-strong"/>', 0.2),
    ],
)
def test_break_is_a_silence_between_utterances(tag: str, seconds: float) -> None:
    assert readout(items(f"<speak>Turn left{tag} then right.</speak>")) == [
        ("Turn left", 5),
        Break(seconds),
        ("then right.", 5),
    ]


def test_a_break_of_strength_none_is_no_break() -> None:
    doc = '<speak>Turn left <break strength="none"/>then right.</speak>'
    assert readout(items(doc)) == [("Turn left then right.", 5)]


@pytest.mark.parametrize(
    "rate, speed",
    [
        ("x-slow", 1),
        ("slow", 3),
        ("medium", 5),
        ("default", 5),
        ("fast", 7),
        ("x-fast", 9),
        ("80%", 3),
        ("120%", 7),
        ("+20%", 7),
        ("-10%", 4),
        ("1.3", 8),
        ("300%", 9),
        ("10%", 0),
    ],
)
def test_prosody_rate_sets_the_speed_level(rate: str, speed: int) -> None:
    doc = f'<speak>Turn <prosody rate="{rate}">left now</prosody> please.</speak>'
    if speed == 5:  # the stream's own speed: no cut
        assert readout(items(doc)) == [("Turn left now please.", 5)]
    else:
        assert readout(items(doc)) == [("Turn", 5), ("left now", speed), ("please.", 5)]


def test_relative_rates_are_relative_to_the_stream_and_the_enclosing_rate() -> None:
    doc = '<speak><prosody rate="+20%">a <prosody rate="+20%">b</prosody></prosody></speak>'
    assert readout(items(doc, speed=3)) == [("a", 5), ("b", 7)]
    assert readout(items('<speak><prosody rate="fast">a</prosody></speak>', speed=2)) == [("a", 7)]


def test_prosody_pitch_and_volume_are_accepted_with_no_effect() -> None:
    doc = '<speak><prosody pitch="+2st" volume="loud" contour="(0%,+20Hz)">Exit now.</prosody></speak>'
    assert readout(items(doc)) == [("Exit now.", 5)]


@pytest.mark.parametrize(
    "interpret_as, text, words",
    [
        ("characters", "12B", "one two B"),
        ("spell-out", "abc", "A B C"),
        ("verbatim", "I-5", "I five"),
        ("cardinal", "200", "two hundred"),
        ("cardinal", "1,234", "one thousand two hundred and thirty four"),
        ("cardinal", "-3", "minus three"),
        ("cardinal", "2.5", "two point five"),
        ("number", "42", "forty two"),
        ("ordinal", "3", "third"),
        ("ordinal", "21st", "twenty first"),
        ("digits", "0142", "zero one four two"),
        ("fraction", "3/4", "three quarters"),
        ("fraction", "1/2", "one half"),
        ("fraction", "2 1/3", "two and one third"),
        ("fraction", "5/8", "five eighths"),
        ("time", "10:45 pm", "ten forty five p m"),
        ("time", "14:05", "fourteen oh five"),
        ("telephone", "555-0142", "five five five, oh one four two"),
        (
            "telephone",
            "+1 (800) 555 0199",
            "plus one, eight oh oh, five five five, oh one nine nine",
        ),
        ("unit", "12 mi", "twelve miles"),
        ("unit", "50 km/h", "fifty kilometers per hour"),
        ("cardinal", "many", "many"),
    ],
)
def test_say_as_reads_each_class_in_words(interpret_as: str, text: str, words: str) -> None:
    assert say_as(interpret_as, text, "en") == words
    doc = f'<speak>x <say-as interpret-as="{interpret_as}">{text}</say-as> y</speak>'
    assert spoken(items(doc)) == f"x {words} y"


@pytest.mark.parametrize(
    "fmt, text, words",
    [
        ("mdy", "03/15/2027", "March fifteenth twenty twenty seven"),
        ("dmy", "15.03.2027", "the fifteenth of March twenty twenty seven"),
        ("ymd", "2005-07-04", "July fourth two thousand five"),
        (None, "1999-12-31", "December thirty first nineteen ninety nine"),
        ("md", "7/4", "July fourth"),
        ("y", "1900", "nineteen hundred"),
    ],
)
def test_say_as_date_follows_its_format(fmt: str | None, text: str, words: str) -> None:
    assert say_as("date", text, "en", fmt) == words


@pytest.mark.parametrize(
    "interpret_as, text, words",
    [
        ("cardinal", "500", "五百"),
        ("ordinal", "3", "第三"),
        ("digits", "2024", "二零二四"),
        ("characters", "12B", "一二B"),
        ("fraction", "3/4", "四分之三"),
        ("date", "2024-03-05", "二零二四年三月五日"),
        ("time", "10:30", "十点三十分"),
        ("telephone", "010-12345678", "零幺零，幺二三四五六七八"),
        ("unit", "60km/h", "六十公里每小时"),
    ],
)
def test_say_as_reads_chinese_in_the_lang_hint_or_the_text_script(
    interpret_as: str, text: str, words: str
) -> None:
    assert say_as(interpret_as, text, "zh") == words
    doc = (
        f'<speak xml:lang="zh-CN">前方<say-as interpret-as="{interpret_as}">{text}</say-as></speak>'
    )
    assert spoken(items(doc)).replace(" ", "") == f"前方{words}"


def test_lang_is_a_hint_for_say_as_inside_it() -> None:
    doc = (
        '<speak>前方 <lang xml:lang="en-US"><say-as interpret-as="cardinal">200</say-as></lang> '
        '<say-as interpret-as="cardinal">200</say-as></speak>'
    )
    parts = [p for p in parse_ssml(doc) if isinstance(p, SpokenText) and p.text.text.strip()]
    assert [(p.text.text.strip(), p.lang) for p in parts] == [
        ("前方", None),
        ("two hundred", "en"),
        ("二百", None),
    ]


def test_sub_speaks_its_alias() -> None:
    doc = '<speak>Toward <sub alias="Saint">St.</sub> Louis</speak>'
    assert spoken(items(doc)) == "Toward Saint Louis"


def test_emphasis_and_phoneme_have_no_effect_and_their_text_is_spoken() -> None:
    doc = (
        '<speak><emphasis level="strong">Stop</emphasis> on '
        '<phoneme alphabet="ipa" ph="ˈhjuːstən">Houston</phoneme> St.</speak>'
    )
    assert readout(items(doc)) == [("Stop on Houston St.", 5)]


def test_mark_falls_between_utterances_at_its_point() -> None:
    doc = '<speak><mark name="a"/>Turn left <mark name="b"/>then right.<mark name="c"/></speak>'
    assert readout(items(doc)) == [
        MarkPart("a"),
        ("Turn left", 5),
        MarkPart("b"),
        ("then right.", 5),
        MarkPart("c"),
    ]


def test_audio_is_refused() -> None:
    with pytest.raises(InvalidRequestError, match=r"line 1, column 14: <audio> is not supported"):
        items('<speak>Chime <audio src="https://x.org/chime.mp3">chime</audio></speak>')


# -- errors --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "doc, message",
    [
        (
            "<speak>Turn <s>left</p></speak>",
            r"line 1, column 2\d: mismatched tag at </p>, inside <s>",
        ),
        ("<speak>\n  Turn <s>left", r"line 2, column 15: no element found, inside <s>"),
        ("<speak>Turn & left</speak>", r"line 1, column 1\d: not well-formed .*inside <speak>"),
        ("<speak a=b>x</speak>", r"line 1, column \d+: not well-formed"),
        ("Turn left", r"line 1, column 1: text outside any element: an SSML document is <speak>"),
        ("<!-- a comment -->", r"no root element: an SSML document is <speak>"),
        ("<s>Turn left</s>", r"the root element must be <speak>, not <s>"),
        ("<speak><speak>x</speak></speak>", r"<speak> may only be the root element"),
        ("<speak>x</speak> more", r"line 1, column 18: text outside any element"),
        ("<speak>x</speak>\n <speak>y", r"line 2, column 10: no element found, inside <speak>"),
        ('<speak><break time="fast"/></speak>', r'<break> time="fast" is not a duration'),
        ('<speak><break time="11s"/></speak>', r"longer than 10 s"),
        ('<speak><break strength="huge"/></speak>', r'strength="huge" is not one of'),
        ('<speak><prosody rate="zoom">x</prosody></speak>', r'<prosody> rate="zoom" is not one'),
        ("<speak><say-as>12</say-as></speak>", r"<say-as> has no interpret-as; supported: char"),
        ('<speak><say-as interpret-as="x">1</say-as></speak>', r'interpret-as="x"; supported'),
        ('<speak><say-as interpret-as="digits">1<break/></say-as></speak>', r"holds text only"),
        ("<speak><sub>St.</sub></speak>", r"<sub> needs an alias"),
        ("<speak><lang>x</lang></speak>", r"<lang> needs an xml:lang"),
        ("<speak><mark/></speak>", r"<mark> needs a name of 1 to 256"),
        (f'<speak><mark name="{"m" * 257}"/></speak>', r"<mark> needs a name"),
        ("<speak>a &nbsp; b</speak>", r"line 1, column 1\d: undefined entity, inside <speak>"),
    ],
)
def test_a_bad_document_names_line_column_and_element(doc: str, message: str) -> None:
    with pytest.raises(InvalidRequestError) as caught:
        items(doc, field_name="config.text")  # type: ignore[arg-type]
    assert caught.value.field_name == "config.text"
    assert re.match(r"SSML line \d+, column \d+: ", caught.value.description)
    assert re.search(message, caught.value.description), caught.value.description


def test_an_unknown_element_is_refused_by_name_unless_ignored() -> None:
    doc = '<speak>Turn <voice name="en-US-x">left <amazon:effect xmlns:amazon="urn:a" name="w">now</amazon:effect></voice></speak>'
    with pytest.raises(InvalidRequestError, match=r"line 1, column 13: <voice> is not supported"):
        items(doc)
    inner = doc.replace('<voice name="en-US-x">', "").replace("</voice>", "")
    with pytest.raises(
        InvalidRequestError, match=r"<effect \(in namespace urn:a\)> is not supported"
    ):
        items(inner)
    assert readout(items(doc, ignore_unknown=True)) == [("Turn left now", 5)]


def test_depth_and_held_text_are_limited() -> None:
    deep = "<speak>" + "<emphasis>" * MAX_DEPTH + "x" + "</emphasis>" * MAX_DEPTH + "</speak>"
    with pytest.raises(InvalidRequestError, match=f"nested deeper than {MAX_DEPTH}"):
        items(deep)
    long = '<speak><say-as interpret-as="digits">' + "1" * 600 + "</say-as></speak>"
    with pytest.raises(InvalidRequestError, match="holds over 512 characters"):
        items(long)


BILLION_LAUGHS = (
    '<?xml version="1.0"?>\n<!DOCTYPE lolz [\n <!ENTITY lol "lol">\n'
    + "".join(
        f' <!ENTITY lol{i} "{("&lol" + str(i - 1) + ";") * 10 if i > 1 else "&lol;" * 10}">\n'
        for i in range(1, 10)
    )
    + "]>\n<speak>&lol9;</speak>"
)
EXTERNAL_ENTITY = (
    '<?xml version="1.0"?>\n<!DOCTYPE speak [<!ENTITY xxe SYSTEM "file:///etc/passwd">]>\n'
    "<speak>&xxe;</speak>"
)
EXTERNAL_DTD = '<!DOCTYPE speak SYSTEM "http://127.0.0.1:9/ssml.dtd"><speak>x</speak>'


@pytest.mark.parametrize("doc", [BILLION_LAUGHS, EXTERNAL_ENTITY, EXTERNAL_DTD])
def test_documents_with_a_dtd_are_refused_with_nothing_expanded(doc: str) -> None:
    stream = SsmlStream(ReleasePolicy())
    with pytest.raises(InvalidRequestError, match="document type declaration") as caught:
        stream.feed(doc)
    assert "lol" not in caught.value.description and "root:" not in caught.value.description
    # And without a DTD an entity is only ever undefined.
    with pytest.raises(InvalidRequestError, match="undefined entity"):
        items("<speak>&lol9;</speak>")
