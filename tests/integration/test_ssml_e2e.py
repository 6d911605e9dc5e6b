"""SSML through the real server: every element of the table from the generated gRPC stubs and
from POST /v1/audio/speech (the OpenAI SDK's HTTP client), the 20 navigation prompts, breaks
measured in the audio, marks echoed at their point, hostile documents refused, and streamed
documents (StreamingSynthesize, the WebSocket) read as the document sent whole.

Breaks are exact silence written into the audio, so each is found as a run of zero samples in
the returned LINEAR16 PCM (random-weight speech has no such runs) and its length compared with
the `<break>`'s. A mark's `sample_offset` must be the audio the client received before it.
"""

from __future__ import annotations

import base64
import json
import re
from dataclasses import dataclass, field

import grpc
import numpy as np
import openai
import pytest
from websockets.sync.client import connect

from chattts_proto.chattts.v1 import tts_pb2, tts_pb2_grpc
from httputil import TOKEN, engine_idle, http_server, http_url, samples_for
from navigation_ssml import PROMPTS, TAG_WORDS
from polling import wait_until

N = 6
"""Audio tokens per utterance (the text and the timeline are under test, not the speech)."""
RATE = 24000
BREAK_TOLERANCE_S = 0.020
MIN_SILENCE_S = 0.1
"""Zero runs this long are silences; every break under test is longer."""
WAIT_S = 120.0
AUTH = (("authorization", f"Bearer {TOKEN}"),)


@pytest.fixture(scope="module")
def srv(tiny_model_dir, tmp_path_factory):
    with http_server(tmp_path_factory.mktemp("ssml"), max_streams=2, max_queue=2) as server:
        yield server


@pytest.fixture
def stub(srv):
    with grpc.insecure_channel(f"127.0.0.1:{srv.port}") as channel:
        yield tts_pb2_grpc.TextToSpeechStub(channel)
    wait_until(lambda: engine_idle(srv), 10, "the server to be idle after the test")


def config(**fields: object) -> tts_pb2.SynthesisConfig:
    return tts_pb2.SynthesisConfig(
        voice=tts_pb2.Voice(seed=7),
        sampling=tts_pb2.Sampling(seed=1, min_new_tokens=N, max_new_tokens=N),
        text_format=tts_pb2.SSML,
        **fields,  # type: ignore[arg-type]
    )


@dataclass
class Heard:
    """What a client got: the audio, the utterances' texts, the marks with the audio before."""

    pcm: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int16))
    texts: list[str] = field(default_factory=list)
    marks: list[tuple[str, int]] = field(default_factory=list)
    """(name, sample_offset) of each Mark."""
    mark_points: list[int] = field(default_factory=list)
    """The samples received before each Mark arrived."""
    ends: list[tts_pb2.UtteranceEnd] = field(default_factory=list)

    def add_audio(self, data: bytes) -> None:
        self.pcm = np.concatenate([self.pcm, np.frombuffer(data, "<i2")])

    def add_mark(self, name: str, sample_offset: int) -> None:
        self.marks.append((name, sample_offset))
        self.mark_points.append(len(self.pcm))

    @property
    def said(self) -> str:
        return " ".join(words(t) for t in self.texts)


def heard_from(replies) -> Heard:
    heard = Heard()
    for reply in replies:
        kind = reply.WhichOneof("response")
        if kind == "audio":
            assert reply.audio.sample_offset == len(heard.pcm)
            heard.add_audio(reply.audio.audio)
        elif kind == "utterance_end":
            heard.ends.append(reply.utterance_end)
            heard.texts.append(reply.utterance_end.text)
        elif kind == "mark":
            heard.add_mark(reply.mark.name, reply.mark.sample_offset)
    return heard


def synthesize(stub, doc: str, **fields: object) -> Heard:
    request = tts_pb2.SynthesizeRequest(text=doc, config=config(**fields))
    return heard_from(stub.Synthesize(request, timeout=WAIT_S, metadata=AUTH))


def stream(stub, fragments: list[str], **fields: object) -> Heard:
    def requests():
        yield tts_pb2.StreamingSynthesizeRequest(config=config(**fields))
        for fragment in fragments:
            yield tts_pb2.StreamingSynthesizeRequest(text=tts_pb2.TextInput(text=fragment))

    return heard_from(stub.StreamingSynthesize(requests(), timeout=WAIT_S, metadata=AUTH))


def post(srv, doc: str, **chattts: object) -> Heard:
    """POST /v1/audio/speech with the OpenAI SDK, SSE: audio deltas and the mark events."""
    heard = Heard()
    with (
        openai.OpenAI(base_url=http_url(srv) + "/v1", api_key=TOKEN, max_retries=0) as client,
        client.audio.speech.with_streaming_response.create(
            model="tts-1",
            voice="seed:7",
            input=doc,
            response_format="pcm",
            stream_format="sse",
            timeout=WAIT_S,
            extra_body={
                "chattts": {
                    "text_format": "SSML",
                    "sampling": {"seed": 1, "min_new_tokens": N, "max_new_tokens": N},
                    **chattts,
                }
            },
        ) as response,
    ):
        for line in response.iter_lines():
            if not line.startswith("data: "):
                continue
            event = json.loads(line.removeprefix("data: "))
            if event["type"] == "speech.audio.delta":
                heard.add_audio(base64.b64decode(event["audio"]))
            elif event["type"] == "speech.mark":
                heard.add_mark(event["name"], event["sample_offset"])
    return heard


def words(text: str) -> str:
    return " ".join(re.findall(r"[\u4e00-\u9fff]|[^\W_]+", text.lower()))


def silences_s(pcm: np.ndarray) -> list[float]:
    """The lengths of the runs of zero samples at least MIN_SILENCE_S long, in order."""
    zero = np.concatenate([[False], pcm == 0, [False]])
    edges = np.flatnonzero(np.diff(zero.astype(np.int8)))
    runs = (edges[1::2] - edges[::2]) / RATE
    return [float(r) for r in runs if r >= MIN_SILENCE_S]


def assert_breaks(heard: Heard, expected_s: list[float] | tuple[float, ...]) -> None:
    found = silences_s(heard.pcm)
    assert len(found) == len(expected_s), (found, expected_s)
    for got, want in zip(found, expected_s, strict=True):
        assert abs(got - want) <= BREAK_TOLERANCE_S, (found, expected_s)


def assert_marks_at_their_point(heard: Heard, names: list[str] | tuple[str, ...]) -> None:
    assert [name for name, _ in heard.marks] == list(names)
    assert [offset for _, offset in heard.marks] == heard.mark_points


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
    url = f"ws://127.0.0.1:{srv.server.http_port}/v1/audio/speech/stream"
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
