"""A fake TextToSpeech servicer for the client library tests: every utterance answered with
NUM_CHUNKS fixed LINEAR16 chunks and an UtteranceEnd, the requests and metadata it saw kept."""

from __future__ import annotations

from concurrent import futures
from dataclasses import dataclass, field

import grpc
import numpy as np

from chattts_proto.chattts.v1 import tts_pb2, tts_pb2_grpc

SAMPLE_RATE_HZ = 24000
NUM_CHUNKS = 3
CHUNK_SAMPLES = 2400  # 0.1 s
TOKEN = "s3cret"
CALL_TIMEOUT_S = 10.0


def _chunk_pcm(index: int) -> bytes:
    t = np.arange(CHUNK_SAMPLES) + index * CHUNK_SAMPLES
    return (np.sin(2 * np.pi * 440 * t / SAMPLE_RATE_HZ) * 8000).astype("<i2").tobytes()


EXPECTED_PCM = b"".join(_chunk_pcm(i) for i in range(NUM_CHUNKS))


@dataclass
class FakeServicer(tts_pb2_grpc.TextToSpeechServicer):
    """Answers every utterance with NUM_CHUNKS fixed LINEAR16 chunks and an UtteranceEnd."""

    metadata: list[dict[str, str]] = field(default_factory=list)
    synthesize_requests: list[tts_pb2.SynthesizeRequest] = field(default_factory=list)
    stream_requests: list[tts_pb2.StreamingSynthesizeRequest] = field(default_factory=list)

    def _responses(self, cls, utterance_index, text):  # type: ignore[no-untyped-def]
        offset = utterance_index * NUM_CHUNKS * CHUNK_SAMPLES
        for i in range(NUM_CHUNKS):
            yield cls(
                audio=tts_pb2.AudioChunk(
                    audio=_chunk_pcm(i),
                    sample_offset=offset + i * CHUNK_SAMPLES,
                    num_samples=CHUNK_SAMPLES,
                    utterance_index=utterance_index,
                    sample_rate_hz=SAMPLE_RATE_HZ,
                    encoding=tts_pb2.LINEAR16,
                )
            )
        yield cls(
            utterance_end=tts_pb2.UtteranceEnd(
                utterance_index=utterance_index,
                text=text,
                audio_duration_s=NUM_CHUNKS * CHUNK_SAMPLES / SAMPLE_RATE_HZ,
                time_to_first_audio_s=0.01,
                generation_time_s=0.02,
                num_tokens=14,
                finish_reason="eos",
            )
        )

    def Synthesize(self, request, context):  # type: ignore[no-untyped-def]
        self.metadata.append(dict(context.invocation_metadata()))
        self.synthesize_requests.append(request)
        if request.text == "fail":
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "text: rejected by fake")
        yield from self._responses(tts_pb2.SynthesizeResponse, 0, request.text)

    def StreamingSynthesize(self, request_iterator, context):  # type: ignore[no-untyped-def]
        self.metadata.append(dict(context.invocation_metadata()))
        utterance_index = 0
        for request in request_iterator:
            if request.WhichOneof("request") == "receipt":
                continue  # read receipts: nothing here waits for them
            self.stream_requests.append(request)
            t = request.text
            if request.WhichOneof("request") == "text" and (t.text or t.flush or t.clear or t.mark):
                # An empty fragment changes nothing, as on the real server (a `last` message).
                yield from self._responses(
                    tts_pb2.StreamingSynthesizeResponse, utterance_index, request.text.text
                )
                utterance_index += 1
                if request.text.mark:  # answered after the audio of the text before it
                    offset = utterance_index * NUM_CHUNKS * CHUNK_SAMPLES
                    yield tts_pb2.StreamingSynthesizeResponse(
                        mark=tts_pb2.Mark(
                            name=request.text.mark,
                            sample_offset=offset,
                            offset_s=offset / SAMPLE_RATE_HZ,
                        )
                    )
            if t.last:  # the text's end, in band: the stream ends (the client's requests stay open)
                return

    def ListVoices(self, request, context):  # type: ignore[no-untyped-def]
        self.metadata.append(dict(context.invocation_metadata()))
        return tts_pb2.ListVoicesResponse(
            voices=[
                tts_pb2.VoiceInfo(name="alice", description="calm, female"),
                tts_pb2.VoiceInfo(name="bob", description="fast, male"),
            ]
        )


def start_fake_server(servicer: FakeServicer, credentials=None):  # type: ignore[no-untyped-def]
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    tts_pb2_grpc.add_TextToSpeechServicer_to_server(servicer, server)
    if credentials is None:
        port = server.add_insecure_port("127.0.0.1:0")
    else:
        port = server.add_secure_port("127.0.0.1:0", credentials)
    server.start()
    return server, port
