"""The client library, WAV writer and CLI against a fake in-process TextToSpeech servicer.

The client is what is under test here; tests against the real server live elsewhere.
"""

from __future__ import annotations

import asyncio
import datetime
import io
import threading
from concurrent import futures
from dataclasses import dataclass, field

import grpc
import numpy as np
import pytest
import soundfile as sf

from chattts_client import (
    AsyncTTSClient,
    AudioChunkEvent,
    ClientOptions,
    MarkEvent,
    SynthesisOptions,
    TTSClient,
    UtteranceEndEvent,
    VoiceInfo,
    WavWriter,
    make_config,
    parse_voice,
    pcm16_to_float,
)
from chattts_client.cli import main
from chattts_proto.chattts.v1 import tts_pb2, tts_pb2_grpc

SAMPLE_RATE_HZ = 24000
NUM_CHUNKS = 3
CHUNK_SAMPLES = 2400  # 0.1 s
TOKEN = "s3cret"
CALL_TIMEOUT_S = 10.0


def _chunk_pcm(index: int) -> bytes:
    t = np.arange(CHUNK_SAMPLES) + index * CHUNK_SAMPLES
    return (np.sin(2 * np.pi * 440 * t / SAMPLE_RATE_HZ) * 8000).astype("<i2").tobytes()


EXPECTED_PCM = b"".join(_chunk_pcm(i) for i in range(NUM_CHUNKS))


@dataclass
class FakeServicer(tts_pb2_grpc.TextToSpeechServicer):
    """Answers every utterance with NUM_CHUNKS fixed LINEAR16 chunks and an UtteranceEnd."""

    metadata: list[dict[str, str]] = field(default_factory=list)
    synthesize_requests: list[tts_pb2.SynthesizeRequest] = field(default_factory=list)
    stream_requests: list[tts_pb2.StreamingSynthesizeRequest] = field(default_factory=list)

    def _responses(self, cls, utterance_index, text):  # type: ignore[no-untyped-def]
        offset = utterance_index * NUM_CHUNKS * CHUNK_SAMPLES
        for i in range(NUM_CHUNKS):
            yield cls(
                audio=tts_pb2.AudioChunk(
                    audio=_chunk_pcm(i),
                    sample_offset=offset + i * CHUNK_SAMPLES,
                    num_samples=CHUNK_SAMPLES,
                    utterance_index=utterance_index,
                    sample_rate_hz=SAMPLE_RATE_HZ,
                    encoding=tts_pb2.LINEAR16,
                )
            )
        yield cls(
            utterance_end=tts_pb2.UtteranceEnd(
                utterance_index=utterance_index,
                text=text,
                audio_duration_s=NUM_CHUNKS * CHUNK_SAMPLES / SAMPLE_RATE_HZ,
                time_to_first_audio_s=0.01,
                generation_time_s=0.02,
                num_tokens=14,
                finish_reason="eos",
            )
        )

    def Synthesize(self, request, context):  # type: ignore[no-untyped-def]
        self.metadata.append(dict(context.invocation_metadata()))
        self.synthesize_requests.append(request)
        if request.text == "fail":
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "text: rejected by fake")
        yield from self._responses(tts_pb2.SynthesizeResponse, 0, request.text)

    def StreamingSynthesize(self, request_iterator, context):  # type: ignore[no-untyped-def]
        self.metadata.append(dict(context.invocation_metadata()))
        utterance_index = 0
        for request in request_iterator:
            self.stream_requests.append(request)
            if request.WhichOneof("request") == "text":
                yield from self._responses(
                    tts_pb2.StreamingSynthesizeResponse, utterance_index, request.text.text
                )
                utterance_index += 1
                if request.text.mark:  # answered after the audio of the text before it
                    offset = utterance_index * NUM_CHUNKS * CHUNK_SAMPLES
                    yield tts_pb2.StreamingSynthesizeResponse(
                        mark=tts_pb2.Mark(
                            name=request.text.mark,
                            sample_offset=offset,
                            offset_s=offset / SAMPLE_RATE_HZ,
                        )
                    )

    def ListVoices(self, request, context):  # type: ignore[no-untyped-def]
        self.metadata.append(dict(context.invocation_metadata()))
        return tts_pb2.ListVoicesResponse(
            voices=[
                tts_pb2.VoiceInfo(name="alice", description="calm, female"),
                tts_pb2.VoiceInfo(name="bob", description="fast, male"),
            ]
        )


def _start_server(servicer: FakeServicer, credentials=None):  # type: ignore[no-untyped-def]
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    tts_pb2_grpc.add_TextToSpeechServicer_to_server(servicer, server)
    if credentials is None:
        port = server.add_insecure_port("127.0.0.1:0")
    else:
        port = server.add_secure_port("127.0.0.1:0", credentials)
    server.start()
    return server, port


@pytest.fixture
def fake():  # type: ignore[no-untyped-def]
    servicer = FakeServicer()
    server, port = _start_server(servicer)
    yield servicer, f"127.0.0.1:{port}"
    server.stop(grace=None)


def _check_synthesize_events(events: list) -> None:  # type: ignore[type-arg]
    assert [type(e) for e in events] == [AudioChunkEvent] * NUM_CHUNKS + [UtteranceEndEvent]
    chunks = events[:NUM_CHUNKS]
    assert [c.sample_offset for c in chunks] == [0, CHUNK_SAMPLES, 2 * CHUNK_SAMPLES]
    assert all(c.encoding == "LINEAR16" and c.sample_rate_hz == SAMPLE_RATE_HZ for c in chunks)
    assert b"".join(c.audio for c in chunks) == EXPECTED_PCM
    end = events[-1]
    assert end.text == "Hello." and end.finish_reason == "eos" and end.num_tokens == 14


# --- sync client ----------------------------------------------------------------------------


def test_synthesize_yields_events_in_order_with_stats_and_token(fake) -> None:  # type: ignore[no-untyped-def]
    servicer, target = fake
    config = make_config(voice="seed:7", speed=3)
    with TTSClient(target, token=TOKEN) as client:
        events_stream = client.synthesize("Hello.", config=config, timeout=CALL_TIMEOUT_S)
        events = list(events_stream)
    _check_synthesize_events(events)
    assert servicer.synthesize_requests[0].config.voice.seed == 7
    assert servicer.metadata[0]["authorization"] == f"Bearer {TOKEN}"
    stats = events_stream.stats
    assert stats.num_chunks == NUM_CHUNKS and stats.num_utterances == 1
    assert stats.audio_s == pytest.approx(0.3)
    assert stats.ttfa_ms is not None and 0 < stats.ttfa_ms <= stats.total_s * 1000
    assert stats.rtf == pytest.approx(stats.total_s / 0.3)


def test_no_token_sends_no_authorization(fake) -> None:  # type: ignore[no-untyped-def]
    servicer, target = fake
    with TTSClient(target) as client:
        assert [v.name for v in client.list_voices(timeout=CALL_TIMEOUT_S)] == ["alice", "bob"]
    assert "authorization" not in servicer.metadata[0]


def test_stream_sends_config_first_then_texts_as_they_arrive(fake) -> None:  # type: ignore[no-untyped-def]
    servicer, target = fake
    first_utterance_done = threading.Event()

    def texts():  # type: ignore[no-untyped-def]
        yield "one"
        # The second text is produced only after audio for the first came back, which needs
        # requests and responses to flow at the same time.
        if not first_utterance_done.wait(CALL_TIMEOUT_S):
            raise TimeoutError("no response before the request stream ended")
        yield "two"

    config = make_config(voice="alice", temperature=0.5)
    with TTSClient(target, token=TOKEN) as client:
        events = []
        for event in client.stream(texts(), config=config, flush_each=True, timeout=CALL_TIMEOUT_S):
            events.append(event)
            if isinstance(event, UtteranceEndEvent) and event.utterance_index == 0:
                first_utterance_done.set()

    kinds = [r.WhichOneof("request") for r in servicer.stream_requests]
    assert kinds == ["config", "text", "text"]
    assert servicer.stream_requests[0].config.voice.preset == "alice"
    assert servicer.stream_requests[0].config.sampling.temperature == pytest.approx(0.5)
    assert [(r.text.text, r.text.flush) for r in servicer.stream_requests[1:]] == [
        ("one", True),
        ("two", True),
    ]
    ends = [e for e in events if isinstance(e, UtteranceEndEvent)]
    assert [(e.utterance_index, e.text) for e in ends] == [(0, "one"), (1, "two")]
    offsets = [e.sample_offset for e in events if isinstance(e, AudioChunkEvent)]
    assert offsets == [i * CHUNK_SAMPLES for i in range(2 * NUM_CHUNKS)]
    assert servicer.metadata[0]["authorization"] == f"Bearer {TOKEN}"


def test_server_error_surfaces_as_rpc_error(fake) -> None:  # type: ignore[no-untyped-def]
    _, target = fake
    with TTSClient(target) as client, pytest.raises(grpc.RpcError) as info:
        list(client.synthesize("fail", timeout=CALL_TIMEOUT_S))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "rejected by fake" in info.value.details()


def test_constructor_rejects_inconsistent_credentials() -> None:
    with pytest.raises(ValueError, match="tls=True"):
        TTSClient(ca_cert=b"x")
    with pytest.raises(ValueError, match="together"):
        TTSClient(tls=True, client_cert=b"x")


# --- async client ---------------------------------------------------------------------------


def test_async_client_synthesize_stream_and_voices(fake) -> None:  # type: ignore[no-untyped-def]
    servicer, target = fake
    client = AsyncTTSClient(target, token=TOKEN)  # built outside the loop: channel is lazy

    async def texts():  # type: ignore[no-untyped-def]
        yield "one"
        yield "two"

    async def run():  # type: ignore[no-untyped-def]
        async with client:
            synth = client.synthesize("Hello.", timeout=CALL_TIMEOUT_S)
            events = [e async for e in synth]
            streamed = [
                e async for e in client.stream(texts(), flush_each=True, timeout=CALL_TIMEOUT_S)
            ]
            voices = await client.list_voices(timeout=CALL_TIMEOUT_S)
            return events, synth.stats, streamed, voices

    events, stats, streamed, voices = asyncio.run(asyncio.wait_for(run(), 2 * CALL_TIMEOUT_S))
    _check_synthesize_events(events)
    assert stats.num_chunks == NUM_CHUNKS and stats.ttfa_ms is not None
    assert [r.WhichOneof("request") for r in servicer.stream_requests] == ["config", "text", "text"]
    assert [e.text for e in streamed if isinstance(e, UtteranceEndEvent)] == ["one", "two"]
    assert voices == [VoiceInfo("alice", "calm, female"), VoiceInfo("bob", "fast, male")]
    assert all(m["authorization"] == f"Bearer {TOKEN}" for m in servicer.metadata)


def test_async_client_error_is_rpc_error(fake) -> None:  # type: ignore[no-untyped-def]
    _, target = fake

    async def run():  # type: ignore[no-untyped-def]
        async with AsyncTTSClient(target) as client:
            return [e async for e in client.synthesize("fail", timeout=CALL_TIMEOUT_S)]

    with pytest.raises(grpc.RpcError) as info:
        asyncio.run(run())
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT


# --- push stream ----------------------------------------------------------------------------


def test_push_stream_sends_each_call_as_it_is_made_and_yields_events(fake) -> None:  # type: ignore[no-untyped-def]
    """Text pushed after audio came back (requests and responses flow at once), a mark, a clear
    with a mark at the cut, end_input half-closes; the timeline keeps the text and events."""
    servicer, target = fake

    async def run():  # type: ignore[no-untyped-def]
        async with AsyncTTSClient(target, token=TOKEN) as client:
            stream = client.open_stream(config=make_config(voice="alice"), timeout=CALL_TIMEOUT_S)
            stream.push("one ")
            events = []
            async with stream:
                async for event in stream:
                    events.append(event)
                    if isinstance(event, UtteranceEndEvent) and event.text == "one ":
                        stream.mark("turn-1", "two ")
                    elif isinstance(event, MarkEvent) and event.name == "turn-1":
                        stream.flush()
                        stream.clear("three", mark="cut")
                    elif isinstance(event, UtteranceEndEvent) and event.text == "three":
                        stream.end_input()
                        stream.end_input()  # idempotent
                        with pytest.raises(RuntimeError, match="ended"):
                            stream.push("four")
            return events, stream

    events, stream = asyncio.run(asyncio.wait_for(run(), 2 * CALL_TIMEOUT_S))
    requests = servicer.stream_requests
    assert requests[0].config.voice.preset == "alice"
    sent = [(r.text.text, r.text.flush, r.text.clear, r.text.mark) for r in requests[1:]]
    assert sent == [
        ("one ", False, False, ""),
        ("two ", False, False, "turn-1"),
        ("", True, False, ""),
        ("", False, True, ""),
        ("", False, False, "cut"),  # a mark at the cut, before the text after it
        ("three", False, False, ""),
    ]
    marks = [e for e in events if isinstance(e, MarkEvent)]
    assert [m.name for m in marks] == ["turn-1", "cut"]
    assert marks[0].sample_offset == 2 * NUM_CHUNKS * CHUNK_SAMPLES and not marks[0].dropped
    assert stream.sent_text == "one two three" and stream.input_ended
    assert stream.timeline.marks == marks  # the stream's timeline saw every event
    assert stream.stats.num_chunks == 6 * NUM_CHUNKS and stream.stats.num_utterances == 6
    assert servicer.metadata[0]["authorization"] == f"Bearer {TOKEN}"


def test_push_stream_cancel_ends_the_call(fake) -> None:  # type: ignore[no-untyped-def]
    _, target = fake

    async def run():  # type: ignore[no-untyped-def]
        async with AsyncTTSClient(target) as client:
            stream = client.open_stream(timeout=CALL_TIMEOUT_S)
            stream.push("one")  # never half-closed: only the cancel ends the call
            first = await stream.__anext__()
            stream.cancel()
            rest = [e async for e in stream]  # ends: no CancelledError into this task
            return first, rest, await stream.call.code()  # type: ignore[attr-defined]

    first, rest, code = asyncio.run(asyncio.wait_for(run(), 2 * CALL_TIMEOUT_S))
    assert isinstance(first, AudioChunkEvent) and rest == []
    assert code == grpc.StatusCode.CANCELLED


# --- options --------------------------------------------------------------------------------


def test_client_options_check_themselves_and_build_either_client(fake) -> None:  # type: ignore[no-untyped-def]
    servicer, target = fake
    with pytest.raises(ValueError, match="tls=True"):
        ClientOptions(target, ca_cert=b"x")
    with pytest.raises(ValueError, match="together"):
        ClientOptions(target, tls=True, client_key=b"x")
    with pytest.raises(ValueError, match="positive"):
        ClientOptions(target, max_message_bytes=0)
    options = ClientOptions(target, token=TOKEN)
    with TTSClient.from_options(options) as client:
        assert client.options == options
        assert len(client.list_voices(timeout=CALL_TIMEOUT_S)) == 2
    assert TTSClient.from_options(target).options == ClientOptions(target)

    async def run():  # type: ignore[no-untyped-def]
        async with AsyncTTSClient.from_options(options) as client:
            return await client.list_voices(timeout=CALL_TIMEOUT_S)

    assert len(asyncio.run(run())) == 2
    assert [m.get("authorization") for m in servicer.metadata] == [f"Bearer {TOKEN}"] * 2


def test_synthesis_options_are_make_config_plus_word_timing() -> None:
    options = SynthesisOptions(voice="seed:5", speed=2, top_k=20, max_new_tokens=100)
    assert options.to_config() == make_config(voice="seed:5", speed=2, top_k=20, max_new_tokens=100)
    assert not options.to_config().word_timing
    varied = options.to_config(word_timing=True, sample_rate_hz=16000)
    assert varied.word_timing and varied.audio_format.sample_rate_hz == 16000
    assert varied.voice.seed == 5 and varied.sampling.max_new_tokens == 100
    with pytest.raises(ValueError, match="voice"):
        SynthesisOptions(voice="seed:abc")  # at construction, not at the first call
    with pytest.raises(ValueError, match="encoding"):
        SynthesisOptions(encoding="mp3")


# --- TLS ------------------------------------------------------------------------------------


def _make_certs():  # type: ignore[no-untyped-def]
    """A CA, a server cert for localhost/127.0.0.1 and a client cert, all PEM bytes."""
    x509 = pytest.importorskip("cryptography.x509")
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.timezone.utc)

    def issue(name, issuer_name, issuer_key, key, *, ca=False, san=None, usage=None):  # type: ignore[no-untyped-def]
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
            .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer_name)]))
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(hours=1))
            .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        )
        if san:
            builder = builder.add_extension(x509.SubjectAlternativeName(san), critical=False)
        if usage:
            builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        return builder.sign(issuer_key, hashes.SHA256())

    def pem_key(key):  # type: ignore[no-untyped-def]
        return key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )

    pem = serialization.Encoding.PEM
    ca_key, server_key, client_key = (ec.generate_private_key(ec.SECP256R1()) for _ in range(3))
    ca = issue("test-ca", "test-ca", ca_key, ca_key, ca=True)
    import ipaddress

    server = issue(
        "localhost",
        "test-ca",
        ca_key,
        server_key,
        san=[x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))],
        usage=ExtendedKeyUsageOID.SERVER_AUTH,
    )
    client = issue("client", "test-ca", ca_key, client_key, usage=ExtendedKeyUsageOID.CLIENT_AUTH)
    return {
        "ca": ca.public_bytes(pem),
        "server_cert": server.public_bytes(pem),
        "server_key": pem_key(server_key),
        "client_cert": client.public_bytes(pem),
        "client_key": pem_key(client_key),
    }


def test_mutual_tls_with_token_sync_and_async(tmp_path) -> None:  # type: ignore[no-untyped-def]
    certs = _make_certs()
    credentials = grpc.ssl_server_credentials(
        [(certs["server_key"], certs["server_cert"])],
        root_certificates=certs["ca"],
        require_client_auth=True,
    )
    servicer = FakeServicer()
    server, port = _start_server(servicer, credentials)
    ca_path = tmp_path / "ca.pem"
    ca_path.write_bytes(certs["ca"])
    try:
        target = f"localhost:{port}"
        kwargs = dict(
            tls=True,
            ca_cert=str(ca_path),  # a path here, bytes below
            client_cert=certs["client_cert"],
            client_key=certs["client_key"],
            token=TOKEN,
        )
        with TTSClient(target, **kwargs) as client:  # type: ignore[arg-type]
            _check_synthesize_events(list(client.synthesize("Hello.", timeout=CALL_TIMEOUT_S)))
        with TTSClient.from_options(ClientOptions(target, **kwargs)) as client:  # type: ignore[arg-type]
            assert len(client.list_voices(timeout=CALL_TIMEOUT_S)) == 2

        async def run():  # type: ignore[no-untyped-def]
            async with AsyncTTSClient(target, **kwargs) as client:  # type: ignore[arg-type]
                return await client.list_voices(timeout=CALL_TIMEOUT_S)

        assert len(asyncio.run(run())) == 2
        # Without a client certificate the handshake fails.
        with TTSClient(target, tls=True, ca_cert=certs["ca"]) as client:
            with pytest.raises(grpc.RpcError) as info:
                client.list_voices(timeout=CALL_TIMEOUT_S)
            assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        server.stop(grace=None)
    assert [m["authorization"] for m in servicer.metadata] == [f"Bearer {TOKEN}"] * 3


# --- make_config ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "field_name", "value"),
    [
        ("seed:1234", "seed", 1234),
        ("1234", "seed", 1234),
        (42, "seed", 42),
        ("preset:alice", "preset", "alice"),
        ("alice", "preset", "alice"),
        ("preset:1234", "preset", "1234"),
        ("emb:abc:def", "speaker_embedding", "abc:def"),
    ],
)
def test_parse_voice(spec, field_name, value) -> None:  # type: ignore[no-untyped-def]
    voice = parse_voice(spec)
    assert voice.WhichOneof("source") == field_name
    assert getattr(voice, field_name) == value


@pytest.mark.parametrize("spec", ["", "seed:abc", "seed:-1", f"seed:{2**32}", "emb:", "preset:"])
def test_parse_voice_rejects(spec) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match="voice"):
        parse_voice(spec)


def test_make_config_sets_only_given_fields() -> None:
    default = make_config()
    assert not default.HasField("voice")
    assert not default.HasField("prosody") and not default.HasField("sampling")
    assert default.audio_format.encoding == tts_pb2.LINEAR16

    config = make_config(
        voice="seed:5",
        speed=2,
        refine_text=True,
        temperature=0.3,
        top_p=0.7,
        top_k=20,
        seed=99,
        encoding="ogg_opus",
        sample_rate_hz=48000,
        max_new_tokens=100,
        min_new_tokens=0,
    )
    assert config.voice.seed == 5
    assert config.prosody.speed == 2 and config.prosody.refine_text
    s = config.sampling
    assert (s.top_k, s.seed, s.max_new_tokens) == (20, 99, 100)
    assert s.HasField("min_new_tokens") and s.min_new_tokens == 0
    assert not s.HasField("repetition_penalty")
    assert config.audio_format.encoding == tts_pb2.OGG_OPUS
    assert config.audio_format.sample_rate_hz == 48000
    with pytest.raises(ValueError, match="encoding"):
        make_config(encoding="mp3")


# --- WAV ------------------------------------------------------------------------------------


class UnseekableBytesIO(io.BytesIO):
    """Behaves like a pipe: write-only forward, no seek or tell."""

    def seekable(self) -> bool:
        return False

    def seek(self, *args):  # type: ignore[no-untyped-def]
        raise io.UnsupportedOperation("seek")

    def tell(self):  # type: ignore[no-untyped-def]
        raise io.UnsupportedOperation("tell")


def _write_in_odd_pieces(writer: WavWriter) -> None:
    # Piece boundaries fall inside samples: the writer must carry the odd byte over.
    for start in range(0, len(EXPECTED_PCM), 1001):
        writer.write(EXPECTED_PCM[start : start + 1001])


def _assert_expected_wav(data: bytes | str) -> None:
    source = io.BytesIO(data) if isinstance(data, bytes) else data
    info = sf.info(source)
    assert (info.samplerate, info.channels, info.frames) == (
        SAMPLE_RATE_HZ,
        1,
        NUM_CHUNKS * CHUNK_SAMPLES,
    )
    if isinstance(source, io.BytesIO):
        source.seek(0)
    samples, _ = sf.read(source, dtype="int16")
    assert samples.tobytes() == EXPECTED_PCM


def test_wav_writer_to_path(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "out.wav"
    with WavWriter(path, SAMPLE_RATE_HZ) as writer:
        _write_in_odd_pieces(writer)
    assert writer.num_frames == NUM_CHUNKS * CHUNK_SAMPLES
    assert path.stat().st_size == 44 + len(EXPECTED_PCM)
    _assert_expected_wav(str(path))


def test_wav_writer_to_seekable_file_object() -> None:
    buf = io.BytesIO()
    with WavWriter(buf, SAMPLE_RATE_HZ) as writer:
        _write_in_odd_pieces(writer)
    assert not buf.closed  # a caller's file is left open
    _assert_expected_wav(buf.getvalue())


def test_wav_writer_to_unseekable_stream_writes_streaming_header() -> None:
    pipe = UnseekableBytesIO()
    writer = WavWriter(pipe, SAMPLE_RATE_HZ)
    assert len(pipe.getvalue()) == 44  # header out before any audio
    _write_in_odd_pieces(writer)
    assert len(pipe.getvalue()) == 44 + len(EXPECTED_PCM)  # audio out as it comes
    writer.close()
    data = pipe.getvalue()
    assert data[4:8] == b"\xff\xff\xff\xff" and data[40:44] == b"\xff\xff\xff\xff"
    _assert_expected_wav(data)


def test_pcm16_to_float() -> None:
    pcm = np.array([0, 16384, -32768, 32767], dtype="<i2").tobytes()
    out = pcm16_to_float(pcm)
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, [0.0, 0.5, -1.0, 32767 / 32768])


# --- CLI ------------------------------------------------------------------------------------


def test_cli_say_writes_wav_and_prints_timings(fake, tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    servicer, target = fake
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    out = tmp_path / "hello.wav"
    argv = ["say", "Hello.", "-o", str(out), "--server", target, "--voice", "alice"]
    argv += ["--speed", "4", "--seed", "3", "--token-file", str(token_file), "--timeout", "10"]
    assert main(argv) == 0
    _assert_expected_wav(str(out))
    err = capsys.readouterr().err
    assert "time to first audio:" in err and " ms" in err
    assert "real-time factor:" in err and "chunks: 3" in err and "audio: 0.300 s" in err
    request = servicer.synthesize_requests[0]
    assert request.text == "Hello." and request.config.voice.preset == "alice"
    assert request.config.prosody.speed == 4 and request.config.sampling.seed == 3
    assert servicer.metadata[0]["authorization"] == f"Bearer {TOKEN}"


def test_cli_say_stdin_streams_lines_to_stdout(fake, monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    servicer, target = fake
    stdout = io.TextIOWrapper(UnseekableBytesIO())
    monkeypatch.setattr("sys.stdin", io.StringIO("one\n\n   \ntwo\n"))
    monkeypatch.setattr("sys.stdout", stdout)
    assert main(["say", "--stdin", "-o", "-", "--server", target]) == 0
    data = stdout.buffer.getvalue()  # type: ignore[attr-defined]
    samples, rate = sf.read(io.BytesIO(data), dtype="int16")
    assert rate == SAMPLE_RATE_HZ and samples.tobytes() == EXPECTED_PCM * 2
    texts = [(r.text.text, r.text.flush) for r in servicer.stream_requests[1:]]
    assert texts == [("one\n", True), ("two\n", True)]  # blank lines are not sent
    err = capsys.readouterr().err
    assert "utterance 0:" in err and "utterance 1:" in err and "'two" in err
    assert "real-time factor:" in err


def test_cli_maps_server_error_to_exit_2(fake, tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    _, target = fake
    out = tmp_path / "x.wav"
    assert main(["say", "fail", "-o", str(out), "--server", target]) == 2
    err = capsys.readouterr().err
    assert "error: INVALID_ARGUMENT: text: rejected by fake" in err
    assert "Traceback" not in err
    assert not out.exists()


def test_cli_usage_errors_exit_2(fake, tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    _, target = fake
    out = str(tmp_path / "x.wav")
    assert main(["say", "-o", out, "--server", target]) == 2  # neither text nor --stdin
    assert main(["say", "hi", "-o", out, "--server", target, "--voice", "seed:x"]) == 2
    assert "error: voice: bad seed" in capsys.readouterr().err


def test_cli_voices(fake, capsys) -> None:  # type: ignore[no-untyped-def]
    _, target = fake
    assert main(["voices", "--server", target]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines == ["alice  calm, female", "bob    fast, male"]
