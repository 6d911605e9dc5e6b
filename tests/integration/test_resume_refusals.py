"""What a resume refuses, and what a resumable stream leaves behind: tokens that are wrong,
tampered, random or another caller's; a stream past its window; an explicit cancel; a client
that stops reading; a server with resuming off. Through the generated stubs."""

from __future__ import annotations

import asyncio
import random
import secrets
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import grpc
import pytest

from chattts_client import AsyncTTSClient, AudioChunkEvent, make_config
from chattts_proto.chattts.v1 import tts_pb2, tts_pb2_grpc
from chattts_server.config import LimitsConfig, SecurityConfig
from httputil import IDLE_WAIT_S
from polling import wait_until
from serverutil import DEV_MODEL_CACHE, InProcessServer, tiny_server_config

CALL_TIMEOUT_S = 300
LONG_TEXT = "Keep going straight for a long while on this road, past the river and the old mill. "


def _config(tmp: Path | None = None, **limits: object):  # type: ignore[no-untyped-def]
    base = tiny_server_config(DEV_MODEL_CACHE, max_streams=2, max_queue=2, warmup=False)
    security = base.security
    if tmp is not None:
        tokens = tmp / "tokens.txt"
        tokens.write_text("alpha-token\nbeta-token\n")
        security = SecurityConfig(auth_token_file=tokens)
    return replace(base, limits=replace(LimitsConfig(), **limits), security=security).validate()


@pytest.fixture(scope="module")
def authed(tiny_model_dir, tmp_path_factory) -> Iterator[InProcessServer]:  # type: ignore[no-untyped-def]
    """Tokens on, a one-second window; no stall timeout, so a stream whose call reads nothing
    stays until the test lets it go."""
    config = _config(tmp_path_factory.mktemp("auth"), resume_window_s=1.0, stall_timeout_s=0.0)
    with InProcessServer(config) as srv:
        yield srv


def _auth(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),)


def _open(channel: grpc.Channel, token: str | None, text: str = LONG_TEXT * 4, last: bool = True):  # type: ignore[no-untyped-def]
    """A resumable stream with a text far longer than HTTP/2 lets a call that reads nothing
    take; its call and headers after its first response."""
    config = tts_pb2.SynthesisConfig(
        resumable=True, sampling=tts_pb2.Sampling(seed=3, max_new_tokens=200, min_new_tokens=150)
    )
    requests = [
        tts_pb2.StreamingSynthesizeRequest(config=config),
        tts_pb2.StreamingSynthesizeRequest(text=tts_pb2.TextInput(text=text, seq=1, last=last)),
    ]
    stub = tts_pb2_grpc.TextToSpeechStub(channel)
    metadata = _auth(token) if token else None
    call = stub.StreamingSynthesize(iter(requests), timeout=CALL_TIMEOUT_S, metadata=metadata)
    next(call)
    return call, dict(call.initial_metadata())


def _resume(
    channel: grpc.Channel, stream_id: str, token: str, bearer: str | None
) -> grpc.StatusCode:
    """The status a ResumeStream gets before any audio (OK: it was taken)."""
    request = tts_pb2.StreamingSynthesizeRequest(
        resume=tts_pb2.ResumeStream(stream_id=stream_id, resume_token=token)
    )
    stub = tts_pb2_grpc.TextToSpeechStub(channel)
    call = stub.StreamingSynthesize(
        iter([request]), timeout=CALL_TIMEOUT_S, metadata=_auth(bearer) if bearer else None
    )
    try:
        call.initial_metadata()
        next(call)
    except grpc.RpcError as exc:
        return exc.code()
    finally:
        call.cancel()
    return grpc.StatusCode.OK


def test_tokens_are_bound_to_the_stream_and_the_caller_and_guesses_are_refused(authed) -> None:  # type: ignore[no-untyped-def]
    with grpc.insecure_channel(authed.target) as channel:
        call_a, headers_a = _open(channel, "alpha-token")
        call_b, headers_b = _open(channel, "beta-token")
        id_a, token_a = headers_a["chattts-stream-id"], headers_a["chattts-resume-token"]
        id_b, token_b = headers_b["chattts-stream-id"], headers_b["chattts-resume-token"]
        assert len(bytes.fromhex(token_a)) * 8 >= 128
        denied = grpc.StatusCode.PERMISSION_DENIED
        # Another caller with the right stream token; this caller with another stream's token.
        assert _resume(channel, id_a, token_a, "beta-token") == denied
        assert _resume(channel, id_a, token_b, "alpha-token") == denied
        assert _resume(channel, id_b, token_a, "beta-token") == denied
        # A wrong token says nothing of whether the id exists.
        tag = id_a.split("-")[0]
        unknown = f"{tag}-{secrets.token_hex(12)}"
        assert _resume(channel, unknown, token_a, "alpha-token") == denied
        # The owner resumes (taking the stream over from its live call); another replica's id.
        assert _resume(channel, id_a, token_a, "alpha-token") == grpc.StatusCode.OK
        other_replica = "0000beef-" + "0" * 24
        assert _resume(channel, other_replica, token_a, "alpha-token") == grpc.StatusCode.NOT_FOUND
        # 1,000 random and tampered tokens.
        rng = random.Random(9)
        for n in range(1000):
            if n % 2:
                guess = secrets.token_hex(16)
            else:
                i = rng.randrange(len(token_a))
                guess = token_a[:i] + format((int(token_a[i], 16) + 1) % 16, "x") + token_a[i + 1 :]
            assert _resume(channel, id_a, guess, "alpha-token") == denied, guess
        call_a.cancel()
        call_b.cancel()
    resumer = authed.server.servicer.resumer
    wait_until(lambda: resumer.held == 0, IDLE_WAIT_S, "both streams let go after the window")
    wait_until(lambda: authed.server.admission.active == 0, IDLE_WAIT_S, "the slots freed")


def test_a_stream_past_its_window_is_not_found_and_leaves_nothing_behind(authed) -> None:  # type: ignore[no-untyped-def]
    resumer = authed.server.servicer.resumer
    with grpc.insecure_channel(authed.target) as channel:
        call, headers = _open(channel, "alpha-token")
        call.cancel()  # the connection "drops": the stream is held for the 1 s window
        wait_until(lambda: resumer.held == 0, IDLE_WAIT_S, "the stream let go after its window")
        wait_until(lambda: authed.server.admission.active == 0, IDLE_WAIT_S, "its slot freed")
        status = _resume(
            channel, headers["chattts-stream-id"], headers["chattts-resume-token"], "alpha-token"
        )
    assert status == grpc.StatusCode.NOT_FOUND
    metrics = authed.server.metrics.registry
    assert metrics.get_sample_value("chattts_parked_streams") == 0
    assert metrics.get_sample_value("chattts_resumes_total", {"result": "not_found"}) >= 1


@pytest.fixture(scope="module")
def long_window(tiny_model_dir) -> Iterator[InProcessServer]:  # type: ignore[no-untyped-def]
    """A window far longer than any wait here, and a short stall timeout."""
    with InProcessServer(_config(resume_window_s=600.0, stall_timeout_s=2.0)) as srv:
        yield srv


@pytest.mark.parametrize("when", ["after its first audio", "before any answer", "after end_input"])
def test_cancel_frees_a_resumable_streams_slot_without_waiting_for_its_window(
    long_window: InProcessServer, when: str
) -> None:
    """A voice agent's barge-in: the stream is cancelled at any point of its life, its text
    ended or not, and its slot comes back without the 600 s window (`CancelStream`)."""

    async def run() -> None:
        async with AsyncTTSClient(long_window.target) as client:
            stream = client.open_stream(config=make_config(seed=1), timeout=CALL_TIMEOUT_S)
            stream.push(LONG_TEXT * 3)
            if when == "after end_input":
                stream.end_input()
            if when == "before any answer":
                stream.cancel()
            async for event in stream:
                if isinstance(event, AudioChunkEvent):
                    stream.cancel()

    asyncio.run(run())
    server = long_window.server
    wait_until(lambda: server.admission.active == 0, IDLE_WAIT_S, "the cancelled stream's slot")
    wait_until(lambda: server.servicer.resumer.held == 0, IDLE_WAIT_S, "the stream let go")


def test_a_resumable_stream_whose_client_stops_reading_is_found_by_the_stall_timeout(
    long_window,
) -> None:  # type: ignore[no-untyped-def]
    metrics = long_window.server.metrics.registry
    stalled = (
        metrics.get_sample_value("chattts_stalled_streams_total", {"method": "StreamingSynthesize"})
        or 0
    )
    # No BDP probing: the client's HTTP/2 window stays at 64 KiB, which the text overflows.
    options = [("grpc.http2.bdp_probe", 0)]
    with grpc.insecure_channel(long_window.target, options=options) as channel:
        call, _ = _open(channel, None, LONG_TEXT * 8)  # reads one response, then nothing
        server = long_window.server
        wait_until(lambda: server.admission.active == 0, IDLE_WAIT_S, "the stalled stream's slot")
        resumer = server.servicer.resumer  # not held for a resume: the window is 600 s
        wait_until(lambda: resumer.held == 0, IDLE_WAIT_S, "the stalled stream let go")
        call.cancel()
    after = metrics.get_sample_value(
        "chattts_stalled_streams_total", {"method": "StreamingSynthesize"}
    )
    assert after == stalled + 1


def test_a_server_with_resuming_off_serves_a_resumable_stream_plainly(tiny_model_dir) -> None:  # type: ignore[no-untyped-def]
    with (
        InProcessServer(_config(resume_window_s=0.0)) as srv,
        grpc.insecure_channel(srv.target) as channel,
    ):
        call, headers = _open(channel, None, "Short one.")
        assert "chattts-stream-id" not in headers
        assert all(True for _ in call)
        status = _resume(channel, "x-" + "0" * 24, "0" * 32, None)
    assert status == grpc.StatusCode.FAILED_PRECONDITION


def test_a_drain_cancels_parked_streams_at_once(tiny_model_dir) -> None:  # type: ignore[no-untyped-def]
    """A draining replica can be reached by no resume (its listeners are shut): streams parked
    on it are cancelled when the drain begins, not kept for their window (600 s here)."""
    srv = InProcessServer(_config(resume_window_s=600.0))
    with srv, grpc.insecure_channel(srv.target) as channel:
        call, _ = _open(channel, None, "Hello there.", last=False)  # then waits for text
        call.cancel()  # the connection drops: parked
        resumer = srv.server.servicer.resumer
        wait_until(lambda: resumer.parked == 1, IDLE_WAIT_S, "the stream parked")
        assert srv.server.admission.active == 1  # it waits for more text, holding its slot
        # Drained with a grace far longer than the call's wait: only the cancel ends it in time.
        srv.call(srv.server.drain(grace_s=600.0), timeout_s=IDLE_WAIT_S)
        assert resumer.held == 0 and srv.server.admission.active == 0
