"""A graceful stop, seen frame by frame on one HTTP/2 connection, as a proxy's pooled connection
to a replica sees it (issue 40). A real server with one stream place: a health Watch, a stream
speaking, a stream queued behind it; then SIGTERM, and in order:

1. the watch hears NOT_SERVING, then ends, before anything else changes;
2. GOAWAY (NO_ERROR) on the connection, and new connections are refused;
3. a stream sent after the GOAWAY left the server but before the client read it (a proxy racing
   the GOAWAY) gets no audio and a status the client library's service config resends;
   one sent after the final GOAWAY, above its last stream id, is not processed at all;
4. the stream speaking and the one queued before the drain both finish whole (grpc-status 0);
5. only then does the connection close, with FIN (no reset), and the process exit 0.
"""

from __future__ import annotations

import signal
import time
import urllib.request

from grpc_health.v1 import health_pb2

from chattts_client.resilience import SERVICE_CONFIG
from chattts_devtools.launcher import wait_serving
from chattts_proto.chattts.v1 import tts_pb2
from polling import wait_until
from raw_h2 import Closed, Data, Event, GoAway, Headers, RawH2, Reset, grpc_messages
from serverutil import DEV_MODEL_CACHE, launch, refuses_connections

SYNTHESIZE = "/chattts.v1.TextToSpeech/Synthesize"
WATCH = "/grpc.health.v1.Health/Watch"
WATCH_ID, SPEAKING_ID, QUEUED_ID, RACED_ID, LATE_ID = 1, 3, 5, 7, 9
FINAL = 2**31 - 1  # the first GOAWAY's last stream id: "no new streams, these may still come"


def _synthesize(tokens: int, pace_lead_s: float | None = None) -> tts_pb2.SynthesizeRequest:
    sampling = tts_pb2.Sampling(seed=7, min_new_tokens=tokens, max_new_tokens=tokens)
    config = tts_pb2.SynthesisConfig(sampling=sampling, pace_lead_s=pace_lead_s)
    return tts_pb2.SynthesizeRequest(text="The drain lets this call finish.", config=config)


def _queued(metrics_port: int) -> bool:
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5) as reply:
        return "\nchattts_queued_streams 1.0" in reply.read().decode()


def _retried_by_the_client(grpc_status: str | None) -> bool:
    codes = SERVICE_CONFIG["methodConfig"][0]["retryPolicy"]["retryableStatusCodes"]
    names = {"1": "CANCELLED", "2": "UNKNOWN", "14": "UNAVAILABLE"}
    return names.get(grpc_status or "") in codes


def test_a_drain_seen_on_the_wire(tiny_model_dir):
    args = ["--grace-s", "20", "--no-warmup", "--max-streams", "1"]
    with launch(args, DEV_MODEL_CACHE, metrics=True) as srv:
        wait_serving(srv.target)
        conn = RawH2("127.0.0.1", srv.port)
        conn.grpc_request(WATCH_ID, WATCH, health_pb2.HealthCheckRequest())
        # Paced as a real-time listener hears it, so it still speaks (3.2 s of audio) when the
        # drain begins and the raced call arrives 1 s into it, however fast the model runs.
        conn.grpc_request(SPEAKING_ID, SYNTHESIZE, _synthesize(150, pace_lead_s=0.5))
        events: list[Event] = []
        stream = conn.events()
        for event in stream:
            events.append(event)
            if isinstance(event, Data) and event.stream_id == SPEAKING_ID:
                break
        conn.grpc_request(QUEUED_ID, SYNTHESIZE, _synthesize(8))
        wait_until(lambda: _queued(srv.metrics_port), 10, "a stream queued")

        term_at = time.monotonic()
        srv.proc.send_signal(signal.SIGTERM)
        time.sleep(1.0)  # the server's GOAWAY waits unread in our socket: we race it
        conn.grpc_request(RACED_ID, SYNTHESIZE, _synthesize(8))
        refused_at_once = None
        for event in stream:
            events.append(event)
            if isinstance(event, GoAway) and refused_at_once is None:
                refused_at_once = refuses_connections(srv.port)
            if isinstance(event, GoAway) and event.last_stream_id != FINAL:
                conn.grpc_request(LATE_ID, SYNTHESIZE, _synthesize(8))
        assert srv.proc.wait(30) == 0
        conn.close()

    log = "\n".join(f"{e.at - term_at:+.3f} {e}"[:200] for e in events)
    order = {id(e): i for i, e in enumerate(events)}  # arrival order (times tie in one read)

    # 1. The watch hears NOT_SERVING and ends, before the first GOAWAY.
    goaways = [e for e in events if isinstance(e, GoAway)]
    assert goaways and all(g.error_code == 0 for g in goaways), log
    first_goaway = order[id(goaways[0])]
    watch = [e for e in events if e.stream_id == WATCH_ID]
    statuses = [
        health_pb2.HealthCheckResponse.FromString(m).status for m in grpc_messages(events, WATCH_ID)
    ]
    serving, not_serving = (
        health_pb2.HealthCheckResponse.SERVING,
        health_pb2.HealthCheckResponse.NOT_SERVING,
    )
    assert statuses == [serving, not_serving], log
    watch_end = next(e for e in watch if isinstance(e, Headers) and e.end_stream)
    assert watch_end.headers.get("grpc-status") == "0", log
    assert order[id(watch_end)] < first_goaway, log

    # 2. No new connection once the GOAWAY is out.
    assert refused_at_once, "the listener still accepted connections after GOAWAY"

    # 3. The stream that raced the GOAWAY: no audio, and a status the client resends; the one
    # sent after the final GOAWAY (above its last stream id) was never touched.
    raced = [e for e in events if e.stream_id == RACED_ID]
    assert not grpc_messages(events, RACED_ID), log
    raced_end = [e for e in raced if isinstance(e, Headers) and e.end_stream]
    raced_reset = [e for e in raced if isinstance(e, Reset)]
    assert (raced_end and _retried_by_the_client(raced_end[0].headers.get("grpc-status"))) or (
        raced_reset and raced_reset[0].error_code == 0x7  # REFUSED_STREAM
    ), log
    final = goaways[-1]
    assert final.last_stream_id < LATE_ID, log
    assert not [e for e in events if e.stream_id == LATE_ID], log

    # 4. The stream speaking and the one queued before the drain finish whole.
    for stream_id in (SPEAKING_ID, QUEUED_ID):
        mine = [e for e in events if e.stream_id == stream_id]
        end = [e for e in mine if isinstance(e, Headers) and e.end_stream]
        assert end and end[0].headers.get("grpc-status") == "0", f"stream {stream_id}:\n{log}"
        replies = [
            tts_pb2.SynthesizeResponse.FromString(m) for m in grpc_messages(events, stream_id)
        ]
        assert any(r.HasField("utterance_end") for r in replies), f"stream {stream_id}:\n{log}"
        assert any(order[id(e)] > first_goaway for e in mine if isinstance(e, Data)), log

    # 5. The connection closes after the last stream ends (it is the last event), with FIN.
    closed = events[-1]
    assert isinstance(closed, Closed) and not closed.reset, log
