"""Hostile clients at the HTTP doors (POST and WebSocket): malformed HTTP over raw sockets, JSON
bombs, the limits on the body, the headers and WebSocket messages, 405, the schema on a token
server, a failure inside the engine. RELIABILITY.md's bad-input table at these doors: every
case gets its documented answer, and nothing a client sends makes a 5xx, an ASGI exception or
an ERROR in the log (`LogRecorder.problems`)."""

from __future__ import annotations

import json
import socket

import httpx2
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from httputil import (
    TOKEN,
    LogRecorder,
    fixed,
    http_server,
    http_url,
    streams_total,
    wait_idle,
    ws_stream_url,
)
from polling import wait_until
from serverutil import FaultyRunner

LIMITS = {"max_body_bytes": 64 << 10, "max_header_bytes": 8 << 10, "max_ws_message_bytes": 64 << 10}
AUTH = {"authorization": f"Bearer {TOKEN}"}
WS_METHOD = "HTTPSpeechStream"


@pytest.fixture(scope="module")
def srv(tiny_model_dir, tmp_path_factory):
    with http_server(
        tmp_path_factory.mktemp("hostile"), max_streams=2, max_queue=0, limits=LIMITS
    ) as server:
        yield server


@pytest.fixture
def log(srv):
    with LogRecorder() as recorder:
        yield recorder
        wait_idle(srv, "the server to be idle after the test")
    assert recorder.problems() == []
    assert httpx2.get(http_url(srv) + "/health").status_code == 200


def _raw(srv, data: bytes, timeout_s: float = 10) -> bytes:
    """Send `data` on a fresh connection, then read until the server closes it."""
    with socket.create_connection(("127.0.0.1", srv.server.http_port), timeout=timeout_s) as s:
        s.sendall(data)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
        return out


def _status(response: bytes) -> int:
    return int(response.split(b" ", 2)[1])


def _head(path: str, *headers: str, method: str = "POST") -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1", f"Authorization: Bearer {TOKEN}"]
    return ("\r\n".join([*lines, *headers]) + "\r\n\r\n").encode()


# -- POST: the body --------------------------------------------------------------------------------

DEEP = "[" * 10_000 + "]" * 10_000


@pytest.mark.parametrize(
    "body, param",
    [
        (DEEP.encode(), "body"),
        (b'{"input": ' + DEEP.encode() + b"}", "body"),
        (b'{"input": "Hi.", "chattts": ' + b'{"a": ' * 40 + b"1" + b"}" * 41, "chattts.a"),
        (b'{"input": "Hi.", "chattts": {"\\ud800": 1}}', "chattts"),
        (b'{"input": "\\ud800 hi"}', "input"),
        (b"\xff\xfe{}", "body"),
        (b'{"input": "Hi.", "speed": NaN}', "speed"),
        (b'{"input": "Hi.", "speed": Infinity}', "speed"),
        (b'{"input": "Hi.", "chattts": {"sampling": {"temperature": "NaN"}}}',
         "chattts.sampling.temperature"),
        (b'{"input": "Hi.", "chattts": {"audio_format": {"sample_rate_hz": 12345}}}',
         "chattts.audio_format.sample_rate_hz"),
        (b'{"input": "Hi.", "chattts": {"text_format": 99}}', "chattts"),
        (b'{"input": "Hi.", "voice": {"id": ["alloy"]}}', "voice.id"),
        (b'{"input": 7}', "input"),
        (b"[]", "body"),
    ],
    ids=["deep-body", "deep-input", "deep-chattts", "surrogate-key", "surrogate-input",
         "not-utf8", "nan-speed", "inf-speed", "nan-temperature", "bad-rate", "unknown-enum",
         "voice-id-list", "input-number", "not-object"],
)  # fmt: skip
def test_bad_bodies_are_400_naming_the_field(srv, log, body, param):
    r = httpx2.post(
        http_url(srv) + "/v1/audio/speech",
        content=body,
        headers=AUTH | {"content-type": "application/json"},
        timeout=30,
    )
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"].startswith(param) and error["type"] == "invalid_request_error"


def test_a_declared_body_over_the_limit_is_413_before_it_is_read(srv, log):
    # 1 GiB declared, nothing sent: the answer comes at once, from the header alone.
    response = _raw(srv, _head("/v1/audio/speech", "Content-Length: 1073741824"))
    assert _status(response) == 413  # a server waiting for the body would never answer
    assert b"connection: close" in response.lower() and b'"param": "body"' in response


def test_a_chunked_body_over_the_limit_is_413_while_it_is_read(srv, log):
    chunk = b"4000\r\n" + b" " * 0x4000 + b"\r\n"  # 16 KiB of JSON whitespace
    body = b'f\r\n{"input": "Hi."\r\n' + chunk * 5 + b"1\r\n}\r\n0\r\n\r\n"  # 80 KiB > 64 KiB
    head = _head("/v1/audio/speech", "Transfer-Encoding: chunked", "Content-Type: application/json")
    response = _raw(srv, head + body)
    assert _status(response) == 413


@pytest.mark.parametrize("complete", [True, False], ids=["complete-head", "endless-head"])
def test_headers_over_the_limit_are_431(srv, log, complete):
    many = [f"X-Filler-{i}: {'a' * 90}" for i in range(100)]  # ~10 KiB > 8 KiB
    if complete:
        request = _head("/health", *many, method="GET")
    else:  # a head that never ends: refused once it passes the limit, not buffered on
        request = _head("/health", method="GET")[:-2] + b"X-Big: " + b"a" * (20 << 10)
    assert _status(_raw(srv, request)) == 431
    # The WebSocket handshake is parsed by the same protocol.
    upgrade = ["Upgrade: websocket", "Connection: Upgrade", "Sec-WebSocket-Version: 13",
               "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ=="]  # fmt: skip
    handshake = _head("/v1/audio/speech/stream", *upgrade, *many, method="GET")
    assert _status(_raw(srv, handshake)) == 431


def _lines_about_it(log: LogRecorder) -> list[str]:
    return [line for line in log.lines() if "stream method=" not in line]


def test_a_client_leaving_mid_upload_is_one_info_line(srv, log):
    head = _head("/v1/audio/speech", "Content-Length: 1000", "Content-Type: application/json")
    with socket.create_connection(("127.0.0.1", srv.server.http_port)) as s:
        s.sendall(head + b'{"input": ')  # 10 of the 1000 bytes, then away
    wait_until(lambda: _lines_about_it(log), 30, "the server to notice")
    (line,) = _lines_about_it(log)
    assert line.startswith("INFO ") and "went away before its request was read" in line


def test_a_malformed_chunk_is_400_and_one_info_line(srv, log):
    head = _head("/v1/audio/speech", "Transfer-Encoding: chunked", "Content-Type: application/json")
    response = _raw(srv, head + b"zz\r\nnot a chunk\r\n")
    assert _status(response) == 400
    wait_until(lambda: _lines_about_it(log), 30, "the server to notice")
    assert [line.split(" ")[0] for line in _lines_about_it(log)] == ["INFO"]


def test_a_malformed_request_line_is_400_and_one_info_line(srv, log):
    assert _status(_raw(srv, b"GET /\x00 HTTP/1.1\r\nHost: x\r\n\r\n")) == 400
    (line,) = _lines_about_it(log)
    assert line.startswith("INFO ") and "malformed HTTP request" in line


def test_405_says_what_is_allowed(srv, log):
    r = httpx2.get(http_url(srv) + "/v1/audio/speech", headers=AUTH)
    assert r.status_code == 405 and r.headers["allow"] == "POST"
    r = httpx2.delete(http_url(srv) + "/health")
    assert r.status_code == 405 and "GET" in r.headers["allow"]


def test_the_schema_needs_the_token_and_docs_are_off(srv, log):
    url = http_url(srv)
    assert httpx2.get(url + "/openapi.json").status_code == 401
    schema = httpx2.get(url + "/openapi.json", headers=AUTH).json()
    assert "/v1/audio/speech" in schema["paths"]
    assert httpx2.get(url + "/docs").status_code == 404


# -- WebSocket frames -------------------------------------------------------------------------------


def _ws_url(srv) -> str:
    return ws_stream_url(srv)


def _until_closed(ws) -> list[bytes | dict]:
    out: list[bytes | dict] = []
    try:
        while True:
            message = ws.recv(timeout=30)
            out.append(message if isinstance(message, bytes) else json.loads(message))
    except ConnectionClosed:
        return out


BAD_FRAMES = [
    ("{not json", "message"),
    (DEEP, "message"),
    ('{"type": "text", "text": ' + "[" * 50 + "]" * 50 + "}", "text"),
    ('{"type": "text", "text": "\\ud800"}', "text"),
    ('{"\\ud800": 1, "type": "text"}', "message"),
    (b"\x00\x01", "message"),
    ('"just a string"', "message"),
    ('{"type": "text", "text": "' + "x" * 4001 + '"}', "text.text"),
]
BAD_IDS = ["not-json", "deep", "deep-field", "surrogate", "surrogate-key", "binary", "not-object",
           "over-max-text-chars"]  # fmt: skip


@pytest.mark.parametrize("frame, param", BAD_FRAMES, ids=BAD_IDS)
def test_a_bad_frame_mid_stream_fails_the_stream(srv, log, frame, param):
    """Config, buffered text, then a bad frame: an error naming the field and close 1007; the
    buffered text is not spoken as if the text had ended, and the stream is counted failed."""
    failed_before = streams_total(srv, WS_METHOD, "INVALID_ARGUMENT")
    ok_before = streams_total(srv, WS_METHOD, "OK")
    with connect(_ws_url(srv), additional_headers=AUTH) as ws:
        ws.send(json.dumps({"type": "config", "sampling": fixed(4)["sampling"]}))
        ws.send(json.dumps({"type": "text", "text": "Hello "}))
        ws.send(frame)
        events = _until_closed(ws)
        assert ws.close_code == 1007
    kinds = [e["type"] for e in events if isinstance(e, dict)]
    assert kinds == ["error"], events
    assert events[-1]["error"]["param"] == param
    wait_until(
        lambda: streams_total(srv, WS_METHOD, "INVALID_ARGUMENT") == failed_before + 1,
        30,
        "the stream to be counted failed",
    )
    assert streams_total(srv, WS_METHOD, "OK") == ok_before
    assert any("method=HTTPSpeechStream status=INVALID_ARGUMENT" in line for line in log.lines())


@pytest.mark.parametrize("frame, param", BAD_FRAMES[:7], ids=BAD_IDS[:7])
def test_a_bad_first_frame_is_refused(srv, log, frame, param):
    with connect(_ws_url(srv), additional_headers=AUTH) as ws:
        ws.send(frame)
        events = _until_closed(ws)
        assert ws.close_code == 1007
    (error,) = events
    assert error["type"] == "error" and error["error"]["param"] in (param, "config")


@pytest.mark.parametrize(
    "config, param",
    [
        ({"sampling": {"temperature": "NaN"}}, "config.sampling.temperature"),
        ({"sampling": {"top_p": "Infinity"}}, "config.sampling.top_p"),
        ({"audio_format": {"sample_rate_hz": 12345}}, "config.audio_format.sample_rate_hz"),
        ({"audio_format": {"encoding": "NO_SUCH"}}, "config"),
        ({"voice": "seed:abc"}, "config.voice"),
        ({"sampling": {"\ud800": 1}}, "config.sampling"),
    ],
    ids=["nan", "inf", "bad-rate", "unknown-enum", "bad-seed", "surrogate-key"],
)
def test_bad_config_fields_are_named(srv, log, config, param):
    with connect(_ws_url(srv), additional_headers=AUTH) as ws:
        ws.send(json.dumps({"type": "config", **config}))
        events = _until_closed(ws)
        assert ws.close_code == 1007
    assert events[0]["error"]["param"] == param


def test_a_message_over_the_limit_closes_1009_and_fails_the_stream(srv, log):
    failed_before = streams_total(srv, WS_METHOD, "INVALID_ARGUMENT")
    with connect(_ws_url(srv), additional_headers=AUTH, max_size=None) as ws:
        ws.send(json.dumps({"type": "config", "sampling": fixed(4)["sampling"]}))
        ws.send(json.dumps({"type": "text", "text": "Hello "}))
        ws.send(json.dumps({"type": "text", "text": "x" * (100 << 10)}))  # > 64 KiB
        events = _until_closed(ws)
        assert ws.close_code == 1009
    assert not [e for e in events if isinstance(e, dict) and e["type"] == "done"]
    wait_until(
        lambda: streams_total(srv, WS_METHOD, "INVALID_ARGUMENT") == failed_before + 1,
        30,
        "the stream to be counted failed",
    )
    # The `log` fixture then collects garbage and finds no "Task exception was never retrieved".


def test_whitespace_fragments_are_text_not_errors(srv, log):
    with connect(_ws_url(srv), additional_headers=AUTH) as ws:
        ws.send(json.dumps({"type": "config", "sampling": fixed(4)["sampling"]}))
        for token in ["Hello", " ", "", "there", "\n\n", " ", "again", "."]:
            ws.send(json.dumps({"type": "text", "text": token}))
        ws.send(json.dumps({"type": "end"}))
        events = _until_closed(ws)
        assert ws.close_code == 1000
    assert [e["type"] for e in events if isinstance(e, dict)][-1] == "done"


def test_wrong_token_is_1008_and_counted(srv, log):
    before = streams_total(srv, WS_METHOD, "PERMISSION_DENIED")
    with connect(_ws_url(srv), additional_headers={"authorization": "Bearer wrong"}) as ws:
        events = _until_closed(ws)
        assert ws.close_code == 1008
    assert events[0]["error"]["code"] == "invalid_api_key"
    assert streams_total(srv, WS_METHOD, "PERMISSION_DENIED") == before + 1
    assert any("rejected HTTPSpeechStream: wrong bearer token" in line for line in log.lines())


# -- a failure inside the engine -------------------------------------------------------------------


@pytest.fixture(scope="module")
def faulty(tiny_model_dir, tmp_path_factory):
    def runner(config):
        made = FaultyRunner(config)
        made.fail_text = "BOOM"
        return made

    with http_server(tmp_path_factory.mktemp("faulty"), runner_factory=runner) as server:
        yield server


def test_an_engine_failure_is_a_short_500_and_1011(faulty):
    body = {"input": "This goes BOOM.", "response_format": "pcm", "chattts": fixed(8)}
    r = httpx2.post(http_url(faulty) + "/v1/audio/speech", json=body, headers=AUTH, timeout=30)
    assert r.status_code == 500
    error = r.json()["error"]
    assert error["type"] == "server_error" and "BOOM" in error["message"]
    assert "Traceback" not in error["message"] and len(error["message"]) < 300
    with connect(_ws_url(faulty), additional_headers=AUTH) as ws:
        ws.send(json.dumps({"type": "config", "sampling": fixed(8)["sampling"]}))
        ws.send(json.dumps({"type": "text", "text": "This goes BOOM.", "flush": True}))
        events = _until_closed(ws)
        assert ws.close_code == 1011
    assert events[-1]["error"]["type"] == "server_error"
    ok = {"input": "A calm one.", "response_format": "pcm", "chattts": fixed(8)}
    assert (
        httpx2.post(http_url(faulty) + "/v1/audio/speech", json=ok, headers=AUTH).status_code == 200
    )
