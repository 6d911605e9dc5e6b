"""Transport security: TLS, mutual TLS, bearer tokens, and start-up errors instead of plaintext."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from dataclasses import replace

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from chattts_proto.chattts.v1 import tts_pb2, tts_pb2_grpc
from chattts_server.config import SecurityConfig
from chattts_server.server import TTSServer
from chattts_server.startup import StartupError
from serverutil import DEV_MODEL_CACHE, REPO, InProcessServer, tiny_server_config, wait_serving


def _secure_config(**security):
    base = tiny_server_config(DEV_MODEL_CACHE, max_streams=2, max_queue=2, warmup=False)
    return replace(base, security=SecurityConfig(**security)).validate()


def _small_request() -> tts_pb2.SynthesizeRequest:
    return tts_pb2.SynthesizeRequest(
        text="Secure hello.",
        config=tts_pb2.SynthesisConfig(
            sampling=tts_pb2.Sampling(min_new_tokens=4, max_new_tokens=4)
        ),
    )


def _synthesize_ok(channel: grpc.Channel, metadata=None) -> None:
    replies = list(
        tts_pb2_grpc.TextToSpeechStub(channel).Synthesize(
            _small_request(), timeout=30, metadata=metadata
        )
    )
    assert any(r.HasField("utterance_end") for r in replies)


def _credentials(pki, client: bool) -> grpc.ChannelCredentials:
    if client:
        return grpc.ssl_channel_credentials(
            pki["ca"].read_bytes(), pki["client_key"].read_bytes(), pki["client_cert"].read_bytes()
        )
    return grpc.ssl_channel_credentials(pki["ca"].read_bytes())


class _TLSServer(InProcessServer):
    def __init__(self, config, credentials) -> None:
        super().__init__(config, wait=False)
        self.credentials = credentials

    def __enter__(self):
        super().__enter__()
        wait_serving(self.target, credentials=self.credentials)
        return self


def test_mutual_tls(tiny_model_dir, pki):
    config = _secure_config(
        tls_cert=pki["server_cert"], tls_key=pki["server_key"], tls_client_ca=pki["ca"]
    )
    with _TLSServer(config, _credentials(pki, client=True)) as srv:
        with grpc.secure_channel(srv.target, _credentials(pki, client=True)) as channel:
            _synthesize_ok(channel)
        # Without a client certificate the handshake fails.
        with grpc.secure_channel(srv.target, _credentials(pki, client=False)) as channel:
            with pytest.raises(grpc.RpcError) as info:
                _synthesize_ok(channel)
            assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        # Plaintext never reaches the service.
        with grpc.insecure_channel(srv.target) as channel:
            with pytest.raises(grpc.RpcError) as info:
                _synthesize_ok(channel)
            assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        with grpc.secure_channel(srv.target, _credentials(pki, client=True)) as channel:
            _synthesize_ok(channel)  # still healthy


def test_server_tls_without_client_certificates(tiny_model_dir, pki):
    config = _secure_config(tls_cert=pki["server_cert"], tls_key=pki["server_key"])
    with _TLSServer(config, _credentials(pki, client=False)) as srv:
        with grpc.secure_channel(srv.target, _credentials(pki, client=False)) as channel:
            _synthesize_ok(channel)
        from chattts_client import TTSClient

        with TTSClient(
            srv.target, tls=True, ca_cert=pki["ca"], tls_server_name="localhost"
        ) as client:
            events = list(
                client.synthesize("Library hello.", config=_small_request().config, timeout=30)
            )
            assert events


def test_missing_certificate_is_a_startup_error(tmp_path):
    config = _secure_config(tls_cert=tmp_path / "missing.pem", tls_key=tmp_path / "missing.key")

    async def start():
        server = TTSServer(config)
        try:
            await server.start()
        finally:
            if server.server is not None:
                await server.server.stop(0)

    with pytest.raises(StartupError, match="--tls-cert"):
        asyncio.run(start())


def test_cli_with_missing_certificate_exits_nonzero(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "chattts_server.main",
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--dev-model",
            "tiny",
            "--dev-model-cache",
            str(DEV_MODEL_CACHE),
            "--device",
            "cpu",
            "--tls-cert",
            str(tmp_path / "missing.pem"),
            "--tls-key",
            str(tmp_path / "missing.key"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": f"{REPO / 'client'}:{REPO / 'server'}"},
    )
    assert proc.returncode != 0
    assert "listening" not in proc.stdout
    assert "missing.pem" in proc.stderr and "Traceback" not in proc.stderr


@pytest.fixture(scope="module")
def token_server(tiny_model_dir, tmp_path_factory):
    tokens = tmp_path_factory.mktemp("auth") / "tokens"
    tokens.write_text("# accepted tokens\nsecret-one\n\nsecret-two\n")
    with InProcessServer(_secure_config(auth_token_file=tokens)) as srv:
        yield srv


def _streaming_requests():
    yield tts_pb2.StreamingSynthesizeRequest(
        config=tts_pb2.SynthesisConfig(
            sampling=tts_pb2.Sampling(min_new_tokens=4, max_new_tokens=4)
        )
    )
    yield tts_pb2.StreamingSynthesizeRequest(
        text=tts_pb2.TextInput(text="Streamed hello.", flush=True)
    )


def _streams_total(srv, method: str, status: str) -> float:
    value = srv.server.metrics.registry.get_sample_value(
        "chattts_streams_total", {"method": method, "status": status}
    )
    return value or 0.0


@pytest.mark.parametrize(
    "metadata, code",
    [
        (None, grpc.StatusCode.UNAUTHENTICATED),
        ((("authorization", "Bearer wrong"),), grpc.StatusCode.PERMISSION_DENIED),
        ((("authorization", "Basic secret-one"),), grpc.StatusCode.PERMISSION_DENIED),
    ],
)
def test_token_auth_refuses(token_server, metadata, code, caplog):
    methods = ("Synthesize", "StreamingSynthesize")
    before = {m: _streams_total(token_server, m, code.name) for m in methods}
    with grpc.insecure_channel(token_server.target) as channel:
        stub = tts_pb2_grpc.TextToSpeechStub(channel)
        for call in (
            lambda: list(stub.Synthesize(_small_request(), timeout=10, metadata=metadata)),
            lambda: list(
                stub.StreamingSynthesize(_streaming_requests(), timeout=10, metadata=metadata)
            ),
            lambda: stub.ListVoices(tts_pb2.ListVoicesRequest(), timeout=10, metadata=metadata),
        ):
            with pytest.raises(grpc.RpcError) as info:
                call()
            assert info.value.code() == code
        _synthesize_ok(channel, metadata=(("authorization", "Bearer secret-one"),))
    # Refused streams are counted and logged as on HTTP: one way in checks every door.
    for method in methods:
        assert _streams_total(token_server, method, code.name) == before[method] + 1
    if code is grpc.StatusCode.PERMISSION_DENIED:
        logged = caplog.text
        for method in (*methods, "/chattts.v1.TextToSpeech/ListVoices"):
            assert f"rejected {method}: wrong bearer token" in logged


def test_token_auth_accepts_and_health_stays_open(token_server):
    with grpc.insecure_channel(token_server.target) as channel:
        stub = tts_pb2_grpc.TextToSpeechStub(channel)
        for token in ("secret-one", "secret-two"):
            md = (("authorization", f"Bearer {token}"),)
            _synthesize_ok(channel, metadata=md)
            replies = list(stub.StreamingSynthesize(_streaming_requests(), timeout=30, metadata=md))
            assert any(r.HasField("utterance_end") for r in replies)
        reply = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(), timeout=5
        )
        assert reply.status == health_pb2.HealthCheckResponse.SERVING


def test_client_library_token(token_server):
    from chattts_client import TTSClient

    with TTSClient(token_server.target, token="secret-two") as client:
        events = list(
            client.synthesize("Library hello.", config=_small_request().config, timeout=30)
        )
        assert events
