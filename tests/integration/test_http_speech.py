"""POST /v1/audio/speech with real clients: the OpenAI SDK (sync and async), curl and httpx.

One in-process server (tiny model, one stream place and no queue, bearer tokens on) serves the
module; every format is decoded back with a real decoder and checked for rate and length.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import ssl
import subprocess

import httpx2
import numpy as np
import openai
import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from httputil import (
    TOKEN,
    decode,
    fixed,
    http_server,
    http_url,
    samples_for,
    stalled_total,
    streams_total,
    wait_freed_by_the_call,
    wait_idle,
    ws_stream_url,
)
from polling import wait_until
from serverutil import refuses_connections

N = 24  # audio tokens per sentence: (2 * 24 - 1) * 256 = 12032 samples
TEXT = "Turn left in two hundred meters."
LONG = " ".join(f"Sentence number {w} is here." for w in ("one", "two", "three", "four"))


@pytest.fixture(scope="module")
def srv(tiny_model_dir, tmp_path_factory):
    with http_server(tmp_path_factory.mktemp("http")) as server:
        yield server


@pytest.fixture
def client(srv):
    with openai.OpenAI(
        base_url=http_url(srv) + "/v1", api_key=TOKEN, max_retries=0, timeout=60
    ) as c:
        yield c
    wait_idle(srv, "the server to be idle after the test")


def _speech(client, response_format: str, stream_format: str = "audio", **kw) -> bytes:
    with client.audio.speech.with_streaming_response.create(
        model="tts-1",
        voice=kw.pop("voice", "alloy"),
        input=kw.pop("input", TEXT),
        response_format=response_format,
        stream_format=stream_format,
        extra_body={"chattts": fixed(N)},
        **kw,
    ) as response:
        assert response.status_code == 200
        return response.read()


# -- formats --------------------------------------------------------------------------------------


def test_every_format_decodes_to_the_right_rate_and_length(client):
    pcm, rate = decode(_speech(client, "pcm"), "pcm")
    assert rate == 24000 and pcm.size == samples_for(N)
    assert np.abs(pcm).max() > 0
    expected = {  # format: (rate, tolerance in samples past the exact length)
        "wav": (24000, 0),
        "flac": (24000, 0),
        "opus": (48000, 0),  # ffmpeg decodes Ogg Opus at 48 kHz; the granule trims exactly
        "mp3": (24000, 2 * 1152 + 1105),  # encoder delay and padding, unsignalled in raw MP3
        "aac": (24000, 2 * 1024 + 1024),  # priming and padding, unsignalled in ADTS
    }
    for response_format, (want_rate, slack) in expected.items():
        audio, rate = decode(_speech(client, response_format), response_format)
        exact = samples_for(N) * want_rate // 24000
        assert rate == want_rate, response_format
        assert exact <= audio.size <= exact + slack, (response_format, audio.size, exact)
        if response_format in ("wav", "flac"):  # lossless: the very same samples as pcm
            np.testing.assert_array_equal(audio, pcm)


def test_content_types_and_headers(srv):
    body = {"input": TEXT, "voice": "anna", "response_format": "wav", "chattts": fixed(N)}
    r = httpx2.post(
        http_url(srv) + "/v1/audio/speech",
        json=body,
        headers={"authorization": f"Bearer {TOKEN}"},
        timeout=60,
    )
    assert r.status_code == 200
    assert r.headers["content-type"] == "audio/wav"
    assert "content-length" not in r.headers and r.headers["transfer-encoding"] == "chunked"
    assert r.content[:4] == b"RIFF" and r.content[8:12] == b"WAVE"


def test_voices_speed_and_instructions(client, srv):
    base = decode(_speech(client, "pcm", voice="alloy"), "pcm")[0]
    assert np.array_equal(base, decode(_speech(client, "pcm", voice="alloy"), "pcm")[0])
    assert not np.array_equal(base, decode(_speech(client, "pcm", voice="nova"), "pcm")[0])
    assert not np.array_equal(base, decode(_speech(client, "pcm", voice="seed:1"), "pcm")[0])
    preset = decode(_speech(client, "pcm", voice="anna"), "pcm")[0]
    assert np.array_equal(preset, decode(_speech(client, "pcm", voice="seed:4321"), "pcm")[0])
    # speed changes the prompt ([speed_N]); instructions are accepted and not used
    assert not np.array_equal(base, decode(_speech(client, "pcm", speed=2.0), "pcm")[0])
    same = decode(_speech(client, "pcm", instructions="Speak cheerfully."), "pcm")[0]
    assert np.array_equal(base, same)
    listed = {
        v["id"]
        for v in httpx2.get(
            http_url(srv) + "/v1/audio/voices", headers={"authorization": f"Bearer {TOKEN}"}
        ).json()["data"]
    }
    assert {"anna", "alloy", "shimmer"} <= listed
    assert [m.id for m in client.models.list()] == ["chattts"]


def test_priority_through_the_chattts_object_reaches_the_stream_log(client, srv, caplog):
    with caplog.at_level(logging.INFO, logger="chattts_server.api.synthesis"):
        for priority in ("interactive", "PRIORITY_BULK"):
            with client.audio.speech.with_streaming_response.create(
                model="tts-1",
                voice="alloy",
                input="Turn left.",
                response_format="pcm",
                extra_body={"chattts": {**fixed(N), "priority": priority}},
            ) as response:
                assert response.status_code == 200 and response.read()
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("stream ")]
    assert [line.rsplit("priority=", 1)[1] for line in lines][-2:] == ["interactive", "bulk"]


# -- stream formats and first audio ---------------------------------------------------------------


def test_async_sdk_sse_events(srv):
    async def run() -> tuple[list[dict], bytes]:
        async with (
            openai.AsyncOpenAI(
                base_url=http_url(srv) + "/v1", api_key=TOKEN, max_retries=0
            ) as client,
            client.audio.speech.with_streaming_response.create(
                model="gpt-4o-mini-tts",
                voice="alloy",
                input=TEXT,
                response_format="pcm",
                stream_format="sse",
                extra_body={"chattts": fixed(N)},
            ) as response,
        ):
            assert response.headers["content-type"].startswith("text/event-stream")
            events = [
                json.loads(line.removeprefix("data: "))
                async for line in response.iter_lines()
                if line.startswith("data: ")
            ]
        return events, b""

    events, _ = asyncio.run(run())
    deltas = [e for e in events if e["type"] == "speech.audio.delta"]
    assert deltas and events[-1]["type"] == "speech.audio.done"
    audio = b"".join(base64.b64decode(e["audio"]) for e in deltas)
    assert len(audio) == 2 * samples_for(N)
    usage = events[-1]["usage"]
    assert usage["output_tokens"] == N and usage["input_tokens"] == len(TEXT)
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]


def test_first_audio_bytes_arrive_before_generation_ends(client, srv):
    finished_before = streams_total(srv, "HTTPSpeech", "OK")
    with client.audio.speech.with_streaming_response.create(
        model="tts-1", voice="alloy", input=LONG, response_format="pcm",
        extra_body={"chattts": fixed(N)},
    ) as response:  # fmt: skip
        chunks = response.iter_bytes()
        first = next(chunks)
        # Ordering, not timing: the first bytes are here while the stream is still generating
        # (four sentences, spoken one after another, the later ones not begun).
        assert first and srv.server.admission.active == 1
        assert streams_total(srv, "HTTPSpeech", "OK") == finished_before
        rest = b"".join(chunks)
    assert len(first + rest) == 2 * 4 * samples_for(N)
    assert streams_total(srv, "HTTPSpeech", "OK") == finished_before + 1


def test_curl_streams_audio_and_sse(srv, tmp_path):
    out = tmp_path / "speech.mp3"
    body = json.dumps({"model": "tts-1", "input": TEXT, "voice": "alloy", "chattts": fixed(N)})
    common = ["curl", "-sS", "-N", "--max-time", "60", "-H", f"Authorization: Bearer {TOKEN}"]
    common += ["-H", "Content-Type: application/json", http_url(srv) + "/v1/audio/speech"]
    done = subprocess.run(
        [*common, "-d", body, "-o", str(out), "-w", "%{http_code} %{content_type}"],
        capture_output=True, text=True, timeout=90, check=True,
    )  # fmt: skip
    assert done.stdout == "200 audio/mpeg"
    audio, rate = decode(out.read_bytes(), "mp3")  # the default format is mp3, as OpenAI's
    assert rate == 24000 and audio.size >= samples_for(N)
    sse = json.loads(body) | {"stream_format": "sse", "response_format": "opus"}
    done = subprocess.run(
        [*common, "-d", json.dumps(sse)], capture_output=True, text=True, timeout=90, check=True
    )
    events = [
        json.loads(line[6:]) for line in done.stdout.splitlines() if line.startswith("data: ")
    ]
    ogg = b"".join(base64.b64decode(e["audio"]) for e in events[:-1])
    assert ogg[:4] == b"OggS" and events[-1]["type"] == "speech.audio.done"
    assert decode(ogg, "opus")[0].size == 2 * samples_for(N)


# -- errors ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "body, param",
    [
        ({"voice": "alloy"}, "input"),
        ({"input": "   "}, "input"),
        ({"input": "x" * 4001}, "input"),
        ({"input": "Hi.", "speed": 5}, "speed"),
        ({"input": "Hi.", "speed": 0.1}, "speed"),
        ({"input": "Hi.", "voice": "nobody"}, "voice"),
        ({"input": "Hi.", "voice": "seed:abc"}, "voice"),
        ({"input": "Hi.", "response_format": "ogg"}, "response_format"),
        ({"input": "Hi.", "stream_format": "websocket"}, "stream_format"),
        ({"input": "Hi.", "chattts": {"sampling": {"top_p": 2}}}, "chattts.sampling.top_p"),
        ({"input": "Hi.", "chattts": {"no_such_field": 1}}, "chattts"),
        ({"input": "Hi.", "chattts": {"priority": "urgent"}}, "chattts.priority"),
        ({"input": "Hi.", "chattts": {"priority": 42}}, "chattts.priority"),
        ({"input": "[Stts] hi."}, "input"),
        ({"input": "```\ncode only\n```"}, "input"),  # nothing left once markdown is read
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_bad_parameters_are_400_naming_the_parameter(client, body, param):
    with pytest.raises(openai.BadRequestError) as info:
        client.post("/audio/speech", body=body, cast_to=bytes)
    error = info.value.body
    assert info.value.status_code == 400
    assert error["param"] == param and error["type"] == "invalid_request_error"
    assert error["message"].startswith(param)


def test_invalid_json_is_400(srv):
    r = httpx2.post(
        http_url(srv) + "/v1/audio/speech",
        content=b"{not json",
        headers={"authorization": f"Bearer {TOKEN}", "content-type": "application/json"},
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "body"


def test_tokens_are_those_of_grpc(srv):
    missing = httpx2.post(http_url(srv) + "/v1/audio/speech", json={"input": TEXT}, timeout=30)
    assert missing.status_code == 401
    assert missing.json()["error"]["code"] == "invalid_api_key"
    wrong = openai.OpenAI(base_url=http_url(srv) + "/v1", api_key="wrong", max_retries=0)
    with wrong, pytest.raises(openai.PermissionDeniedError) as info:
        wrong.audio.speech.create(model="tts-1", voice="alloy", input=TEXT)
    assert info.value.status_code == 403 and info.value.body["code"] == "invalid_api_key"
    assert httpx2.get(http_url(srv) + "/v1/models").status_code == 401
    assert httpx2.get(http_url(srv) + "/health").json() == {"status": "SERVING"}  # open
    assert streams_total(srv, "HTTPSpeech", "PERMISSION_DENIED") >= 1
    assert streams_total(srv, "HTTPSpeech", "UNAUTHENTICATED") >= 1


def test_full_server_is_429_with_retry_after_and_a_disconnect_cancels(client, srv):
    cancelled_before = streams_total(srv, "HTTPSpeech", "CANCELLED")
    stalled_before = stalled_total(srv)
    with client.audio.speech.with_streaming_response.create(
        model="tts-1", voice="alloy", input=LONG, response_format="pcm",
        extra_body={"chattts": fixed(200)},
    ) as holder:  # fmt: skip
        chunks = holder.iter_bytes()  # kept: a dropped iterator would close the response
        assert next(chunks)  # admitted and speaking: the one place is taken
        with pytest.raises(openai.RateLimitError) as info:
            client.audio.speech.create(model="tts-1", voice="alloy", input=TEXT)
        headers = info.value.response.headers
        assert headers["retry-after"] == "1" and headers["retry-after-ms"] == "500"
        assert info.value.body["type"] == "rate_limit_error"
        assert srv.server.engine.stats().active_requests == 1
        holder.close()  # the client goes away mid-stream
        # Its generation stops: the slot is free and the stream ends CANCELLED.
        wait_freed_by_the_call(srv, stalled_before, "the disconnected stream's slot to be freed")
    assert streams_total(srv, "HTTPSpeech", "CANCELLED") == cancelled_before + 1


def _upgrade_status(url: str, ca: ssl.SSLContext) -> int:
    """The HTTP status a WebSocket upgrade to `url` got (101: upgraded)."""
    try:
        with connect(url, ssl=ca, open_timeout=10):
            return 101
    except InvalidStatus as exc:
        assert exc.response.headers["retry-after"] == "1"
        assert json.loads(exc.response.body)["error"]["code"] == "unavailable"
        return exc.response.status_code


def test_tls_from_the_same_certificate_files_and_503_while_loading(
    tiny_model_dir,
    tmp_path,
    pki,
):
    ca = ssl.create_default_context(cafile=str(pki["ca"]))
    tls = {"tls_cert": pki["server_cert"], "tls_key": pki["server_key"]}
    with http_server(tmp_path, listen_when_ready=False, **tls) as srv:  # open while loading
        url = http_url(srv, "https")
        auth = {"authorization": f"Bearer {TOKEN}"}
        body = {"input": TEXT, "voice": "alloy", "chattts": fixed(N)}
        early = httpx2.post(url + "/v1/audio/speech", json=body, headers=auth, verify=ca)
        # A WebSocket is refused before its upgrade, so a proxy can resend it elsewhere.
        early_ws = _upgrade_status(url.replace("https:", "wss:") + "/v1/audio/speech/stream", ca)
        if httpx2.get(url + "/health", verify=ca).status_code == 503:  # still loading after it
            assert early.status_code == 503 and early.json()["error"]["code"] == "unavailable"
            assert early_ws == 503
        wait_until(lambda: httpx2.get(url + "/health", verify=ca).status_code == 200, 60, "SERVING")
        with openai.OpenAI(
            base_url=url + "/v1",
            api_key=TOKEN,
            max_retries=0,
            http_client=openai.DefaultHttpxClient(verify=ca),
        ) as c:
            audio, rate = decode(
                c.audio.speech.create(
                    model="tts-1", voice="alloy", input=TEXT, response_format="flac",
                    extra_body={"chattts": fixed(N)},
                ).read(),
                "flac",
            )  # fmt: skip
        assert rate == 24000 and audio.size == samples_for(N)
        with pytest.raises(httpx2.HTTPError):  # no plaintext fall-back
            httpx2.get(http_url(srv) + "/health", timeout=5)


# -- draining -------------------------------------------------------------------------------------


@pytest.fixture
def drained_srv(tiny_model_dir, tmp_path):
    # No stall timeout: the test's steps wait on each other, never on a timer of the server's.
    with http_server(tmp_path, max_streams=3, limits={"stall_timeout_s": 0}) as server:
        yield server


def _finish(ws) -> tuple[int, int]:
    """Send a waiting WebSocket stream its text and end: its audio bytes and utterances, read
    up to its close (1000 after "done"; an error's close raises)."""
    for message in ({"type": "text", "text": TEXT}, {"type": "end"}):
        ws.send(json.dumps(message))
    replies = [m if isinstance(m, bytes) else json.loads(m) for m in ws]
    return sum(len(m) for m in replies if isinstance(m, bytes)), replies[-1]["num_utterances"]


def test_drain_closes_the_listener_serves_what_comes_on_open_connections_and_ends_them(
    drained_srv,
):
    srv, url = drained_srv, http_url(drained_srv) + "/v1/audio/speech"
    auth = {"authorization": f"Bearer {TOKEN}"}
    body = {"input": TEXT, "voice": "alloy", "response_format": "pcm", "chattts": fixed(N)}
    long = body | {"input": LONG, "chattts": fixed(60)}
    # A WebSocket waiting for its text holds its place until the test sends it, and the drain
    # waits for it before its linger begins: no keep-alive connection closes before the late
    # request goes out, however long the steps before it take (they once outlasted 10 s).
    ws_url = ws_stream_url(srv)
    with (
        connect(ws_url, additional_headers=auth, open_timeout=60) as held,
        httpx2.Client(timeout=120) as kept,  # a keep-alive connection, as a proxy holds one
    ):
        held.send(json.dumps({"type": "config"} | fixed(N)))
        wait_until(lambda: srv.server.admission.active == 1, 60, "the WebSocket admitted")
        with httpx2.stream("POST", url, json=long, headers=auth, timeout=120) as in_flight:
            chunks = in_flight.iter_bytes()
            first = next(chunks)  # then unread a while: the engine waits for its reader
            assert kept.get(http_url(srv) + "/health").status_code == 200
            drained = asyncio.run_coroutine_threadsafe(srv.server.drain(grace_s=600), srv.loop)
            # The listener closes (a proxy's next connect fails, its TCP or /health check too).
            wait_until(lambda: refuses_connections(srv.server.http_port), 60, "listener closed")
            # The kept-alive connection stays open: closing it could cut a request a proxy is
            # sending on it that very moment (HTTP/1.1 has no GOAWAY). A request sent on it is
            # served whole and answered Connection: close, and the connection ends after it.
            late = kept.post(url, json=body, headers=auth)
            assert late.status_code == 200 and len(late.content) == 2 * samples_for(N)
            assert late.headers["connection"] == "close"
            with pytest.raises(httpx2.TransportError):  # a new connection: refused
                kept.get(http_url(srv) + "/health")
            # The streams in flight finish whole: the POST (its headers went out before the
            # drain) and the WebSocket, which runs on until the drain ends.
            assert len(first + b"".join(chunks)) == 2 * 4 * samples_for(60)
        assert in_flight.headers.get("connection") != "close"
        num_bytes, num_utterances = _finish(held)
        assert num_utterances and num_bytes == 2 * num_utterances * samples_for(N)
    drained.result(120)
