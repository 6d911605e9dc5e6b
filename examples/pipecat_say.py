"""A Pipecat pipeline speaking an LLM reply through chattts-stream, the output written to a WAV.

Run `make run` in one shell, then: python examples/pipecat_say.py [--target HOST:PORT] [--out F]
(needs `pip install "chattts-stream[pipecat]"`). In a voice agent, put the service where the TTS
goes: `Pipeline([transport.input(), stt, user_aggregator, llm, tts, transport.output(), ...])`;
tests/e2e/test_pipecat_adapter.py runs this script.
"""

from __future__ import annotations

import argparse
import asyncio
import wave

from pipecat.frames.frames import (
    EndFrame,
    Frame,
    LLMFullResponseEndFrame,
    LLMFullResponseStartFrame,
    LLMTextFrame,
    TTSAudioRawFrame,
)
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineWorker
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
from pipecat.workers.runner import WorkerRunner

from chattts_client import SynthesisOptions
from chattts_client.pipecat import ChatTTSTTSService


class WavSink(FrameProcessor):
    """Stands in for a transport's audio output."""

    def __init__(self, wav: wave.Wave_write) -> None:
        super().__init__()
        self._wav = wav

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if isinstance(frame, TTSAudioRawFrame):
            self._wav.writeframes(frame.audio)
        await self.push_frame(frame, direction)


async def say(target: str, out: str, max_new_tokens: int | None = None) -> float:
    options = SynthesisOptions(voice="seed:1234", max_new_tokens=max_new_tokens)
    tts = ChatTTSTTSService(target, options)
    with wave.open(out, "wb") as wav:
        wav.setnchannels(1)
        wav.setsampwidth(2)
        wav.setframerate(24000)  # the pipeline's default output rate; the server resamples
        worker = PipelineWorker(Pipeline([tts, WavSink(wav)]))
        tokens = ["Hello", " from", " Pipecat.", " Tokens", " stream", " in."]
        await worker.queue_frames(
            [
                LLMFullResponseStartFrame(),
                *[LLMTextFrame(t) for t in tokens],  # as an LLM service emits them
                LLMFullResponseEndFrame(),  # end of turn: the service flushes
                EndFrame(),
            ]
        )
        runner = WorkerRunner(handle_sigint=False)
        await runner.add_workers(worker)
        await runner.run()
        return wav.tell() / 24000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="localhost:50051")
    parser.add_argument(
        "--max-new-tokens", type=int, help="cap on audio tokens per sentence (server default)"
    )
    parser.add_argument("--out", default="pipecat.wav")
    args = parser.parse_args()
    print(
        f"wrote {args.out}: {asyncio.run(say(args.target, args.out, args.max_new_tokens)):.2f} s of audio"
    )


if __name__ == "__main__":
    main()
