"""Numbers are spelled out before ChatTTS's normalizer (which would drop the digits)."""

from __future__ import annotations

import grpc
import pytest

from chattts_client._proto.chattts.v1 import tts_pb2, tts_pb2_grpc
from chattts_server.engine.numbers import chinese_numbers, english_numbers


@pytest.mark.parametrize(
    "text, spoken",
    [
        ("Turn left in 200 meters.", "Turn left in two hundred meters."),
        ("then 1.5 km", "then one point five km"),
        ("Take the 21st exit", "Take the twenty first exit"),
        ("1,200 people at 30%", "one thousand two hundred people at thirty percent"),
        ("keep x86 and v2 as they are", "keep x86 and v2 as they are"),
    ],
)
def test_english_numbers(text, spoken):
    assert english_numbers(text) == spoken


def test_chinese_numbers():
    assert chinese_numbers("前方200米右转") == "前方二百米右转"


def test_the_server_speaks_the_digits(server):
    with grpc.insecure_channel(server.target) as channel:
        stub = tts_pb2_grpc.TextToSpeechStub(channel)
        config = tts_pb2.SynthesisConfig(
            sampling=tts_pb2.Sampling(min_new_tokens=8, max_new_tokens=8)
        )
        req = tts_pb2.SynthesizeRequest(text="Turn left in 200 meters.", config=config)
        ends = [
            r.utterance_end for r in stub.Synthesize(req, timeout=60) if r.HasField("utterance_end")
        ]
    assert ends[0].text == "Turn left in two hundred meters."
