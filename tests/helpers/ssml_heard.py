"""What a client heard of an SSML document from the real server, for test_ssml_e2e.py: the
audio, the utterances' texts and the marks, from the generated gRPC stubs or POST
/v1/audio/speech (the OpenAI SDK's HTTP client), and the checks of its breaks and marks.

Breaks are exact silence written into the audio, so each is found as a run of zero samples in
the returned LINEAR16 PCM (random-weight speech has no such runs) and its length compared with
the `<break>`'s. A mark's `sample_offset` must be the audio the client received before it.
"""

from __future__ import annotations

import base64
import json
import re
from dataclasses import dataclass, field

import numpy as np
import openai

from chattts_proto.chattts.v1 import tts_pb2
from httputil import TOKEN, http_url

N = 6
"""Audio tokens per utterance (the text and the timeline are under test, not the speech)."""
RATE = 24000
BREAK_TOLERANCE_S = 0.020
MIN_SILENCE_S = 0.1
"""Zero runs this long are silences; every break under test is longer."""
WAIT_S = 120.0
AUTH = (("authorization", f"Bearer {TOKEN}"),)


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
