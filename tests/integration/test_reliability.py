"""Reliability promises (docs RELIABILITY.md): admission, deadlines, cancellation, engine faults,
shutdown. Bad input at the gRPC door is in test_grpc_bad_input.py.

Every test runs a real server on loopback and checks that it is still healthy afterwards.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import urllib.request

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from chattts_proto.chattts.v1 import tts_pb2, tts_pb2_grpc
from httputil import stalled_total, wait_freed_by_the_call, wait_idle
from polling import wait_until
from reliability_calls import LONG_WAIT_S, Streamer, assert_healthy, fixed, request, rpc_error
from serverutil import (
    DEV_MODEL_CACHE,
    REPO,
    FaultyRunner,
    InProcessServer,
    launch,
    refuses_connections,
    tiny_server_config,
    wait_serving,
)


@pytest.fixture(scope="module")
def small(tiny_model_dir):
    """A dedicated server with 2 stream places and a queue of 1, whose runner fails any request
    with "BOOM" in its text (and only those)."""
    config = tiny_server_config(DEV_MODEL_CACHE, max_streams=2, max_queue=1)

    def faulty() -> FaultyRunner:
        runner = FaultyRunner(config)
        runner.fail_text = "BOOM"
        return runner

    with InProcessServer(config, runner_factory=faulty) as srv:
        yield srv


# -- admission ----------------------------------------------------------------------------------


def test_over_admission_is_refused_fast_and_admitted_streams_finish(small):
    adm = small.server.admission
    # The two admitted streams stop reading after their first chunk, so they hold their places
    # (their generation pauses on the full output buffer) until the gate opens.
    gate = threading.Event()
    # 300 tokens is ~300 KB of audio: more than the HTTP/2 window and the output buffer hold.
    long = [Streamer(small.target, request("One long stream.", 300), gate=gate) for _ in range(2)]
    for s in long:
        s.start()
    for s in long:
        assert s.first.wait(LONG_WAIT_S)
    assert adm.active == 2

    # A queued stream whose deadline passes while it waits: DEADLINE_EXCEEDED, queue emptied.
    expired = Streamer(small.target, request(), timeout=0.5)
    expired.start()
    assert expired.result() == grpc.StatusCode.DEADLINE_EXCEEDED
    wait_until(lambda: adm.waiting == 0, 30, "the expired waiter to leave the queue")

    queued = Streamer(small.target, request("Queued stream.", 6))
    queued.start()
    wait_until(lambda: adm.waiting == 1, 30, "the third stream to queue")

    with grpc.insecure_channel(small.target) as channel:
        stub = tts_pb2_grpc.TextToSpeechStub(channel)
        with pytest.raises(grpc.RpcError) as info:
            list(stub.Synthesize(request(), timeout=30))
    # Refused as it came, not queued: a queued call would end OK or DEADLINE_EXCEEDED.
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    trailers = dict(info.value.trailing_metadata() or ())
    assert int(trailers["grpc-retry-pushback-ms"]) > 0

    gate.set()
    assert [s.result() for s in long] == [grpc.StatusCode.OK] * 2
    assert queued.result() == grpc.StatusCode.OK
    wait_idle(small, "slots to be released")
    assert_healthy(small.target)


# -- deadlines and cancellation ------------------------------------------------------------------


def test_short_deadline_on_long_text_frees_the_engine(small):
    text = " ".join(f"Sentence number {i} is here." for i in range(20))
    stalled_before = stalled_total(small)
    s = Streamer(small.target, tts_pb2.SynthesizeRequest(text=text, config=fixed(200)), timeout=1.0)
    s.start()
    assert s.result() == grpc.StatusCode.DEADLINE_EXCEEDED
    wait_freed_by_the_call(small, stalled_before, "the engine to drop the expired request")
    assert_healthy(small.target)


def test_expired_deadline_does_not_fail_other_streams(small):
    stalled_before = stalled_total(small)
    other = Streamer(small.target, request("An innocent bystander.", 40))
    other.start()
    assert other.first.wait(LONG_WAIT_S)
    text = " ".join(f"Sentence number {i} is here." for i in range(10))
    expiring = Streamer(
        small.target, tts_pb2.SynthesizeRequest(text=text, config=fixed(200)), timeout=0.6
    )
    expiring.start()
    assert expiring.result() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert other.result() == grpc.StatusCode.OK, other.details
    wait_freed_by_the_call(small, stalled_before, "slots to be released")


def test_client_process_killed_mid_stream_frees_its_slot(small):
    script = textwrap.dedent(
        f"""
        import sys, time, grpc
        from chattts_proto.chattts.v1 import tts_pb2, tts_pb2_grpc
        cfg = tts_pb2.SynthesisConfig(sampling=tts_pb2.Sampling(min_new_tokens=300, max_new_tokens=300))
        ch = grpc.insecure_channel("{small.target}")
        for reply in tts_pb2_grpc.TextToSpeechStub(ch).Synthesize(
                tts_pb2.SynthesizeRequest(text="A long one.", config=cfg), timeout=120):
            print("FIRST", flush=True)
            time.sleep(600)
        """
    )
    env = {**os.environ, "PYTHONPATH": f"{REPO / 'client'}:{REPO / 'server'}"}
    proc = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "FIRST"
        assert small.server.engine.stats().active_requests == 1
        stalled_before = stalled_total(small)
        proc.kill()
        proc.wait(10)
        wait_freed_by_the_call(small, stalled_before, "the dead client's slot to be released")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert_healthy(small.target)


# -- engine faults --------------------------------------------------------------------------------


def test_engine_exception_fails_only_that_stream(small):
    """A request whose work fails inside the engine (the runner reports its slot failed, as for
    a non-finite hidden state) ends INTERNAL with a short message; the stream beside it, in the
    same decode batch, ends OK."""
    other = Streamer(small.target, request("A calm sentence.", 60))
    other.start()
    assert other.first.wait(LONG_WAIT_S)
    bad = Streamer(small.target, request("This goes BOOM.", 60))
    bad.start()
    assert bad.result() == grpc.StatusCode.INTERNAL
    assert other.result() == grpc.StatusCode.OK
    assert "Traceback" not in bad.details and len(bad.details) < 300
    assert "BOOM" in bad.details
    wait_idle(small, "slots to be released")
    assert_healthy(small.target)


# -- SIGTERM on a subprocess server ---------------------------------------------------------------


def _health(target: str) -> int | None:
    with grpc.insecure_channel(target) as channel:
        try:
            return (
                health_pb2_grpc.HealthStub(channel)
                .Check(health_pb2.HealthCheckRequest(), timeout=1)
                .status
            )
        except grpc.RpcError:
            return None


def _queued_streams(metrics_port: int) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5) as reply:
        text = reply.read().decode()
    (value,) = re.findall(r"^chattts_queued_streams (\S+)$", text, re.MULTILINE)
    return float(value)


def test_sigterm_lets_streams_in_flight_finish(tiny_model_dir):
    args = ["--grace-s", str(LONG_WAIT_S), "--no-warmup", "--max-streams", "1"]
    with launch(args, DEV_MODEL_CACHE, metrics=True) as srv:
        target = srv.target
        wait_serving(target)
        s = Streamer(target, request("Finish me please.", 40))
        s.start()
        assert s.first.wait(LONG_WAIT_S)
        # One more waits for the only place: queued before the drain, it is served in it.
        queued = Streamer(target, request("Queued before the drain.", 8))
        queued.start()
        wait_until(lambda: _queued_streams(srv.metrics_port) == 1, 60, "a stream queued")
        with grpc.insecure_channel(target) as channel:
            watch = health_pb2_grpc.HealthStub(channel).Watch(
                health_pb2.HealthCheckRequest(), timeout=10
            )
            assert next(watch).status == health_pb2.HealthCheckResponse.SERVING
            srv.proc.send_signal(signal.SIGTERM)
            # A watcher hears NOT_SERVING at once; then the listener closes, so no proxy or
            # client balancer can open a new connection to the draining replica.
            assert next(watch).status == health_pb2.HealthCheckResponse.NOT_SERVING
            watch.cancel()
        wait_until(lambda: refuses_connections(srv.port), 60, "the listener closed")
        err = rpc_error(target, request())
        assert err.code() == grpc.StatusCode.UNAVAILABLE
        assert s.result() == grpc.StatusCode.OK
        assert queued.result() == grpc.StatusCode.OK and queued.replies > 0
        assert srv.proc.wait(LONG_WAIT_S) == 0


def test_sigterm_cancels_streams_past_the_grace_period(tiny_model_dir):
    with launch(["--grace-s", "0.5", "--no-warmup"], DEV_MODEL_CACHE, metrics=False) as srv:
        wait_serving(srv.target)
        s = Streamer(srv.target, request("Too long to finish.", 380))
        s.start()
        assert s.first.wait(LONG_WAIT_S)
        srv.proc.send_signal(signal.SIGTERM)
        assert s.result() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED)
        assert srv.proc.wait(LONG_WAIT_S) == 0


def test_broken_engine_turns_not_serving_and_the_server_exits_nonzero(tiny_model_dir):
    """A fault that leaves the engine unusable (every step fails) must not limp on: the stream
    gets a clean error, health goes NOT_SERVING and `wait()` reports exit code 1 so a supervisor
    restarts the process."""
    config = tiny_server_config(DEV_MODEL_CACHE, max_streams=2)
    runners: list[FaultyRunner] = []

    def faulty() -> FaultyRunner:
        runners.append(FaultyRunner(config))
        return runners[-1]

    with InProcessServer(config, runner_factory=faulty) as srv:
        assert srv.server is not None
        engine = srv.server.engine
        runners[0].broken = True
        # One failed step may be one bad request; three in a row mean the engine is broken.
        for _ in range(3):
            s = Streamer(srv.target, request("Doomed.", 40))
            s.start()
            assert s.result(30) in (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNAVAILABLE)
            assert "Traceback" not in s.details
        assert srv.call(srv.server.wait(), timeout_s=30) == 1
        assert not engine.healthy
