"""Resumable streams through a real TCP relay whose connections are cut mid-audio: the generated
stubs by hand, as a stub or grpcurl user writes the resume (tests/integration/test_resume_client.py
has the client library doing it by itself).

The listener's PCM, joined over the cuts, must equal an uncut run's with the same seed, and
every event must arrive exactly once."""

from __future__ import annotations

import random
from collections.abc import Iterator

import grpc

from chattts_devtools.tcp_relay import TcpRelay
from chattts_proto.chattts.v1 import tts_pb2, tts_pb2_grpc

TEXT = [
    "Turn left onto Main Street, ",
    "then keep right at the fork. ",
    "In two hundred meters, take the exit toward the airport.",
]
CALL_TIMEOUT_S = 300


def _config(**fields: object) -> tts_pb2.SynthesisConfig:
    return tts_pb2.SynthesisConfig(
        voice=tts_pb2.Voice(seed=7),
        sampling=tts_pb2.Sampling(seed=11, max_new_tokens=60, min_new_tokens=40),
        word_timing=True,
        **fields,
    )


def _texts() -> list[tts_pb2.StreamingSynthesizeRequest]:
    """The text, a mark after each piece; the last message says so (a resumable stream's end:
    a half-close is not)."""
    return [
        tts_pb2.StreamingSynthesizeRequest(
            text=tts_pb2.TextInput(text=text, mark=f"m{seq}", seq=seq, last=seq == len(TEXT))
        )
        for seq, text in enumerate(TEXT, start=1)
    ]


def _requests(first: tts_pb2.StreamingSynthesizeRequest, rest: list) -> Iterator:  # type: ignore[type-arg]
    yield first
    yield from rest


class Listener:
    """What a stub user keeps to resume: the audio it has, the events since its last chunk."""

    def __init__(self) -> None:
        self.pcm = bytearray()
        self.offset = 0
        self.events_since_audio = 0
        self.events: list[tuple[str, str]] = []

    def take(self, response: tts_pb2.StreamingSynthesizeResponse) -> None:
        which = response.WhichOneof("response")
        if which == "audio" and response.audio.num_samples:
            assert response.audio.sample_offset == self.offset, "audio not contiguous"
            self.pcm += response.audio.audio
            self.offset += response.audio.num_samples
            self.events_since_audio = 0
            return
        self.events_since_audio += 1
        event = type(getattr(response, which))()
        event.CopyFrom(getattr(response, which))
        if which == "utterance_end":  # the server's own timings differ from run to run
            for name in ("time_to_first_audio_s", "generation_time_s", "lag_s"):
                event.ClearField(name)
        self.events.append((which, str(event).replace("\n", " ")))


def _uncut(target: str) -> Listener:
    listener = Listener()
    with grpc.insecure_channel(target) as channel:
        stub = tts_pb2_grpc.TextToSpeechStub(channel)
        first = tts_pb2.StreamingSynthesizeRequest(config=_config())
        for response in stub.StreamingSynthesize(
            _requests(first, _texts()), timeout=CALL_TIMEOUT_S
        ):
            listener.take(response)
    return listener


def _metadata(call: grpc.Call) -> dict[str, str]:
    return {k: v for k, v in call.initial_metadata()}


def test_a_stub_user_resumes_a_cut_stream_and_hears_every_sample_and_event_once(
    resume_server,
) -> None:  # type: ignore[no-untyped-def]
    want = _uncut(resume_server.target)
    assert want.offset > 24000, "the uncut run spoke too little to cut it several times"
    rng = random.Random(5)
    listener = Listener()
    cuts = 0
    with TcpRelay(resume_server.port) as relay:
        first = tts_pb2.StreamingSynthesizeRequest(config=_config(resumable=True))
        pending = _texts()
        headers: dict[str, str] = {}
        while True:
            with grpc.insecure_channel(relay.target) as channel:
                stub = tts_pb2_grpc.TextToSpeechStub(channel)
                call = stub.StreamingSynthesize(_requests(first, pending), timeout=CALL_TIMEOUT_S)
                headers = headers or _metadata(call)
                cut_after = rng.randint(1, 3)
                try:
                    for n, response in enumerate(call):
                        listener.take(response)
                        if n == cut_after and cuts < 4:
                            relay.cut()
                            cuts += 1
                    break
                except grpc.RpcError as exc:
                    assert exc.code() in (
                        grpc.StatusCode.UNAVAILABLE,
                        grpc.StatusCode.UNKNOWN,
                        grpc.StatusCode.INTERNAL,
                    ), exc
            first = tts_pb2.StreamingSynthesizeRequest(
                resume=tts_pb2.ResumeStream(
                    stream_id=headers["chattts-stream-id"],
                    resume_token=headers["chattts-resume-token"],
                    sample_offset=listener.offset,
                    events_received=listener.events_since_audio,
                )
            )
            pending = _texts()  # all again: the server applies each seq once
    assert listener.offset == want.offset
    assert bytes(listener.pcm) == bytes(want.pcm)
    assert listener.events == want.events
    assert cuts == 4
