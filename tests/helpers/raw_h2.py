"""One HTTP/2 connection driven frame by frame (hyperframe + hpack), for tests that must see
what a proxy sees: GOAWAY and its last stream id, RST_STREAM codes, which frame came first, and
whether the connection ended with FIN or a reset. It sends only what it is told to (and the
SETTINGS and PING acknowledgements HTTP/2 requires), so it can open a stream after the server
said GOAWAY, as a proxy racing the GOAWAY does.

    conn = RawH2("127.0.0.1", port)
    conn.grpc_request(1, "/chattts.v1.TextToSpeech/Synthesize", request_message)
    for event in conn.events(): ...   # Headers, Data, GoAway, Reset, Closed
"""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import hpack
from google.protobuf.message import Message
from hyperframe.frame import (
    DataFrame,
    Frame,
    GoAwayFrame,
    HeadersFrame,
    PingFrame,
    RstStreamFrame,
    SettingsFrame,
    WindowUpdateFrame,
)

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
REFUSED_STREAM = 0x7


@dataclass
class Event:
    at: float  # time.monotonic()
    stream_id: int


@dataclass
class Headers(Event):
    headers: dict[str, str] = field(default_factory=dict)
    end_stream: bool = False


@dataclass
class Data(Event):
    data: bytes = b""
    end_stream: bool = False


@dataclass
class GoAway(Event):
    last_stream_id: int = 0
    error_code: int = 0
    debug: bytes = b""


@dataclass
class Reset(Event):
    error_code: int = 0


@dataclass
class Closed(Event):
    reset: bool = False  # the peer reset the connection (RST) instead of closing it (FIN)


def grpc_messages(events: list[Event], stream_id: int) -> list[bytes]:
    """The gRPC messages of one stream's DATA frames (a message may span several frames)."""
    body = b"".join(e.data for e in events if isinstance(e, Data) and e.stream_id == stream_id)
    out = []
    while len(body) >= 5:
        (length,) = struct.unpack(">I", body[1:5])
        out.append(body[5 : 5 + length])
        body = body[5 + length :]
    return out


def grpc_frame(message: Message) -> bytes:
    body = message.SerializeToString()
    return b"\0" + struct.pack(">I", len(body)) + body


class RawH2:
    def __init__(self, host: str, port: int, timeout_s: float = 60.0) -> None:
        self.sock = socket.create_connection((host, port), timeout=timeout_s)
        self._encoder, self._decoder = hpack.Encoder(), hpack.Decoder()
        self._buffer = b""
        # A large window: the tests read every byte, none should wait on flow control.
        settings = SettingsFrame(0, settings={SettingsFrame.INITIAL_WINDOW_SIZE: 1 << 24})
        window = WindowUpdateFrame(0, window_increment=(1 << 30))
        self.sock.sendall(PREFACE + settings.serialize() + window.serialize())

    def grpc_request(self, stream_id: int, path: str, message: Message, end: bool = True) -> None:
        """HEADERS and one DATA frame with `message` (END_STREAM unless `end` is False)."""
        headers = [
            (":method", "POST"),
            (":scheme", "http"),
            (":path", path),
            (":authority", "chattts"),
            ("content-type", "application/grpc"),
            ("te", "trailers"),
        ]
        frame = HeadersFrame(stream_id, self._encoder.encode(headers))
        frame.flags.add("END_HEADERS")
        data = DataFrame(stream_id, grpc_frame(message))
        if end:
            data.flags.add("END_STREAM")
        self.sock.sendall(frame.serialize() + data.serialize())

    def events(self) -> Iterator[Event]:
        """Every frame that matters to a test, in arrival order, then Closed."""
        while True:
            while (frame := self._next_frame()) is not None:
                event = self._event(frame)
                if event is not None:
                    yield event
            try:
                data = self.sock.recv(1 << 16)
            except ConnectionResetError:
                yield Closed(time.monotonic(), 0, reset=True)
                return
            if not data:
                yield Closed(time.monotonic(), 0)
                return
            self._buffer += data

    def _next_frame(self) -> Frame | None:
        if len(self._buffer) < 9:
            return None
        frame, length = Frame.parse_frame_header(memoryview(self._buffer[:9]))
        if len(self._buffer) < 9 + length:
            return None
        frame.parse_body(memoryview(self._buffer[9 : 9 + length]))
        self._buffer = self._buffer[9 + length :]
        return frame

    def _event(self, frame: Frame) -> Event | None:
        now = time.monotonic()
        if isinstance(frame, HeadersFrame):
            headers = dict(self._decoder.decode(frame.data, raw=False))
            return Headers(now, frame.stream_id, headers, "END_STREAM" in frame.flags)
        if isinstance(frame, DataFrame):
            return Data(now, frame.stream_id, bytes(frame.data), "END_STREAM" in frame.flags)
        if isinstance(frame, GoAwayFrame):
            return GoAway(
                now, 0, frame.last_stream_id, frame.error_code, bytes(frame.additional_data)
            )
        if isinstance(frame, RstStreamFrame):
            return Reset(now, frame.stream_id, frame.error_code)
        if isinstance(frame, SettingsFrame) and "ACK" not in frame.flags:
            ack = SettingsFrame(0)
            ack.flags.add("ACK")
            self.sock.sendall(ack.serialize())
        elif isinstance(frame, PingFrame) and "ACK" not in frame.flags:
            ack = PingFrame(0, opaque_data=frame.opaque_data)
            ack.flags.add("ACK")
            self.sock.sendall(ack.serialize())
        return None

    def close(self) -> None:
        self.sock.close()
