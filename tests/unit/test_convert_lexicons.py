"""`SynthesisConfig.lexicons` validated (api/lexicons.py through `Validator.settings`): server
lexicons for every stream, names and inline PLS on top, each refusal naming the value; and the
stream's text front end reading each released utterance through them, whatever the split."""

from __future__ import annotations

import pytest

from chattts_proto.chattts.v1 import tts_pb2
from chattts_server.api.convert import Validator
from chattts_server.api.lexicons import MAX_INLINE_LEXICON_BYTES, MAX_STREAM_LEXICONS
from chattts_server.api.voices import VoiceLibrary
from chattts_server.errors import InvalidRequestError
from chattts_server.stream.items import Speak
from chattts_server.stream.text_queue import front_end
from chattts_server.text.lexicon import Lexicon
from chattts_server.text.lexicon_library import LexiconLibrary, compile_inline
from chattts_server.text.pls import PLS_NAMESPACE
from model_info import TINY_MODEL_INFO

MODEL = TINY_MODEL_INFO
NAV = Lexicon.build("nav", [("I-95", "Interstate ninety-five")])
BRANDS = Lexicon.build("brands", [("I-95", "the ninety-five"), ("SFO", "the airport")])
SERVER = Validator(VoiceLibrary(None), MODEL, server_lexicons=LexiconLibrary([NAV, BRANDS]))
BARE = Validator(VoiceLibrary(None), MODEL)


def pls(*pairs: tuple[str, str], indent: str = "") -> str:
    lexemes = "".join(
        f"\n<lexeme><grapheme>{g}</grapheme><alias>{a}</alias></lexeme>" for g, a in pairs
    )
    head = f'<lexicon version="1.0" xmlns="{PLS_NAMESPACE}" alphabet="ipa">'
    return f"{indent}{head}{lexemes}\n</lexicon>"


def refused(validator: Validator, *lexicons: str) -> InvalidRequestError:
    with pytest.raises(InvalidRequestError) as info:
        validator.settings(tts_pb2.SynthesisConfig(lexicons=list(lexicons)))
    return info.value


def said(validator: Validator, text: str, *lexicons: str, **config: object) -> list[str]:
    settings = validator.settings(tts_pb2.SynthesisConfig(lexicons=list(lexicons), **config))
    reader = front_end(settings)
    items = [i for k in range(0, len(text), 3) for i in reader.feed(text[k : k + 3])]
    return [i.text.text for i in items + reader.end() if isinstance(i, Speak)]


def test_no_lexicons_anywhere_is_none_and_the_servers_apply_to_every_stream() -> None:
    assert BARE.settings(tts_pb2.SynthesisConfig()).lexicons is None
    settings = SERVER.settings(tts_pb2.SynthesisConfig())
    assert settings.lexicons is not None and settings.server_lexicons.names == ["nav", "brands"]
    assert said(SERVER, "Take I-95 to SFO.") == ["Take the ninety-five to the airport."]


def test_a_named_server_lexicon_comes_after_the_servers_own() -> None:
    assert said(SERVER, "Take I-95.", "nav") == ["Take Interstate ninety-five."]


def test_an_inline_lexicon_is_read_last_and_parsed_once() -> None:
    inline = pls(("SFO", "San Francisco International"), indent="\n  ")
    assert said(SERVER, "Take I-95 to SFO.", inline) == [
        "Take the ninety-five to San Francisco International."
    ]
    assert said(BARE, "SFO **now**.", inline) == ["San Francisco International now."]
    assert compile_inline(inline) is compile_inline(inline)


def test_ssml_streams_read_through_the_lexicons_and_may_name_more() -> None:
    ssml = tts_pb2.SSML
    doc = '<speak><lexicon uri="nav"/>Take I-95 to SFO.</speak>'
    assert said(SERVER, doc, text_format=ssml) == ["Take Interstate ninety-five to the airport."]
    assert said(SERVER, "<speak>Take I-95.</speak>", text_format=ssml) == ["Take the ninety-five."]


def test_an_unknown_name_is_refused_listing_the_known_ones() -> None:
    error = refused(SERVER, "nav", "roads")
    assert error.field_name == "config.lexicons[1]"
    assert error.description == "names no lexicon 'roads' (known: nav, brands)"
    assert "this server has no lexicons" in refused(BARE, "nav").description


def test_bad_inline_pls_names_the_value_line_and_column() -> None:
    bad = pls(("SFO", "x")).replace("<alias>x</alias>", "<phoneme>ɛs</phoneme>")
    error = refused(SERVER, "nav", bad)
    assert error.field_name == "config.lexicons[1]"
    assert error.description == (
        "PLS line 2, column 1: <lexeme> has no <alias>: ChatTTS cannot speak phonemes"
    )
    assert refused(BARE, "<not a lexicon").description.startswith(
        "PLS line 1, column 8: not well-formed"
    )


def test_at_most_eight_lexicons_and_a_byte_budget_for_inline_ones() -> None:
    error = refused(SERVER, *["nav"] * (MAX_STREAM_LEXICONS + 1))
    assert error.field_name == "config.lexicons" and "the limit is 8" in error.description
    half = pls(*((f"w{k}", "x" * 100) for k in range(MAX_INLINE_LEXICON_BYTES // 180)))
    assert MAX_INLINE_LEXICON_BYTES // 2 < len(half) <= MAX_INLINE_LEXICON_BYTES
    error = refused(BARE, half, half)
    assert error.field_name == "config.lexicons[1]"
    assert f"over {MAX_INLINE_LEXICON_BYTES} bytes" in error.description
