"""A resumable stream over the WebSocket (`/v1/audio/speech/stream`), with the `websockets`
client through a real TCP relay whose connections are cut mid-audio, as a browser's are in a
tunnel: the listener's PCM, joined over the cuts, equals an uncut run's with the same seed, and
every JSON message of the stream arrives exactly once. The refusals say why, with the error
codes a client acts on."""

from __future__ import annotations

import contextlib
import json
import random
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect

from chattts_devtools.tcp_relay import TcpRelay
from httputil import TOKEN, http_server, wait_idle
from polling import wait_until

TEXT = [
    "Turn left onto Main Street, ",
    "then keep right at the fork. ",
    "In two hundred meters, take the exit toward the airport.",
]
CONFIG = {
    "type": "config",
    "voice": "seed:7",
    "audio_format": "pcm",
    "sampling": {"seed": 11, "max_new_tokens": 60, "min_new_tokens": 40},
    "word_timing": True,
}
# The server's own timings differ from run to run.
_TIMINGS = ("time_to_first_audio_s", "generation_time_s", "lag_s")
WAIT_S = 120  # a generous bound on one message: a loaded machine is slow, not wrong


@pytest.fixture(scope="module")
def srv(tiny_model_dir, tmp_path_factory):
    # A server of the module's own: the audio is compared with an uncut run's, so no other
    # test's streams may share its batches. Its resume window is long: a loaded machine may
    # take more than the default 20 s between a stream parking and a test's last resume.
    folder = tmp_path_factory.mktemp("ws-resume")
    limits = {"resume_window_s": 600.0}
    with http_server(folder, max_streams=2, max_queue=2, limits=limits) as server:
        yield server


@pytest.fixture
def port(srv) -> Iterator[int]:
    yield srv.server.http_port
    wait_idle(srv, "the server to be idle after the test")


def _texts() -> list[dict]:
    """The text, numbered, a mark after each piece."""
    return [
        {"type": "text", "text": text, "mark": f"m{seq}", "seq": seq}
        for seq, text in enumerate(TEXT, start=1)
    ]


@contextmanager
def _socket(port: int, token: str = TOKEN) -> Iterator[ClientConnection]:
    url = f"ws://127.0.0.1:{port}/v1/audio/speech/stream"
    with connect(
        url, additional_headers={"Authorization": f"Bearer {token}"}, open_timeout=30
    ) as ws:
        yield ws


class Listener:
    """What a client keeps to resume: the samples it has, the stream's messages since its last
    audio frame, and the id and token of the `stream` message."""

    def __init__(self) -> None:
        self.pcm = bytearray()
        self.messages: list[dict] = []
        self.since_audio = 0
        self.stream: dict = {}
        self.done = False

    @property
    def samples(self) -> int:
        return len(self.pcm) // 2

    def take(self, message: bytes | str) -> None:
        if isinstance(message, bytes):
            if message:
                self.pcm += message
                self.since_audio = 0
            return
        event = json.loads(message)
        if event["type"] in ("stream", "resumed"):
            self.stream = self.stream or event
            return
        if event["type"] == "done":
            self.done = True
            return
        self.since_audio += 1
        for name in _TIMINGS:
            event.pop(name, None)
        self.messages.append(event)


def _uncut(port: int) -> Listener:
    listener = Listener()
    with _socket(port) as ws:
        ws.send(json.dumps(CONFIG))
        for message in _texts():
            ws.send(json.dumps(message))
        ws.send(json.dumps({"type": "end"}))
        try:
            while True:
                listener.take(ws.recv(timeout=WAIT_S))
        except ConnectionClosed:
            pass
    assert listener.done and not listener.stream  # not resumable: no stream message
    return listener


def test_a_cut_websocket_resumes_and_hears_every_sample_and_message_once(port) -> None:
    want = _uncut(port)
    assert want.samples > 24000, "the uncut run spoke too little to cut it several times"
    rng = random.Random(3)
    listener = Listener()
    cuts = 0
    first: dict = {**CONFIG, "resumable": True}
    with TcpRelay(port) as relay:
        while not listener.done:
            with _socket(relay.port) as ws:
                ws.send(json.dumps(first))
                answer = ws.recv(timeout=WAIT_S)
                assert json.loads(answer)["type"] == ("resumed" if cuts else "stream"), answer
                listener.take(answer)
                # Sent again after a cut: all of it (the server applies each seq once). A
                # stream that had all its text may end and close before the last of these.
                with contextlib.suppress(ConnectionClosed):
                    for message in [*_texts(), {"type": "end"}]:
                        ws.send(json.dumps(message))
                cut_after = rng.randint(1, 4)
                try:
                    for n in range(10_000):
                        listener.take(ws.recv(timeout=WAIT_S))
                        if n == cut_after and cuts < 4:
                            relay.cut()
                            cuts += 1
                except ConnectionClosed:
                    pass
            first = {
                "type": "resume",
                "stream_id": listener.stream["stream_id"],
                "resume_token": listener.stream["resume_token"],
                "sample_offset": listener.samples,
                "events_received": listener.since_audio,
            }
    assert cuts == 4
    assert listener.samples == want.samples
    assert bytes(listener.pcm) == bytes(want.pcm)
    assert listener.messages == want.messages
    assert [m["name"] for m in listener.messages if m["type"] == "mark"] == ["m1", "m2", "m3"]


def _resumable_stream(port: int) -> dict:
    """A resumable stream whose socket leaves after its first audio: its `stream` message."""
    with _socket(port) as ws:
        ws.send(json.dumps({**CONFIG, "resumable": True}))
        stream = json.loads(ws.recv(timeout=WAIT_S))
        for message in _texts():
            ws.send(json.dumps(message))
        while not isinstance(ws.recv(timeout=WAIT_S), bytes):
            pass
    return stream


def _refusal(port: int, resume: dict, token: str = TOKEN) -> tuple[dict, int]:
    """A resume's answer: the error message and the close code."""
    with _socket(port, token) as ws:
        ws.send(json.dumps({"type": "resume", **resume}))
        error = json.loads(ws.recv(timeout=WAIT_S))
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=WAIT_S)
    assert closed.value.rcvd is not None
    return error, closed.value.rcvd.code


def test_refused_resumes_say_why_and_a_cancel_lets_the_stream_go(port, srv) -> None:
    resumer = srv.server.synthesis.resumer
    # Streams other tests ended are held too, for the window: counted from here.
    held, parked = resumer.held, resumer.parked
    stream = _resumable_stream(port)
    resume = {"stream_id": stream["stream_id"], "resume_token": stream["resume_token"]}
    wait_until(lambda: resumer.parked == parked + 1, WAIT_S, "the stream parked")

    error, code = _refusal(port, {**resume, "resume_token": "0" * 32})
    assert (error["error"]["code"], code) == ("invalid_api_key", 1008)
    error, code = _refusal(port, {**resume, "stream_id": "deadbeef-" + "0" * 24})
    assert (error["error"]["code"], code) == ("not_found", 1008)
    assert "another replica" in error["error"]["message"]
    error, code = _refusal(port, {**resume, "sample_offset": 10**9})
    assert (error["error"]["code"], code) == ("out_of_range", 1007)
    assert resumer.parked == parked + 1  # none of those touched it

    with _socket(port) as ws:
        ws.send(json.dumps({"type": "resume", **resume}))
        assert json.loads(ws.recv(timeout=WAIT_S))["type"] == "resumed"
        ws.send(json.dumps({"type": "cancel"}))
        closing = None
        try:
            while True:
                ws.recv(timeout=WAIT_S)
        except ConnectionClosed as exc:
            closing = exc.rcvd
    assert closing is not None and closing.code == 1000
    wait_until(lambda: resumer.held == held, WAIT_S, "the cancelled stream let go")


@pytest.mark.parametrize(
    "resume, param",
    [
        ({"stream_id": 5}, "stream_id"),
        ({"sample_offset": -1}, "sample_offset"),
        ({"events_received": "two"}, "events_received"),
    ],
)
def test_a_malformed_resume_is_invalid_argument_naming_the_field(port, resume, param) -> None:
    fields = {"stream_id": "x", "resume_token": "y", **resume}
    error, code = _refusal(port, fields)
    assert (error["error"]["param"], code) == (param, 1007)


def test_the_upgrade_names_a_stream_id_for_a_proxy_to_stick_on(port) -> None:
    with _socket(port) as ws:
        named = ws.response.headers["chattts-stream-id"]
        ws.send(json.dumps({**CONFIG, "resumable": True}))
        stream = json.loads(ws.recv(timeout=WAIT_S))
        ws.send(json.dumps({"type": "cancel"}))
    assert stream["type"] == "stream" and stream["stream_id"] == named
    assert len(stream["resume_token"]) == 32 and stream["text_seq"] == 0
