"""Marks through the real server: the generated gRPC stubs, grpcurl (what a user types) and the
WebSocket, each showing the Mark event at the offset of the audio before it; utterance ends with
their place on the timeline and the caller's own text; bad mark names named in the error."""

from __future__ import annotations

import grpc
import pytest

from chattts_proto.chattts.v1 import tts_pb2
from httputil import http_server
from serverutil import bad_request_field
from streaming_calls import barged_in, grpcurl_streamed, streamed, websocket_messages

WAIT_S = 60.0


@pytest.fixture(scope="module")
def server(tiny_model_dir, tmp_path_factory):
    """One server with both doors (gRPC and HTTP) for this file."""
    with http_server(tmp_path_factory.mktemp("marks"), max_streams=2, max_queue=2) as srv:
        yield srv


def _config(num_tokens: int = 4) -> tts_pb2.SynthesisConfig:
    return tts_pb2.SynthesisConfig(
        voice=tts_pb2.Voice(seed=3),
        sampling=tts_pb2.Sampling(seed=1, min_new_tokens=num_tokens, max_new_tokens=num_tokens),
        text_release=tts_pb2.TextReleasePolicy(first_words=0),
    )


def test_marks_answer_at_the_audio_before_them_with_the_callers_text(server):
    inputs = [
        tts_pb2.TextInput(text="", mark="start"),
        tts_pb2.TextInput(text="Turn **left** in 200 m", mark="turn"),
        tts_pb2.TextInput(text=" then stop at 3:45 PM.", mark="stop"),
    ]
    replies = streamed(server.target, inputs, _config(), WAIT_S)
    kinds = [r.WhichOneof("response") for r in replies]
    marks = [r.mark for r in replies if r.HasField("mark")]
    ends = [r.utterance_end for r in replies if r.HasField("utterance_end")]
    assert [m.name for m in marks] == ["start", "turn", "stop"]
    assert kinds[0] == "mark" and marks[0].sample_offset == 0
    assert kinds[-1] == "mark"
    sent = 0
    for reply in replies:
        if reply.HasField("audio"):
            assert reply.audio.sample_offset == sent
            sent += reply.audio.num_samples
        elif reply.HasField("mark"):
            assert reply.mark.sample_offset == sent and not reply.mark.dropped
            assert reply.mark.offset_s == pytest.approx(sent / 24000)
    assert [e.source_text for e in ends] == ["Turn left in 200 m", "then stop at 3:45 PM."], kinds
    caller = "Turn **left** in 200 m then stop at 3:45 PM."
    assert [(e.source_start, e.source_end) for e in ends] == [(0, 22), (23, 44)]
    assert caller[23:44] == ends[1].source_text
    assert ends[1].sample_offset == ends[0].sample_offset + ends[0].num_samples
    assert marks[1].sample_offset == ends[1].sample_offset  # between the two utterances
    assert "two hundred" in ends[0].text


def test_a_mark_riding_with_clear_is_placed_after_the_cut(server):
    inputs = [
        tts_pb2.TextInput(text="first words here", mark="kept"),
        tts_pb2.TextInput(text="", clear=True, mark="after"),
    ]
    replies = streamed(server.target, inputs, _config(2), WAIT_S)
    marks = [r.mark for r in replies if r.HasField("mark")]
    assert [m.name for m in marks] == ["kept", "after"]
    assert not marks[1].dropped


def test_a_bad_mark_name_is_invalid_argument_naming_text_mark(server):
    with pytest.raises(grpc.RpcError) as err:
        streamed(server.target, [tts_pb2.TextInput(text="hi", mark="x" * 257)], _config(), WAIT_S)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert bad_request_field(err.value) == "text.mark"


def test_grpcurl_shows_the_mark_event(server):
    messages = [
        {"config": {"sampling": {"seed": 1, "minNewTokens": 4, "maxNewTokens": 4}}},
        {"text": {"text": "Hello from grpcurl", "mark": "said-hello"}},
    ]
    replies = grpcurl_streamed(server.target, messages, 120)
    audio = [r["audio"] for r in replies if "audio" in r]
    (mark,) = [r["mark"] for r in replies if "mark" in r]
    assert mark["name"] == "said-hello"
    assert int(mark["sample_offset"]) == sum(a["num_samples"] for a in audio) > 0
    assert "mark" in replies[-1]
    end = [r["utterance_end"] for r in replies if "utterance_end" in r][0]
    assert end["source_text"] == "Hello from grpcurl"


def test_websocket_answers_marks_in_order(server):
    sampling = {"seed": 1, "min_new_tokens": 4, "max_new_tokens": 4}
    messages = [
        {"type": "config", "voice": "alloy", "sampling": sampling},
        {"type": "text", "text": "Hello there", "mark": "a"},
        {"type": "mark", "name": "b"},
        {"type": "end"},
    ]
    out = websocket_messages(server, messages, WAIT_S)
    audio_bytes = sum(len(m) for m in out if isinstance(m, bytes))
    marks = [m for m in out if isinstance(m, dict) and m["type"] == "mark"]
    assert [m["name"] for m in marks] == ["a", "b"]
    # LINEAR16 at the model's rate: two bytes a sample.
    assert marks[0]["sample_offset"] == marks[1]["sample_offset"] == audio_bytes // 2
    assert marks[0]["dropped"] is False
    end = [m for m in out if isinstance(m, dict) and m["type"] == "utterance_end"][0]
    assert end["source_text"] == "Hello there" and end["num_samples"] == audio_bytes // 2


def test_a_clear_answers_the_marks_it_dropped_at_the_cut(server):
    inputs = [
        tts_pb2.TextInput(text="A long first sentence", mark="one"),
        tts_pb2.TextInput(text=" and a second", mark="two"),
    ]
    clear = tts_pb2.TextInput(text="Stop", clear=True, mark="three")
    replies = barged_in(server.target, inputs, clear, _config(300), WAIT_S)
    kinds = [r.WhichOneof("response") for r in replies]
    marks = [r.mark for r in replies if r.HasField("mark")]
    ends = [r.utterance_end for r in replies if r.HasField("utterance_end")]
    assert [(m.name, m.dropped) for m in marks] == [("one", True), ("two", True), ("three", False)]
    cut = ends[0]
    assert cut.finish_reason == "cleared"
    at_cut = cut.sample_offset + cut.num_samples
    assert marks[0].sample_offset == marks[1].sample_offset == at_cut
    # The dropped marks come right after the cut utterance's end, before what follows.
    assert kinds.index("mark") == kinds.index("utterance_end") + 1
    assert [e.source_text for e in ends] == ["A long first sentence", "Stop"]
    assert marks[2].sample_offset == ends[1].sample_offset + ends[1].num_samples
