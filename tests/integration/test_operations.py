"""Operations against a real `chattts-server` subprocess: Prometheus metrics, the request log,
voice presets and lexicons and their SIGHUP reload, and one voice across the sentences of a
stream."""

from __future__ import annotations

import json
import queue
import re
import signal
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from chattts_proto.chattts.v1 import tts_pb2, tts_pb2_grpc
from chattts_server.text.pls import PLS_NAMESPACE
from polling import wait_for
from serverutil import ServerProcess, launch, wait_serving

MAX_STREAMS = 2
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")


def scrape(port: int) -> dict[str, float]:
    """Prometheus text format -> {'name{labels}': value} (labels exactly as exposed)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    samples: dict[str, float] = {}
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if m and not line.startswith("#"):
            samples[m.group(1) + (m.group(2) or "")] = float(m.group(3))
    return samples


def fixed(num_tokens: int, seed: int = 7, **config: object) -> tts_pb2.SynthesisConfig:
    return tts_pb2.SynthesisConfig(
        sampling=tts_pb2.Sampling(seed=seed, min_new_tokens=num_tokens, max_new_tokens=num_tokens),
        **config,
    )


def _write_preset(folder: Path, name: str, description: str, seed: int) -> None:
    (folder / f"{name}.json").write_text(
        json.dumps({"description": description, "seed": seed}), encoding="utf-8"
    )


def _write_lexicon(path: Path, alias: str) -> None:
    head = f'<lexicon version="1.0" xmlns="{PLS_NAMESPACE}" alphabet="ipa" xml:lang="en-US">'
    lexeme = f"<lexeme><grapheme>I-95</grapheme><alias>{alias}</alias></lexeme>"
    path.write_text(f'<?xml version="1.0" encoding="UTF-8"?>\n{head}\n{lexeme}\n</lexicon>\n')


@pytest.fixture(scope="module")
def ops_server(
    tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path, dev_model_cache: Path
) -> Iterator[ServerProcess]:
    voices = tmp_path_factory.mktemp("voices")
    _write_preset(voices, "anna", "calm, female", 1234)
    _write_preset(voices, "bob", "news reader", 4321)
    roads = tmp_path_factory.mktemp("lexicons") / "roads.pls"
    _write_lexicon(roads, "the old road")
    args = ["--max-streams", str(MAX_STREAMS), "--voices-dir", str(voices), "--grace-s", "2"]
    srv = launch([*args, "--lexicon", str(roads)], dev_model_cache)
    srv.voices = voices
    srv.roads = roads
    try:
        wait_serving(srv.target, timeout_s=120)
        yield srv
    finally:
        srv.stop()


@pytest.fixture
def stub(ops_server: ServerProcess) -> Iterator[tts_pb2_grpc.TextToSpeechStub]:
    with grpc.insecure_channel(ops_server.target) as channel:
        yield tts_pb2_grpc.TextToSpeechStub(channel)


def _synthesize(
    stub: tts_pb2_grpc.TextToSpeechStub, text: str, config: tts_pb2.SynthesisConfig
) -> tuple[list, list]:
    chunks, ends = [], []
    for reply in stub.Synthesize(tts_pb2.SynthesizeRequest(text=text, config=config), timeout=60):
        (chunks if reply.HasField("audio") else ends).append(
            reply.audio if reply.HasField("audio") else reply.utterance_end
        )
    return chunks, ends


def _delta(after: dict[str, float], before: dict[str, float], key: str) -> float:
    return after.get(key, 0.0) - before.get(key, 0.0)


def test_metrics_count_streams_tokens_and_latency(ops_server: ServerProcess, stub) -> None:
    before = scrape(ops_server.metrics_port)
    tokens = 0
    for n in (12, 16):
        _, ends = _synthesize(stub, "Metrics please.", fixed(n))
        tokens += sum(e.num_tokens for e in ends)
    assert tokens == 28

    after = scrape(ops_server.metrics_port)
    assert _delta(after, before, "chattts_time_to_first_audio_seconds_count") >= 2
    assert _delta(after, before, 'chattts_streams_total{method="Synthesize",status="OK"}') >= 2
    assert _delta(after, before, "chattts_audio_tokens_total") == tokens
    assert _delta(after, before, "chattts_audio_seconds_total") > 0
    assert _delta(after, before, "chattts_real_time_factor_count") == 2
    assert _delta(after, before, 'chattts_streams_started_total{method="Synthesize"}') == 2
    assert _delta(after, before, "chattts_utterance_lag_seconds_count") == 2
    assert _delta(after, before, 'chattts_utterances_total{finish_reason="max_tokens"}') == 2
    assert after["chattts_kv_slots_total"] == MAX_STREAMS
    assert after["chattts_active_streams"] == 0
    assert after["chattts_queued_streams"] == 0
    assert after["chattts_kv_slots_in_use"] == 0


def test_invalid_argument_after_admission_is_counted_by_status(
    ops_server: ServerProcess, stub
) -> None:
    before = scrape(ops_server.metrics_port)
    # Refused mid-stream, after admission (a structural token after the config; whitespace
    # alone is valid text in a stream).
    requests = [
        tts_pb2.StreamingSynthesizeRequest(config=fixed(8)),
        tts_pb2.StreamingSynthesizeRequest(text=tts_pb2.TextInput(text="Hi [Stts] there.")),
    ]
    with pytest.raises(grpc.RpcError) as info:
        list(stub.StreamingSynthesize(iter(requests), timeout=10))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    after = scrape(ops_server.metrics_port)
    key = 'chattts_streams_total{method="StreamingSynthesize",status="INVALID_ARGUMENT"}'
    assert _delta(after, before, key) == 1
    assert _delta(after, before, 'chattts_streams_started_total{method="StreamingSynthesize"}') == 1


def test_invalid_argument_before_admission_is_counted_by_status(
    ops_server: ServerProcess, stub
) -> None:
    before = scrape(ops_server.metrics_port)
    with pytest.raises(grpc.RpcError) as info:
        list(stub.Synthesize(tts_pb2.SynthesizeRequest(text=""), timeout=10))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    after = scrape(ops_server.metrics_port)
    assert (
        _delta(
            after, before, 'chattts_streams_total{method="Synthesize",status="INVALID_ARGUMENT"}'
        )
        == 1
    )


def _request_log_lines(ops_server: ServerProcess) -> list[str]:
    return [line for line in ops_server.log if "stream method=Synthesize status=OK" in line]


def test_one_log_line_per_request(ops_server: ServerProcess, stub) -> None:
    already = len(_request_log_lines(ops_server))
    _synthesize(stub, "Log me.", fixed(10))
    lines = wait_for(
        lambda: _request_log_lines(ops_server), lambda ls: len(ls) > already, 5, "the log line"
    )
    assert len(lines) == already + 1, ops_server.log_text()[-2000:]
    line = lines[-1]
    assert re.search(r"ttfa_ms=\d+ ", line) and re.search(r"rtf=\d+\.\d+", line), line
    assert "tokens=10 " in line, line


def _voice_names(stub) -> dict[str, str]:
    return {
        v.name: v.description
        for v in stub.ListVoices(tts_pb2.ListVoicesRequest(), timeout=10).voices
    }


def test_voice_presets_list_synthesize_and_reload_on_sighup(
    ops_server: ServerProcess, stub
) -> None:
    assert _voice_names(stub) == {"anna": "calm, female", "bob": "news reader"}
    chunks, ends = _synthesize(stub, "Preset voice.", fixed(10, voice=tts_pb2.Voice(preset="anna")))
    assert chunks and ends[0].num_tokens == 10

    with pytest.raises(grpc.RpcError) as info:
        _synthesize(stub, "Nobody.", fixed(10, voice=tts_pb2.Voice(preset="nobody")))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT

    _write_preset(ops_server.voices, "carol", "added later", 99)
    ops_server.proc.send_signal(signal.SIGHUP)
    names = wait_for(lambda: _voice_names(stub), lambda n: "carol" in n, 10, "the reload")
    assert names == {"anna": "calm, female", "bob": "news reader", "carol": "added later"}
    chunks, _ = _synthesize(stub, "New voice.", fixed(8, voice=tts_pb2.Voice(preset="carol")))
    assert chunks
    assert ops_server.proc.poll() is None  # SIGHUP reloads; it does not stop the server


def _read(stub: tts_pb2_grpc.TextToSpeechStub, text: str) -> str:
    """What the engine read for `text`."""
    return " ".join(end.text for end in _synthesize(stub, text, fixed(8))[1])


def test_lexicons_reload_on_sighup_all_or_none(ops_server: ServerProcess, stub) -> None:
    """New streams read through the files as SIGHUP found them; a stream accepted before keeps
    its lexicons; a file that no longer loads is logged by line and the last good ones stay."""
    assert "the old road" in _read(stub, "Take I-95.")
    texts: queue.Queue[str | None] = queue.Queue()

    def requests() -> Iterator[tts_pb2.StreamingSynthesizeRequest]:
        yield tts_pb2.StreamingSynthesizeRequest(config=fixed(8))
        while (text := texts.get(timeout=60)) is not None:
            yield tts_pb2.StreamingSynthesizeRequest(text=tts_pb2.TextInput(text=text, flush=True))

    older = stub.StreamingSynthesize(requests(), timeout=120)
    ends = (r.utterance_end.text for r in older if r.HasField("utterance_end"))
    texts.put("Hello.")
    assert "Hello" in next(ends)  # accepted, with the lexicons of that moment

    _write_lexicon(ops_server.roads, "the new road")
    ops_server.proc.send_signal(signal.SIGHUP)
    wait_for(lambda: _read(stub, "Take I-95."), lambda r: "the new road" in r, 30, "the reload")
    texts.put("Take I-95.")
    assert "the old road" in next(ends)
    texts.put(None)
    assert list(ends) == []

    ops_server.roads.write_text(
        ops_server.roads.read_text().replace("<alias>the new road</alias>", "<phoneme>x</phoneme>")
    )
    already = len(ops_server.log)
    ops_server.proc.send_signal(signal.SIGHUP)
    (line, *_) = wait_for(
        lambda: [line for line in ops_server.log[already:] if "loaded before are kept" in line],
        bool,
        30,
        "the failed reload's log line",
    )
    assert f"{ops_server.roads} line 3" in line and "ChatTTS cannot speak phonemes" in line, line
    assert "the new road" in _read(stub, "Take I-95.")
    assert ops_server.proc.poll() is None


def test_one_voice_across_the_sentences_of_a_stream(stub) -> None:
    """Each sentence is its own generation with the stream's voice and sampling seed, so the same
    sentence twice in one stream gives the same audio twice."""
    config = fixed(12, seed=11, voice=tts_pb2.Voice(seed=2222))

    def requests():
        yield tts_pb2.StreamingSynthesizeRequest(config=config)
        yield tts_pb2.StreamingSynthesizeRequest(
            text=tts_pb2.TextInput(text="Same words here. Same words here.", flush=True)
        )

    audio: dict[int, bytes] = {}
    ends = []
    for reply in stub.StreamingSynthesize(requests(), timeout=60):
        if reply.HasField("audio"):
            audio[reply.audio.utterance_index] = (
                audio.get(reply.audio.utterance_index, b"") + reply.audio.audio
            )
        else:
            ends.append(reply.utterance_end)
    assert [e.utterance_index for e in ends] == [0, 1]
    assert ends[0].text == ends[1].text
    assert audio[0] and audio[0] == audio[1]
