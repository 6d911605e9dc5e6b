"""Word timing (SynthesisConfig.word_timing) through the real server, on the text front end's hard
cases (TN: `200 m`, `500元`, `3:45 PM`, `I-95`; markdown, links, mixed zh/en): over gRPC
StreamingSynthesize and Synthesize (generated stubs), the WebSocket, and POST /v1/audio/speech
with SSE from the openai SDK; and barge-in: the cut utterance's end says how much of it was sent
and its words stop at the cut.

For every utterance: its WordTimings come before its UtteranceEnd; each spoken word of the
caller's text has exactly one timing (the caller's words under the words' spans are the words of
the utterance's own text, in order), in order, without overlap, inside the utterance's audio;
and each span points into the caller's text (the text at the span is the word's source_text).
"""

from __future__ import annotations

import re

import grpc
import pytest

from chattts_proto.chattts.v1 import tts_pb2, tts_pb2_grpc
from httputil import http_server, sdk_sse_events
from streaming_calls import AUTH, barged_in, streamed, websocket_messages

WAIT_S = 240.0
"""Bounds every call: eight utterances take ~20 s on a quiet 2-core machine, minutes at load 20."""
RATE = 24000
NUM_TOKENS = 40
CASES = [
    "In 200 m turn left.",
    "前方500元右转。",
    "Meet at 3:45 PM today.",
    "Take the I-95 north.",
    "**Step 1:** Open the *Wi-Fi* settings.",
    "Read [the docs](https://example.com/docs) or https://example.com/a now.",
    "请访问 https://example.com/docs 查看详情。",
    "前方500米 turn left 进入 I-95。",
]
_TOKEN = re.compile(r"[\u3400-\u9fff]|[^\W_\u3400-\u9fff]+")


@pytest.fixture(scope="module")
def server(tiny_model_dir, tmp_path_factory):
    """gRPC and HTTP on one server for this file."""
    with http_server(tmp_path_factory.mktemp("timing"), max_streams=2, max_queue=2) as srv:
        yield srv


def _config(num_tokens: int = NUM_TOKENS, word_timing: bool = True) -> tts_pb2.SynthesisConfig:
    return tts_pb2.SynthesisConfig(
        voice=tts_pb2.Voice(seed=3),
        sampling=tts_pb2.Sampling(seed=1, min_new_tokens=num_tokens, max_new_tokens=num_tokens),
        text_release=tts_pb2.TextReleasePolicy(first_words=0, max_words=0, clause_min_words=0),
        word_timing=word_timing,
    )


def _tokens(text: str) -> list[str]:
    return _TOKEN.findall(text)


def check_utterance(caller: str, words: list, end) -> None:
    """One utterance's word timings against its end and the caller's text (protobuf messages
    or the JSON messages, which have the same field names)."""

    def get(m, name):
        return m[name] if isinstance(m, dict) else getattr(m, name)

    first, last = (
        int(get(end, "sample_offset")),
        int(get(end, "sample_offset")) + int(get(end, "num_samples")),
    )
    at = first
    for w in words:
        start, stop = int(get(w, "start_sample")), int(get(w, "end_sample"))
        assert at <= start <= stop <= last, (w, first, last)
        assert get(w, "start_s") == pytest.approx(start / RATE)
        assert get(w, "end_s") == pytest.approx(stop / RATE)
        at = stop
        if get(w, "has_source"):
            a, b = get(w, "source_start"), get(w, "source_end")
            assert caller[a:b] == get(w, "source_text") != ""
    spans = [(get(w, "source_start"), get(w, "source_end")) for w in words if get(w, "has_source")]
    assert all(b <= c for (_, b), (c, _) in zip(spans, spans[1:], strict=False)), "overlap"
    heard = [t for w in words if get(w, "has_source") for t in _tokens(get(w, "source_text"))]
    assert heard == _tokens(get(end, "source_text")), "each spoken word once, in order"
    assert words, "an utterance with text has words"


def _by_utterance(replies) -> list[tuple[list, object]]:
    """(words, end) per utterance; the timings came right before their end."""
    out, pending = [], None
    for r in replies:
        kind = r.WhichOneof("response")
        if kind == "word_timings":
            assert pending is None
            pending = r.word_timings
            assert pending.source == tts_pb2.TIMING_ESTIMATE
        elif kind == "utterance_end":
            assert (
                pending is not None and pending.utterance_index == r.utterance_end.utterance_index
            )
            out.append((list(pending.words), r.utterance_end))
            pending = None
        elif kind == "audio":
            assert pending is None, "timings come after the utterance's audio"
    return out


def test_streamed_words_are_timed_once_in_order_inside_their_audio(server):
    inputs = [tts_pb2.TextInput(text=case + "\n", flush=True) for case in CASES]
    caller = "".join(t.text for t in inputs)
    utterances = _by_utterance(streamed(server.target, inputs, _config(), WAIT_S))
    assert len(utterances) >= len(CASES)
    for words, end in utterances:
        check_utterance(caller, words, end)
    by_source = {w.source_text: w.text for words, _ in utterances for w in words}
    assert "hundred" in by_source["200 m"]  # spoken as words, shown as sent
    assert "五百" in "".join(v for k, v in by_source.items() if "500" in k)


@pytest.mark.parametrize("case", CASES[:4])
def test_synthesize_sends_word_timings_too(server, case):
    with grpc.insecure_channel(server.target) as channel:
        stub = tts_pb2_grpc.TextToSpeechStub(channel)
        request = tts_pb2.SynthesizeRequest(text=case, config=_config())
        replies = list(stub.Synthesize(request, timeout=WAIT_S, metadata=AUTH))
    utterances = _by_utterance(replies)
    assert utterances
    for words, end in utterances:
        check_utterance(case, words, end)


def test_without_the_option_no_timings_are_sent(server):
    inputs = [tts_pb2.TextInput(text="In 200 m turn left.")]
    replies = streamed(server.target, inputs, _config(8, False), WAIT_S)
    kinds = {r.WhichOneof("response") for r in replies}
    assert kinds == {"audio", "utterance_end"}


def test_barge_in_says_what_was_sent_and_times_the_words_up_to_the_cut(server):
    text = "This is a long sentence that goes on and on about many things for a while."
    inputs = [tts_pb2.TextInput(text=text, flush=True)]
    clear = tts_pb2.TextInput(text="Stop.", clear=True)
    replies = barged_in(server.target, inputs, clear, _config(300), WAIT_S)
    utterances = _by_utterance(replies)
    (cut_words, cut), (_, after) = utterances
    assert cut.finish_reason == "cleared"
    sent = sum(
        r.audio.num_samples
        for r in replies
        if r.HasField("audio") and r.audio.utterance_index == cut.utterance_index
    )
    assert cut.num_samples == sent > 0
    assert cut.num_samples < 300 * 512  # cut well before its 300 tokens
    assert cut_words and cut_words[-1].end_sample <= cut.sample_offset + cut.num_samples
    assert all(w.start_sample < cut.sample_offset + cut.num_samples for w in cut_words)
    assert [w.source_text for w in cut_words] == text.split()[: len(cut_words)]
    assert after.sample_offset == cut.sample_offset + cut.num_samples
    assert after.source_text == "Stop."


def test_websocket_sends_word_timings_messages(server):
    sampling = {"seed": 1, "min_new_tokens": NUM_TOKENS, "max_new_tokens": NUM_TOKENS}
    caller = "Meet at 3:45 PM today."
    messages = [
        {"type": "config", "voice": "alloy", "sampling": sampling, "word_timing": True},
        {"type": "text", "text": caller, "flush": True},
        {"type": "end"},
    ]
    out = websocket_messages(server, messages, WAIT_S)
    kinds = [m["type"] for m in out if isinstance(m, dict)]
    assert kinds[:2] == ["word_timings", "utterance_end"]
    timings, end = [m for m in out if isinstance(m, dict)][:2]
    assert timings["source"] == "estimate"
    check_utterance(caller, timings["words"], end)


def test_sse_sends_word_timings_beside_the_audio_from_the_openai_sdk(server):
    caller = "Take the I-95 north."
    chattts = {**_sse_sampling(), "word_timing": True}
    events = sdk_sse_events(server, caller, chattts, WAIT_S)
    kinds = [e["type"] for e in events]
    assert kinds[0] == "speech.audio.delta" and kinds[-1] == "speech.audio.done"
    (timings,) = [e for e in events if e["type"] == "speech.word_timings"]
    assert kinds.index("speech.word_timings") > kinds.index("speech.audio.delta")
    words = timings["words"]
    assert [w["source_text"] for w in words][:2] == ["Take", "the"]
    assert all(caller[w["source_start"] : w["source_end"]] == w["source_text"] for w in words)
    assert all(a["end_sample"] <= b["start_sample"] for a, b in zip(words, words[1:], strict=False))


def _sse_sampling() -> dict:
    return {"sampling": {"seed": 1, "min_new_tokens": NUM_TOKENS, "max_new_tokens": NUM_TOKENS}}


def test_refined_text_keeps_its_words_in_the_callers_text(server):
    """The refine pass rewrites the text (on the random dev weights, into anything): the words
    it kept still point into the caller's text, the others say they came from none."""
    config = _config(NUM_TOKENS)
    config.prosody.refine_text = True
    caller = "In 200 m turn left."
    replies = streamed(server.target, [tts_pb2.TextInput(text=caller)], config, WAIT_S)
    for words, end in _by_utterance(replies):
        at = end.sample_offset
        for w in words:
            assert at <= w.start_sample <= w.end_sample <= end.sample_offset + end.num_samples
            at = w.end_sample
            if w.has_source:
                assert caller[w.source_start : w.source_end] == w.source_text
            else:
                assert (w.source_start, w.source_end, w.source_text) == (0, 0, "")
