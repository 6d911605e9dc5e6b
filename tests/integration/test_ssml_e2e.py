"""SSML through the real server: every element of the table from the generated gRPC stubs and
from POST /v1/audio/speech (the OpenAI SDK's HTTP client), the 20 navigation prompts, breaks
measured in the audio, marks echoed at their point, hostile documents refused, and streamed
documents (StreamingSynthesize, the WebSocket) read as the document sent whole.

What the client heard, and how breaks and marks are found in it: tests/helpers/ssml_heard.py.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

import grpc
import numpy as np
import openai
import pytest
from websockets.sync.client import connect

from chattts_proto.chattts.v1 import tts_pb2, tts_pb2_grpc
from httputil import TOKEN, http_server, samples_for, wait_idle, ws_stream_url
from navigation_ssml import PROMPTS, TAG_WORDS
from ssml_heard import (
    RATE,
    Heard,
    N,
    assert_breaks,
    assert_marks_at_their_point,
    post,
    stream,
    synthesize,
    words,
)


@pytest.fixture(scope="module")
def srv(tiny_model_dir, tmp_path_factory):
    with http_server(tmp_path_factory.mktemp("ssml"), max_streams=2, max_queue=2) as server:
        yield server


@pytest.fixture
def stub(srv):
    with grpc.insecure_channel(f"127.0.0.1:{srv.port}") as channel:
        yield tts_pb2_grpc.TextToSpeechStub(channel)
    wait_idle(srv, "the server to be idle after the test")


# -- every element of the table, from gRPC and from POST -----------------------------------------

ONE = samples_for(N)
"""Samples of one utterance."""


@dataclass(frozen=True)
class Case:
    name: str
    doc: str
    says: tuple[str, ...]
    """Each utterance's words, as spoken (UtteranceEnd.text, normalized)."""
    breaks: tuple[float, ...] = ()
    marks: tuple[str, ...] = ()


CASES = [
    Case("speak", '<speak xml:lang="en-US">Turn left.</speak>', ("turn left",)),
    Case("p", "<speak><p>Turn left</p><p>Keep right</p></speak>", ("turn left", "keep right")),
    Case("s", "<speak><s>Turn left</s> <s>Keep right</s></speak>", ("turn left", "keep right")),
    Case(
        "break time",
        '<speak>Turn left.<break time="400ms"/>Keep right.</speak>',
        ("turn left", "keep right"),
        breaks=(0.4,),
    ),
    Case(
        "break strength",
        '<speak>Turn left.<break strength="strong"/>Keep right.<break/>Exit.</speak>',
        ("turn left", "keep right", "exit"),
        breaks=(1.0, 0.75),
    ),
    Case(
        "prosody",
        '<speak>Turn <prosody rate="slow" pitch="+2st">left now</prosody>.</speak>',
        ("turn", "left now"),
    ),
    Case(
        "say-as",
        '<speak><s>Exit <say-as interpret-as="characters">12B</say-as> in <say-as '
        'interpret-as="cardinal">200</say-as> meters</s><s>the <say-as interpret-as="ordinal">3'
        '</say-as> exit, code <say-as interpret-as="digits">42</say-as></s><s><say-as '
        'interpret-as="fraction">1/2</say-as> mile, on <say-as interpret-as="date" format="mdy">'
        '03/15/2027</say-as></s><s>at <say-as interpret-as="time">10:45 pm</say-as></s><s>call '
        '<say-as interpret-as="telephone">555-0142</say-as></s><s>limit <say-as '
        'interpret-as="unit">50 km/h</say-as></s></speak>',
        (
            "exit one two b in two hundred meters",
            "the third exit code four two",
            "one half mile on march fifteenth twenty twenty seven",
            "at ten forty five p m",
            "call five five five oh one four two",
            "limit fifty kilometers per hour",
        ),
    ),
    Case(
        "sub", '<speak>Toward <sub alias="Saint">St.</sub> Louis.</speak>', ("toward saint louis",)
    ),
    Case(
        "lang",
        '<speak xml:lang="zh-CN">前方<lang xml:lang="en-US"><say-as interpret-as="cardinal">500'
        "</say-as></lang>米右转</speak>",
        ("前 方 five hundred 米 右 转",),
    ),
    Case(
        "emphasis and phoneme",
        '<speak><emphasis level="strong">Stop</emphasis> on <phoneme alphabet="ipa" '
        'ph="ˈhjuːstən">Houston</phoneme> St.</speak>',
        ("stop on houston street",),
    ),
    Case(
        "mark",
        '<speak><mark name="start"/>Turn left.<mark name="turned"/>Keep right.<mark name="end"/>'
        "</speak>",
        ("turn left", "keep right"),
        marks=("start", "turned", "end"),
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_each_element_from_grpc(stub, case: Case) -> None:
    heard = synthesize(stub, case.doc)
    assert [words(t) for t in heard.texts] == list(case.says)
    assert len(heard.pcm) == len(case.says) * ONE + round(sum(case.breaks) * RATE)
    assert_breaks(heard, case.breaks)
    assert_marks_at_their_point(heard, case.marks)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_each_element_from_post_sounds_as_from_grpc(srv, stub, case: Case) -> None:
    heard = post(srv, case.doc)
    assert np.array_equal(heard.pcm, synthesize(stub, case.doc).pcm)
    assert_breaks(heard, case.breaks)
    assert_marks_at_their_point(heard, case.marks)


def test_prosody_rate_is_the_utterances_speed_level(srv, stub) -> None:
    """The SSML rate gives the audio of the same words at that speed level (same seeds)."""
    slow = synthesize(stub, '<speak><prosody rate="slow">Keep right.</prosody></speak>')
    at_3 = synthesize(stub, "<speak>Keep right.</speak>", prosody=tts_pb2.Prosody(speed=3))
    at_5 = synthesize(stub, "<speak>Keep right.</speak>")
    assert np.array_equal(slow.pcm, at_3.pcm)
    assert not np.array_equal(slow.pcm, at_5.pcm)
    assert np.array_equal(
        post(srv, '<speak><prosody rate="80%">Keep right.</prosody></speak>').pcm, at_3.pcm
    )


def test_say_as_reads_as_the_words_written_out(srv, stub) -> None:
    ssml = synthesize(stub, '<speak>Exit <say-as interpret-as="characters">12B</say-as>.</speak>')
    plain = synthesize(stub, "<speak>Exit one two B.</speak>")
    assert ssml.texts == plain.texts and np.array_equal(ssml.pcm, plain.pcm)


REFUSED = [
    (
        "audio",
        '<speak>Chime <audio src="https://x.org/a.mp3"/></speak>',
        "line 1, column 14: <audio>",
    ),
    (
        "unknown",
        '<speak>Go <voice name="x">now</voice></speak>',
        "line 1, column 11: <voice> is not supported",
    ),
    (
        "malformed",
        "<speak>Turn <s>left</p></speak>",
        r"line 1, column \d+: mismatched tag at </p>, inside <s>",
    ),
    ("unclosed", "<speak>Turn left", "line 1, column 17: no element found, inside <speak>"),
    ("bad break", '<speak><break time="soon"/></speak>', 'line 1, column 8: <break> time="soon"'),
]


@pytest.mark.parametrize(
    "doc, message", [(d, m) for _, d, m in REFUSED], ids=[n for n, _, _ in REFUSED]
)
def test_refusals_name_line_column_and_element_on_grpc_and_post(
    srv, stub, doc: str, message: str
) -> None:
    with pytest.raises(grpc.RpcError) as caught:
        synthesize(stub, doc)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert re.search(r"text: SSML " + message, caught.value.details()), caught.value.details()
    with pytest.raises(openai.BadRequestError) as refused:
        post(srv, doc)
    error = refused.value.body
    assert isinstance(error, dict), error
    assert error["param"] == "input" and re.search("SSML " + message, error["message"]), error


def test_unknown_elements_are_read_as_their_text_when_asked(stub) -> None:
    doc = '<speak>Go <voice name="x">now</voice></speak>'
    assert synthesize(stub, doc, ssml_ignore_unknown_elements=True).said == "go now"


BILLION_LAUGHS = (
    '<?xml version="1.0"?><!DOCTYPE lolz [<!ENTITY lol "lol">'
    + "".join(
        f'<!ENTITY lol{i} "{("&lol" + (str(i - 1) if i > 1 else "") + ";") * 10}">'
        for i in range(1, 10)
    )
    + "]><speak>&lol9;</speak>"
)
EXTERNAL_ENTITY = (
    '<?xml version="1.0"?><!DOCTYPE speak [<!ENTITY xxe SYSTEM "file:///etc/passwd">]>'
    "<speak>&xxe;</speak>"
)


@pytest.mark.parametrize(
    "doc", [BILLION_LAUGHS, EXTERNAL_ENTITY], ids=["billion-laughs", "external-entity"]
)
def test_hostile_documents_are_refused_with_nothing_expanded(srv, stub, doc: str) -> None:
    with pytest.raises(grpc.RpcError) as caught:
        synthesize(stub, doc)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    details = caught.value.details()
    assert "document type declaration" in details and "lol" not in details and "root" not in details
    with pytest.raises(openai.BadRequestError) as refused:
        post(srv, doc)
    assert "document type declaration" in str(refused.value.body)


# -- navigation prompts ---------------------------------------------------------------------------


@pytest.mark.parametrize("prompt", PROMPTS, ids=[p.name for p in PROMPTS])
def test_navigation_prompts_are_spoken_with_no_tag_words(stub, prompt) -> None:
    heard = synthesize(stub, prompt.ssml)
    said = heard.said
    for expected in prompt.says:
        assert words(expected) in said, (expected, said)
    for word in TAG_WORDS:
        assert not re.search(rf"\b{word}\b", said), (word, said)
    assert_breaks(heard, prompt.breaks)
    assert_marks_at_their_point(heard, prompt.marks)


# -- streamed documents ---------------------------------------------------------------------------


def test_a_document_streamed_in_pieces_reads_as_sent_whole(stub) -> None:
    prompt = next(p for p in PROMPTS if p.name == "marks_between_steps")
    doc = prompt.ssml
    whole = synthesize(stub, doc)
    for size in (1, 7, 23):
        pieces = [doc[i : i + size] for i in range(0, len(doc), size)]
        heard = stream(stub, pieces)
        assert heard.said == whole.said
        assert_breaks(heard, prompt.breaks)
        assert_marks_at_their_point(heard, prompt.marks)


def test_a_streamed_document_left_open_ends_invalid_argument(stub) -> None:
    with pytest.raises(grpc.RpcError) as caught:
        stream(stub, ["<speak>Turn left.", " Then <s>keep right"])
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "text.text: SSML line 1, column " in caught.value.details()
    assert "no element found, inside <s>" in caught.value.details()


def test_a_document_over_the_websocket(srv) -> None:
    prompt = next(p for p in PROMPTS if p.name == "roundabout_ordinal")
    url = ws_stream_url(srv)
    heard = Heard()
    with connect(url, additional_headers={"Authorization": f"Bearer {TOKEN}"}) as ws:
        sampling = {"seed": 1, "min_new_tokens": N, "max_new_tokens": N}
        ws.send(
            json.dumps(
                {"type": "config", "voice": "seed:7", "sampling": sampling, "text_format": "SSML"}
            )
        )
        for i in range(0, len(prompt.ssml), 11):
            ws.send(json.dumps({"type": "text", "text": prompt.ssml[i : i + 11]}))
        ws.send(json.dumps({"type": "end"}))
        for message in ws:
            if isinstance(message, bytes):
                heard.add_audio(message)
                continue
            event = json.loads(message)
            if event["type"] == "utterance_end":
                heard.texts.append(event["text"])
            elif event["type"] == "mark":
                heard.add_mark(event["name"], event["sample_offset"])
    for expected in prompt.says:
        assert words(expected) in heard.said
    assert_breaks(heard, prompt.breaks)
