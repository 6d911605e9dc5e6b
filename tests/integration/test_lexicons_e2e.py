"""Pronunciation lexicons through the real server (tiny random-weight model): `--lexicon` files
read for every stream, `SynthesisConfig.lexicons` naming them or holding PLS inline, over gRPC
(generated stubs), POST /v1/audio/speech (the openai SDK, SSE), the WebSocket, SSML's
`<lexicon uri>` and `chattts-client say --lexicon`. What the engine read is the utterance end's
`text`; word timing points each alias at the caller's own grapheme."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import grpc
import openai
import pytest

from chattts_client.cli import main
from chattts_proto.chattts.v1 import tts_pb2, tts_pb2_grpc
from chattts_server.text.pls import PLS_NAMESPACE
from httputil import TOKEN, http_server, http_url, sdk_sse_events
from serverutil import DEV_MODEL_CACHE, REPO, bad_request_field
from streaming_calls import AUTH, streamed, websocket_messages

WAIT_S = 240.0
"""Bounds every call: a few utterances take seconds on a quiet 2-core machine, minutes at load."""
NUM_TOKENS = 24
NAV = REPO / "examples" / "lexicons" / "nav.pls"


def pls(*pairs: tuple[str, str]) -> str:
    lexemes = "".join(
        f"\n  <lexeme><grapheme>{g}</grapheme><alias>{a}</alias></lexeme>" for g, a in pairs
    )
    head = f'<lexicon version="1.0" xmlns="{PLS_NAMESPACE}" alphabet="ipa" xml:lang="en-US">'
    return f'<?xml version="1.0" encoding="UTF-8"?>\n{head}{lexemes}\n</lexicon>\n'


INLINE = pls(("SFO", "San Francisco International"))


@pytest.fixture(scope="module")
def server(tiny_model_dir, tmp_path_factory):
    """--lexicon nav.pls (examples/) --lexicon brands.pls: brands wins for "I-95"."""
    folder = tmp_path_factory.mktemp("lexicons")
    brands = folder / "brands.pls"
    brands.write_text(pls(("I-95", "the ninety-five"), ("SFO", "the airport")))
    with http_server(folder, max_streams=2, max_queue=4, lexicons=(NAV, brands)) as srv:
        yield srv


def _config(*lexicons: str, **fields: object) -> tts_pb2.SynthesisConfig:
    return tts_pb2.SynthesisConfig(
        voice=tts_pb2.Voice(seed=3),
        sampling=tts_pb2.Sampling(seed=1, min_new_tokens=NUM_TOKENS, max_new_tokens=NUM_TOKENS),
        lexicons=list(lexicons),
        **fields,  # type: ignore[arg-type]
    )


def _synthesize(server, text: str, config: tts_pb2.SynthesisConfig) -> list:
    with grpc.insecure_channel(server.target) as channel:
        stub = tts_pb2_grpc.TextToSpeechStub(channel)
        request = tts_pb2.SynthesizeRequest(text=text, config=config)
        return list(stub.Synthesize(request, timeout=WAIT_S, metadata=AUTH))


def _read(replies: list) -> str:
    """What the engine read, utterance by utterance."""
    return " ".join(r.utterance_end.text for r in replies if r.HasField("utterance_end"))


def _refusal(server, text: str, config: tts_pb2.SynthesisConfig) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        _synthesize(server, text, config)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, info.value
    return info.value


def test_a_bad_server_lexicon_stops_the_server_naming_file_and_line(tmp_path: Path):
    bad = tmp_path / "bad.pls"
    bad.write_text(pls(("SFO", "x")).replace("<alias>x</alias>", "<phoneme>ɛs</phoneme>"))
    args = ["--host", "127.0.0.1", "--port", "0", "--device", "cpu"]
    args += [
        "--dev-model-cache",
        str(DEV_MODEL_CACHE),
        "--lexicon",
        str(NAV),
        "--lexicon",
        str(bad),
    ]
    done = subprocess.run(
        [sys.executable, "-m", "chattts_server.main", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        env={"PYTHONPATH": f"{REPO / 'client'}:{REPO / 'server'}", "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert (
        f"chattts-server: --lexicon {bad} line 3, column 3: <lexeme> has no <alias>: "
        "ChatTTS cannot speak phonemes"
    ) in done.stderr


def test_server_lexicons_are_read_for_every_stream_and_a_named_one_wins(server):
    read = _read(_synthesize(server, "Go to Zhongguancun St, then I-95.", _config()))
    assert "Jong gwan tsun" in read and "the ninety" in read and "Interstate" not in read
    read = _read(_synthesize(server, "Then I-95.", _config("nav")))
    assert "Interstate ninety" in read and "the ninety" not in read


def test_a_streamed_inline_lexicon_is_read_and_words_point_at_the_graphemes(server):
    caller = "Take I-95 to SFO.\n"
    config = _config("nav", INLINE, word_timing=True)
    replies = streamed(server.target, [tts_pb2.TextInput(text=caller, flush=True)], config, WAIT_S)
    read = _read(replies)
    assert "Interstate ninety" in read and "San Francisco International" in read
    (timings,) = [r.word_timings for r in replies if r.HasField("word_timings")]
    words = [w for w in timings.words if w.has_source]
    assert [w.source_text for w in words] == ["Take", "I-95", "to", "SFO"]
    for w in words:
        assert caller[w.source_start : w.source_end] == w.source_text
    by_source = {w.source_text: w.text for w in words}
    assert "Interstate" in by_source["I-95"] and "Francisco" in by_source["SFO"]
    assert all(a.end_sample <= b.start_sample for a, b in zip(words, words[1:], strict=False))


def test_ssml_lexicon_names_a_server_lexicon_for_its_document_and_lookup_one_for_its_text(server):
    doc = '<speak><lexicon uri="nav"/>Take I-95 to <say-as interpret-as="characters">SFO</say-as>.</speak>'
    read = _read(_synthesize(server, doc, _config(text_format=tts_pb2.SSML)))
    assert "Interstate ninety" in read and "the airport" not in read
    both = '<speak><lexicon uri="nav" xml:id="n"/><lexicon uri="brands" xml:id="b"/>'
    doc = both + 'Take I-95, <lookup ref="n">not I-95</lookup>.</speak>'
    read = _read(_synthesize(server, doc, _config(text_format=tts_pb2.SSML)))
    assert "Take the ninety" in read and "not Interstate ninety" in read, read
    error = _refusal(
        server, '<speak><lexicon uri="roads"/>Hi.</speak>', _config(text_format=tts_pb2.SSML)
    )
    assert bad_request_field(error) == "text"
    assert 'SSML line 1, column 8: <lexicon> uri="roads" names no lexicon' in error.details()
    assert "known: nav, brands" in error.details()


def test_bad_lexicons_are_invalid_argument_naming_the_value(server):
    error = _refusal(server, "Hi.", _config("nav", "roads"))
    assert bad_request_field(error) == "config.lexicons[1]"
    assert "names no lexicon 'roads' (known: nav, brands)" in error.details()
    phonemes_only = pls(("SFO", "x")).replace("<alias>x</alias>", "<phoneme>ɛs ɛf oʊ</phoneme>")
    error = _refusal(server, "Hi.", _config(phonemes_only))
    assert bad_request_field(error) == "config.lexicons[0]"
    assert "PLS line 3, column 3: <lexeme> has no <alias>: ChatTTS cannot speak" in error.details()


def test_http_speech_takes_chattts_lexicons(server):
    sampling = {"seed": 1, "min_new_tokens": NUM_TOKENS, "max_new_tokens": NUM_TOKENS}
    chattts = {"sampling": sampling, "word_timing": True, "lexicons": ["nav", INLINE]}
    events = sdk_sse_events(server, "Take I-95 to SFO.", chattts, WAIT_S)
    (timings,) = [e for e in events if e["type"] == "speech.word_timings"]
    by_source = {w["source_text"]: w["text"] for w in timings["words"] if w["has_source"]}
    assert "Interstate" in by_source["I-95"] and "Francisco" in by_source["SFO"]
    with (
        openai.OpenAI(
            base_url=http_url(server) + "/v1", api_key=TOKEN, max_retries=0, timeout=WAIT_S
        ) as client,
        pytest.raises(openai.BadRequestError) as bad,
    ):
        client.audio.speech.create(
            model="tts-1", voice="alloy", input="Hi.", extra_body={"chattts": {"lexicons": ["x"]}}
        )
    assert bad.value.status_code == 400
    assert bad.value.body["param"] == "chattts.lexicons[0]", bad.value.body
    assert "names no lexicon 'x'" in bad.value.body["message"], bad.value.body


def test_the_websocket_config_takes_lexicons(server):
    sampling = {"seed": 1, "min_new_tokens": NUM_TOKENS, "max_new_tokens": NUM_TOKENS}
    messages = [
        {"type": "config", "sampling": sampling, "word_timing": True, "lexicons": [INLINE]},
        {"type": "text", "text": "Fly to SFO.", "flush": True},
        {"type": "end"},
    ]
    out = [m for m in websocket_messages(server, messages, WAIT_S) if isinstance(m, dict)]
    (timings,) = [m for m in out if m["type"] == "word_timings"]
    by_source = {w["source_text"]: w["text"] for w in timings["words"] if w["has_source"]}
    assert "Francisco" in by_source["SFO"]


def test_the_cli_sends_a_file_inline_and_a_name_as_is(server, tmp_path: Path, monkeypatch, capsys):
    mine = tmp_path / "mine.pls"
    mine.write_text(INLINE)
    monkeypatch.setattr("sys.stdin", io.StringIO("Take I-95 to SFO.\n"))
    argv = ["say", "--stdin", "-o", str(tmp_path / "out.wav"), "--server", server.target]
    tokens = ["--token", TOKEN, "--min-new-tokens", "24", "--max-new-tokens", "24"]
    assert main([*argv, *tokens, "--lexicon", "nav", "--lexicon", str(mine)]) == 0
    err = capsys.readouterr().err
    assert "Interstate ninety" in err and "San Francisco International" in err
    assert main([*argv, *tokens, "--lexicon", "roads"]) == 2
    assert "config.lexicons[0]" in capsys.readouterr().err
    assert main([*argv, *tokens, "--lexicon", str(tmp_path / "missing.pls")]) == 1
    assert "no lexicon file" in capsys.readouterr().err
