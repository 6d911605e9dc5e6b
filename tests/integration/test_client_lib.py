"""The client library (sync and async clients, their options, mutual TLS, make_config) against
a fake in-process TextToSpeech servicer (tests/helpers/fake_tts.py).

The client is what is under test here; tests against the real server live elsewhere. The push
stream is in test_client_push_stream.py, the WAV writer and the CLI in test_client_cli.py.
"""

from __future__ import annotations

import asyncio
import datetime
import threading

import grpc
import pytest

from chattts_client import (
    AsyncTTSClient,
    AudioChunkEvent,
    ClientOptions,
    SynthesisOptions,
    TTSClient,
    UtteranceEndEvent,
    VoiceInfo,
    make_config,
    parse_voice,
)
from chattts_proto.chattts.v1 import tts_pb2
from fake_tts import (
    CALL_TIMEOUT_S,
    CHUNK_SAMPLES,
    EXPECTED_PCM,
    NUM_CHUNKS,
    SAMPLE_RATE_HZ,
    TOKEN,
    FakeServicer,
    start_fake_server,
)


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
    server, port = start_fake_server(servicer, credentials)
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
