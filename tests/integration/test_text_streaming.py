"""Text from real callers through the real server: captions without punctuation, the idle
release, control tokens, normalization read back from UtteranceEnd.text, long sentences.

Streams here hold their request iterator open until a reply arrives (a threading.Event set by
the reading side, waited on with a bound), so "before the client half-closes" is an ordering the
test observes, not a race against the clock.
"""

from __future__ import annotations

import threading

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from chattts_client import AudioChunkEvent, Clear, TTSClient, UtteranceEndEvent, make_config
from chattts_proto.chattts.v1 import tts_pb2, tts_pb2_grpc

WAIT_S = 60.0


@pytest.fixture
def stub(server):
    with grpc.insecure_channel(server.target) as channel:
        yield tts_pb2_grpc.TextToSpeechStub(channel)


def short(num_tokens: int = 6, **release: int) -> tts_pb2.SynthesisConfig:
    return tts_pb2.SynthesisConfig(
        voice=tts_pb2.Voice(seed=1234),
        sampling=tts_pb2.Sampling(seed=3, min_new_tokens=num_tokens, max_new_tokens=num_tokens),
        text_release=tts_pb2.TextReleasePolicy(**release),
    )


def text(fragment: str, **flags: bool) -> tts_pb2.StreamingSynthesizeRequest:
    return tts_pb2.StreamingSynthesizeRequest(text=tts_pb2.TextInput(text=fragment, **flags))


class Stream:
    """A StreamingSynthesize call whose request side can wait for what the reply side saw."""

    def __init__(self, stub: tts_pb2_grpc.TextToSpeechStub) -> None:
        self.stub = stub
        self.ends: list[tts_pb2.UtteranceEnd] = []
        self.first_end = threading.Event()
        self.words_sent_at_first_end: int | None = None
        self.words_sent = 0
        self.half_closed = False

    def run(self, requests) -> list[tts_pb2.UtteranceEnd]:
        for reply in self.stub.StreamingSynthesize(requests, timeout=WAIT_S * 2):
            if reply.HasField("utterance_end"):
                if not self.ends:
                    self.words_sent_at_first_end = self.words_sent
                    assert not self.half_closed
                self.ends.append(reply.utterance_end)
                self.first_end.set()
        return self.ends


def test_caption_words_without_punctuation_are_spoken_before_the_stream_closes(stub):
    words = [f"word{i}" for i in range(12)]
    stream = Stream(stub)

    def requests():
        yield tts_pb2.StreamingSynthesizeRequest(config=short(first_words=4, max_words=4))
        for word in words:
            stream.words_sent += 1
            yield text(word + " ")
        # Hold the stream open until speech has come back.
        assert stream.first_end.wait(WAIT_S), "no utterance while the stream was open"
        stream.half_closed = True

    ends = stream.run(requests())
    assert ends[0].text == "word zero word one word two word three"
    assert len(ends) == 3
    assert all(e.num_tokens == 6 for e in ends)


def test_idle_gap_releases_text_without_a_new_message(stub):
    stream = Stream(stub)

    def requests():
        # Only the idle rule can release this: no boundary, word rules off.
        yield tts_pb2.StreamingSynthesizeRequest(
            config=short(first_words=0, max_words=0, clause_min_words=0, idle_ms=200)
        )
        yield text("hello there")
        assert stream.first_end.wait(WAIT_S), "the idle release never came"
        stream.half_closed = True

    ends = stream.run(requests())
    assert [e.text for e in ends] == ["hello there"]


def test_default_policy_starts_speech_at_the_first_clause(stub):
    stream = Stream(stub)

    def requests():
        # The idle release is off: on a loaded machine the first utterance may take longer
        # than idle_ms, which would release "here is" on its own.
        yield tts_pb2.StreamingSynthesizeRequest(config=short(idle_ms=0))
        yield text("Sure, here is")
        assert stream.first_end.wait(WAIT_S)
        stream.half_closed = True
        yield text(" the rest.")

    ends = stream.run(requests())
    assert [e.text for e in ends] == ["Sure,", "here is the rest."]


def _bad_field(err: grpc.RpcError) -> str:
    status = rpc_status.from_call(err)
    assert status is not None
    bad = error_details_pb2.BadRequest()
    assert status.details[0].Unpack(bad)
    return bad.field_violations[0].field


@pytest.mark.parametrize(
    "fragments, field",
    [
        (["Hello [Stts] there."], "text.text"),
        (["[spk_emb]"], "text.text"),
        (["speak [break_9] now."], "text.text"),
        (["split over [Pt", "ts] two messages."], "text.text"),
    ],
    ids=["Stts", "spk_emb", "level-out-of-range", "split"],
)
def test_structural_tokens_are_invalid_argument(stub, fragments, field):
    def requests():
        yield tts_pb2.StreamingSynthesizeRequest(config=short())
        for fragment in fragments:
            yield text(fragment)

    with pytest.raises(grpc.RpcError) as err:
        list(stub.StreamingSynthesize(requests(), timeout=WAIT_S))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert _bad_field(err.value) == field
    assert "structural" in err.value.details()


def test_structural_token_in_synthesize_names_the_field(stub):
    request = tts_pb2.SynthesizeRequest(text="Go [Ptts][PAD] now.", config=short())
    with pytest.raises(grpc.RpcError) as err:
        list(stub.Synthesize(request, timeout=WAIT_S))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert _bad_field(err.value) == "text"


def test_bad_release_policy_names_the_field(stub):
    def requests():
        yield tts_pb2.StreamingSynthesizeRequest(config=short(max_words=5000))

    with pytest.raises(grpc.RpcError) as err:
        list(stub.StreamingSynthesize(requests(), timeout=WAIT_S))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert _bad_field(err.value) == "config.text_release.max_words"


def spoken(stub, sentence: str) -> list[str]:
    request = tts_pb2.SynthesizeRequest(text=sentence, config=short())
    replies = stub.Synthesize(request, timeout=WAIT_S)
    return [r.utterance_end.text for r in replies if r.HasField("utterance_end")]


@pytest.mark.parametrize(
    "sentence, expected",
    [
        ("Turn left in 200m.", "Turn left in two hundred meters."),
        (
            "Take exit 12B onto the M25 [uv_break] at 10:30",
            "Take exit twelve B onto the M twenty five [uv_break] at ten thirty",
        ),
        (
            "Speed limit 60 km/h, it costs $4.50",
            "Speed limit sixty kilometers per hour, it costs four dollars fifty",
        ),
        ("It is -3°C on the I-95", "It is minus three degrees Celsius on the I ninety five"),
        ("See [1] here", "See one here"),
    ],
)
def test_numbers_units_and_symbols_are_spelled_out(stub, sentence, expected):
    (text_spoken,) = spoken(stub, sentence)
    assert text_spoken == expected


def test_chinese_navigation_text_is_spelled_out_with_no_digit_left(stub):
    text_spoken = "".join(spoken(stub, "前方200米右转，限速60km/h，气温-3℃，上午10:30到达"))
    assert not any(c.isdigit() for c in text_spoken)
    for words in ("米右转", "六十公里每小时", "零下三摄氏度", "十点三十分"):
        assert words in text_spoken


def test_a_long_sentence_becomes_several_utterances_cut_at_clauses(stub):
    sentence = ", ".join(
        f"then keep going past the {w} junction for a while" for w in "abcdefghijkl"
    )
    texts = spoken(stub, sentence + ".")
    assert len(texts) > 1
    assert all(t.endswith((",", ".")) for t in texts)


def test_reference_transcript_goes_through_the_same_normalizer(tiny_model_dir):
    import torch

    from chattts_server.engine.prompts import PromptBuilder
    from chattts_server.engine.utterance import VoiceKind, VoiceSpec
    from chattts_server.model.loader import load_chattts

    cpu = torch.device("cpu")
    prompts = PromptBuilder(load_chattts(tiny_model_dir, cpu, torch.float32), cpu)
    voice = VoiceSpec(VoiceKind.REFERENCE, transcript="Turn left in 200m at 10:30.")
    assert prompts.transcript(voice) == prompts.normalize("Turn left in 200m at 10:30.")
    assert prompts.transcript(voice) == "Turn left in two hundred meters at ten thirty."


def test_structural_token_in_a_reference_transcript_names_the_field(stub):
    from clips import clip

    config = short()
    config.voice.reference.audio = clip()
    config.voice.reference.transcript = "hello [Stts] there"
    with pytest.raises(grpc.RpcError) as err:
        list(stub.Synthesize(tts_pb2.SynthesizeRequest(text="Hi.", config=config), timeout=WAIT_S))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert _bad_field(err.value) == "config.voice.reference.transcript"


def test_clear_drops_buffered_text_and_speaks_what_follows(stub):
    def requests():
        yield tts_pb2.StreamingSynthesizeRequest(
            config=short(first_words=0, max_words=0, clause_min_words=0, idle_ms=0)
        )
        yield text("in two hundred meters turn")
        yield text("Reroute: keep left.", clear=True)
        yield text("Then exit")

    replies = stub.StreamingSynthesize(requests(), timeout=WAIT_S)
    ends = [r.utterance_end.text for r in replies if r.HasField("utterance_end")]
    assert ends == ["Reroute, keep left.", "Then exit"]  # ChatTTS reads ":" as ","


def test_clear_stops_the_utterance_being_spoken_and_the_stream_goes_on(server):
    """Barge-in through the client library: a `Clear` while a long utterance plays ends it at
    once with finish_reason 'cleared' (the audio already sent is all it has), frees its slot,
    and the text after the clear is spoken on the same stream with contiguous sample offsets."""
    first_audio = threading.Event()
    long_tokens = 380

    def texts():
        yield "Continue straight for the next twelve kilometers."
        assert first_audio.wait(WAIT_S)
        yield Clear("Turn right now.")

    config = make_config(voice=1234, seed=3, min_new_tokens=long_tokens, max_new_tokens=long_tokens)
    chunks: list[AudioChunkEvent] = []
    ends: list[UtteranceEndEvent] = []
    with TTSClient(server.target) as client:
        for event in client.stream(texts(), config=config, timeout=WAIT_S * 2):
            if isinstance(event, AudioChunkEvent):
                chunks.append(event)
                first_audio.set()
            else:
                ends.append(event)
    assert [e.finish_reason for e in ends] == ["cleared", "max_tokens"]
    sent = sum(c.num_samples for c in chunks if c.utterance_index == 0)
    assert 0 < sent < long_tokens * 512  # stopped well before its 380 tokens
    assert ends[0].audio_duration_s == pytest.approx(sent / 24000)
    assert ends[1].text == "Turn right now." and ends[1].num_tokens == long_tokens
    # Utterance 0's audio all comes before utterance 1's, and offsets never skip or overlap.
    assert [c.utterance_index for c in chunks] == sorted(c.utterance_index for c in chunks)
    offset = 0
    for c in chunks:
        assert c.sample_offset == offset
        offset += c.num_samples
    assert server.server.engine.stats().active_requests == 0
