"""Replaceable and expiring segments, and captions that keep up, through the real server: the
generated gRPC stubs, grpcurl running the README's examples as written, and the WebSocket.

- a segment replaced before it starts is never spoken: only the new text is, in its place;
- one replaced while speaking: CUT stops it within a chunk and the new text follows, FINISH
  lets it end first, DROP_NEW speaks nothing new;
- one that cannot start in time (waiting for admission behind another stream) expires unspoken;
- a caption stream over its lag limits is sped up, then has whole utterances skipped;
- bad segment fields and lag limits are INVALID_ARGUMENT naming the field.
"""

from __future__ import annotations

import json
import re
import threading
import time
from pathlib import Path

import grpc
import pytest

from chattts_proto.chattts.v1 import tts_pb2, tts_pb2_grpc
from httputil import http_server
from serverutil import bad_request_field
from streaming_calls import (
    AUTH,
    grpcurl_streamed,
    sent_while_speaking,
    streamed,
    websocket_messages,
)

WAIT_S = 60.0
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def server(tiny_model_dir, tmp_path_factory):
    with http_server(tmp_path_factory.mktemp("segments"), max_streams=1, max_queue=2) as srv:
        yield srv


def _config(num_tokens: int, **fields) -> tts_pb2.SynthesisConfig:
    return tts_pb2.SynthesisConfig(
        voice=tts_pb2.Voice(seed=3),
        sampling=tts_pb2.Sampling(seed=1, min_new_tokens=num_tokens, max_new_tokens=num_tokens),
        chunking=tts_pb2.Chunking(first_chunk_tokens=2, max_chunk_tokens=4, lookahead_tokens=0),
        text_format=tts_pb2.PLAIN,
        **fields,
    )


def _segment_ends(replies) -> list[tuple[str, int, str]]:
    return [
        (
            r.segment_end.name,
            r.segment_end.revision,
            tts_pb2.SegmentOutcome.Name(r.segment_end.outcome),
        )
        for r in replies
        if r.HasField("segment_end")
    ]


def _ends(replies) -> list[tts_pb2.UtteranceEnd]:
    return [r.utterance_end for r in replies if r.HasField("utterance_end")]


def _check_timeline(replies) -> None:
    """Chunks contiguous; every segment end at the samples sent before it."""
    sent = 0
    for r in replies:
        if r.HasField("audio"):
            assert r.audio.sample_offset == sent
            sent += r.audio.num_samples
        elif r.HasField("segment_end"):
            assert r.segment_end.sample_offset == sent
            assert r.segment_end.offset_s == pytest.approx(sent / 24000)


def test_a_segment_replaced_before_it_starts_is_never_spoken(server):
    inputs = [
        tts_pb2.TextInput(text="Keep going straight on.", flush=True),
        tts_pb2.TextInput(text="In 300 m, turn left.", segment="turn"),
        tts_pb2.TextInput(text="In 100 m, turn left.", replace="turn"),
    ]
    replies = streamed(server.target, inputs, _config(8), WAIT_S)
    _check_timeline(replies)
    assert _segment_ends(replies) == [
        ("turn", 0, "SEGMENT_REPLACED"),
        ("turn", 1, "SEGMENT_SPOKEN"),
    ]
    spoken = [e.source_text for e in _ends(replies)]
    assert spoken == ["Keep going straight on.", "In 100 m, turn left."]
    # The new text took the old one's place: right after the replaced revision's end.
    kinds = [r.WhichOneof("response") for r in replies]
    replaced_at = kinds.index("segment_end")
    assert "utterance_end" not in kinds[replaced_at + 1 : -1] or spoken[-1].startswith("In 100")


def _replaced_while_speaking(target: str, how: int, num_tokens: int = 48):
    """A prompt, then, once its second chunk has come back, its replacement with `how`."""
    prompt = tts_pb2.TextInput(text="In 300 m, turn left onto Main Street.", segment="p")
    replace = tts_pb2.TextInput(text="Turn left now.", replace="p", if_started=how)
    inputs = [prompt, tts_pb2.TextInput(flush=True)]
    return sent_while_speaking(target, inputs, replace, _config(num_tokens), WAIT_S, after_chunks=2)


def test_cut_stops_the_speaking_prompt_and_the_update_follows(server):
    replies = _replaced_while_speaking(server.target, tts_pb2.CUT)
    _check_timeline(replies)
    assert _segment_ends(replies) == [("p", 0, "SEGMENT_CUT"), ("p", 1, "SEGMENT_SPOKEN")]
    old, new = _ends(replies)
    assert old.finish_reason == "cut"
    whole = 48 * 512
    assert 0 < old.num_samples < whole, "the prompt was stopped part way"
    assert new.source_text == "Turn left now." and new.num_tokens == 48
    cut = [r.segment_end for r in replies if r.HasField("segment_end")][0]
    assert cut.sample_offset == old.sample_offset + old.num_samples


def test_finish_lets_the_prompt_end_then_speaks_the_update(server):
    replies = _replaced_while_speaking(server.target, tts_pb2.FINISH)
    assert _segment_ends(replies) == [("p", 0, "SEGMENT_SPOKEN"), ("p", 1, "SEGMENT_SPOKEN")]
    old, new = _ends(replies)
    assert old.num_tokens == new.num_tokens == 48
    assert old.num_samples == new.num_samples > 0


def test_drop_new_speaks_nothing_new_while_the_prompt_speaks(server):
    replies = _replaced_while_speaking(server.target, tts_pb2.DROP_NEW)
    assert _segment_ends(replies) == [("p", 0, "SEGMENT_SPOKEN"), ("p", 1, "SEGMENT_NOT_SPOKEN")]
    assert [e.source_text for e in _ends(replies)] == ["In 300 m, turn left onto Main Street."]


def test_a_prompt_that_cannot_start_in_time_expires_unspoken(server):
    """max_streams=1: the prompt's stream waits for admission behind a long one, past its
    expiry; once admitted, the prompt is dropped and the stream's later text is spoken."""
    busy_started = threading.Event()
    result: dict[str, list] = {}

    def busy() -> None:
        config = tts_pb2.StreamingSynthesizeRequest(config=_config(160))
        text = tts_pb2.StreamingSynthesizeRequest(
            text=tts_pb2.TextInput(text="A long caption.", flush=True)
        )
        with grpc.insecure_channel(server.target) as channel:
            stub = tts_pb2_grpc.TextToSpeechStub(channel)
            for _ in stub.StreamingSynthesize(iter([config, text]), timeout=WAIT_S, metadata=AUTH):
                busy_started.set()
        result["busy"] = []

    thread = threading.Thread(target=busy)
    thread.start()
    assert busy_started.wait(WAIT_S)
    inputs = [
        tts_pb2.TextInput(text="Turn left now.", segment="now", expires_in_ms=300, flush=True),
        tts_pb2.TextInput(text="Then continue.", flush=True),
    ]
    replies = streamed(server.target, inputs, _config(8), WAIT_S)
    thread.join()
    assert _segment_ends(replies) == [("now", 0, "SEGMENT_EXPIRED")]
    assert [e.source_text for e in _ends(replies)] == ["Then continue."]
    first_kind = next(r.WhichOneof("response") for r in replies)
    assert first_kind == "segment_end", "nothing of the expired prompt came first"


def test_a_caption_stream_over_its_lag_limits_speeds_up_then_skips(server):
    words = [
        "so",
        "what",
        "we",
        "are",
        "seeing",
        "here",
        "is",
        "that",
        "the",
        "traffic",
        "is",
        "building",
        "up",
        "again",
    ]
    inputs = [tts_pb2.TextInput(text=f"{' '.join(words[:4])} number {k}. ") for k in range(10)]
    inputs.append(tts_pb2.TextInput(flush=True))
    replies = streamed(server.target, inputs, _config(48, max_lag_s=1.0, hard_lag_s=4.0), WAIT_S)
    _check_timeline(replies)
    ends = _ends(replies)
    reasons = [e.finish_reason for e in ends]
    assert reasons[-1] != "skipped", "the newest text is never skipped for lag"
    skipped = [e for e in ends if e.finish_reason == "skipped"]
    assert skipped, reasons
    assert all(e.num_samples == 0 and e.source_text and e.text for e in skipped)
    spoken = [e for e in ends if e.finish_reason != "skipped"]
    # All the text came at once, so every utterance after the first waits at least the first's
    # audio (about 1 s, over max_lag_s) and is sped up, however fast the machine is.
    assert all(e.speed == 5 or e.utterance_index > 0 for e in spoken)
    assert all(5 < e.speed <= 8 for e in spoken[1:]), [e.speed for e in spoken]
    # Without limits nothing is skipped or sped up.
    plain = _ends(streamed(server.target, inputs[:4] + inputs[-1:], _config(48), WAIT_S))
    assert {e.finish_reason for e in plain} == {"max_tokens"}
    assert {e.speed for e in plain} == {5}
    assert plain[-1].lag_s > plain[0].lag_s


def test_segment_outcomes_are_counted_in_the_metrics(server):
    registry = server.server.metrics.registry

    def count(outcome: str) -> float:
        return registry.get_sample_value("chattts_segments_total", {"outcome": outcome}) or 0.0

    before = {k: count(k) for k in ("spoken", "replaced", "cut")}
    inputs = [
        tts_pb2.TextInput(text="In 300 m, turn left.", segment="turn", flush=True),
        tts_pb2.TextInput(text="In 100 m, turn left.", replace="turn"),
    ]
    streamed(server.target, inputs, _config(4), WAIT_S)
    assert count("spoken") - before["spoken"] == 1
    assert count("replaced") + count("cut") - before["replaced"] - before["cut"] == 1


def test_a_paced_stream_runs_no_further_ahead_of_the_listener_than_its_lead(server):
    """pace_lead_s 0.3: a 2 s utterance arrives over about 1.7 s, never more than the lead
    (plus a chunk and scheduling slack) ahead of a listener who started at its first chunk."""
    config = _config(96, pace_lead_s=0.3)
    arrivals: list[tuple[float, float]] = []  # (arrival, audio seconds before the chunk)
    requests = [
        tts_pb2.StreamingSynthesizeRequest(config=config),
        tts_pb2.StreamingSynthesizeRequest(
            text=tts_pb2.TextInput(text="In 300 m, turn left onto Main Street.", flush=True)
        ),
    ]
    sent_s = 0.0
    with grpc.insecure_channel(server.target) as channel:
        stub = tts_pb2_grpc.TextToSpeechStub(channel)
        for r in stub.StreamingSynthesize(iter(requests), timeout=WAIT_S, metadata=AUTH):
            if r.HasField("audio"):
                arrivals.append((time.monotonic(), sent_s))
                sent_s += r.audio.num_samples / 24000
    first = arrivals[0][0]
    chunk_s = 4 * 512 / 24000
    assert sent_s > 1.9
    assert all(before - (at - first) <= 0.3 + chunk_s + 0.25 for at, before in arrivals)
    assert arrivals[-1][0] - first >= sent_s - 0.3 - 2 * chunk_s


def test_with_pacing_a_cut_finds_the_prompt_the_listener_is_hearing(server):
    """Paced, a prompt's audio is not all sent while it is heard: a CUT half a second into it
    stops it, where an unpaced server may have sent it all already."""
    prompt = tts_pb2.TextInput(text="In 300 m, turn left.", segment="p", flush=True)
    cut = tts_pb2.TextInput(text="Turn left now.", replace="p", if_started=tts_pb2.CUT)
    config = _config(96, pace_lead_s=0.3)
    replies = sent_while_speaking(server.target, [prompt], cut, config, WAIT_S, delay_s=0.5)
    _check_timeline(replies)
    assert _segment_ends(replies) == [("p", 0, "SEGMENT_CUT"), ("p", 1, "SEGMENT_SPOKEN")]
    old, new = _ends(replies)
    assert old.finish_reason == "cut" and 0 < old.num_samples < 96 * 512 * 0.8
    assert new.num_tokens == 96


@pytest.mark.parametrize(
    ("text_input", "field"),
    [
        (tts_pb2.TextInput(text="x", segment="a", replace="a"), "text.replace"),
        (tts_pb2.TextInput(text="x", expires_in_ms=100), "text.expires_in_ms"),
        (tts_pb2.TextInput(text="x", segment="a" * 300), "text.segment"),
        (tts_pb2.TextInput(text="x", replace="b", expires_in_ms=4_000_000), "text.expires_in_ms"),
    ],
)
def test_bad_segment_fields_are_invalid_argument_naming_them(server, text_input, field):
    with pytest.raises(grpc.RpcError) as err:
        streamed(server.target, [text_input], _config(2), WAIT_S)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert bad_request_field(err.value) == field


def test_naming_an_unfinished_segment_again_is_invalid_argument(server):
    inputs = [
        tts_pb2.TextInput(text="first", segment="a"),
        tts_pb2.TextInput(text="second", segment="a"),
    ]
    with pytest.raises(grpc.RpcError) as err:
        streamed(server.target, inputs, _config(2), WAIT_S)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert bad_request_field(err.value) == "text.segment"
    assert "replace" in err.value.details()


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"max_lag_s": 0.1}, "config.max_lag_s"),
        ({"max_lag_s": 3.0, "hard_lag_s": 2.0}, "config.hard_lag_s"),
        ({"hard_lag_s": 2.0}, "config.hard_lag_s"),
        ({"max_lag_s": 3.0, "catch_up_max_speed": 10}, "config.catch_up_max_speed"),
        ({"pace_lead_s": 0.0}, "config.pace_lead_s"),
        ({"pace_lead_s": 100.0}, "config.pace_lead_s"),
    ],
)
def test_bad_lag_limits_are_invalid_argument_naming_them(server, fields, field):
    with pytest.raises(grpc.RpcError) as err:
        streamed(server.target, [tts_pb2.TextInput(text="x")], _config(2, **fields), WAIT_S)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert bad_request_field(err.value) == field


def test_websocket_replace_and_segment_end(server):
    sampling = {"seed": 1, "min_new_tokens": 4, "max_new_tokens": 4}
    messages = [
        {"type": "config", "sampling": sampling, "text_format": "PLAIN"},
        {"type": "text", "text": "Keep going.", "flush": True},
        {"type": "text", "text": "In 300 m, turn left.", "segment": "turn", "expires_in_ms": 9000},
        {"type": "replace", "segment": "turn", "text": "In 100 m, turn left.", "if_started": "cut"},
        {"type": "end"},
    ]
    out = websocket_messages(server, messages, WAIT_S)
    ends = [m for m in out if isinstance(m, dict) and m.get("type") == "segment_end"]
    assert [(e["name"], e["revision"], e["outcome"]) for e in ends] == [
        ("turn", 0, "replaced"),
        ("turn", 1, "spoken"),
    ]
    utterances = [m for m in out if isinstance(m, dict) and m.get("type") == "utterance_end"]
    assert [u["source_text"] for u in utterances] == ["Keep going.", "In 100 m, turn left."]
    assert all("lag_s" in u and u["speed"] == 5 for u in utterances)


def test_websocket_bad_if_started_is_refused_naming_it(server):
    messages = [
        {"type": "config", "text_format": "PLAIN"},
        {"type": "replace", "segment": "turn", "text": "x", "if_started": "sometimes"},
    ]
    out = websocket_messages(server, messages, WAIT_S)
    errors = [m for m in out if isinstance(m, dict) and m.get("type") == "error"]
    assert errors and errors[0]["error"]["param"] == "if_started"


def _readme_example(name: str) -> list[dict]:
    """The JSON messages of the README's grpcurl example `name`, as a user pastes them."""
    readme = (REPO / "README.md").read_text()
    block = re.search(
        rf"<!-- readme-example: {name} -->\n```sh\n(grpcurl [^\n]*<<'EOF'\n)(.*?)\nEOF\n```",
        readme,
        re.S,
    )
    assert block, f"README has no example {name!r}"
    assert "StreamingSynthesize" in block.group(1)
    return [json.loads(line) for line in block.group(2).splitlines()]


def _short(messages: list[dict]) -> list[dict]:
    """The README's messages with short utterances (the tiny model says noise at any length)."""
    config = messages[0]["config"]
    config["sampling"] = {"seed": 1, "minNewTokens": 40, "maxNewTokens": 40}
    return messages


def test_the_readme_navigation_example_runs_as_written(server):
    replies = grpcurl_streamed(server.target, _short(_readme_example("navigation")), 300)
    ends = [r["segment_end"] for r in replies if "segment_end" in r]
    outcomes = [(e["name"], e.get("revision", 0), e["outcome"]) for e in ends]
    # Sent together, the update nearly always lands before the prompt's first audio
    # (REPLACED); on a slow day the first words have begun and are cut (CUT).
    assert outcomes[0] in (("turn-7", 0, "SEGMENT_REPLACED"), ("turn-7", 0, "SEGMENT_CUT"))
    assert outcomes[1:] == [("turn-7", 1, "SEGMENT_SPOKEN")]
    heard = [
        r["utterance_end"]["source_text"]
        for r in replies
        if "utterance_end" in r and int(r["utterance_end"].get("num_samples", 0)) > 0
    ]
    assert heard[-1] == "In 100 m, turn left onto Zhongguancun Street."
    if outcomes[0][2] == "SEGMENT_REPLACED":
        assert heard == ["In 100 m, turn left onto Zhongguancun Street."]


def test_the_readme_captions_example_runs_as_written(server):
    replies = grpcurl_streamed(server.target, _short(_readme_example("captions")), 300)
    ends = [r["utterance_end"] for r in replies if "utterance_end" in r]
    assert all("lag_s" in e for e in ends[1:])
    reasons = [e["finish_reason"] for e in ends]
    assert "skipped" in reasons or any(e.get("speed", 5) > 5 for e in ends), reasons
