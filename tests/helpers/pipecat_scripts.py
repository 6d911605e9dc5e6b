"""What the Pipecat adapter tests share: the preamble of the scripts they run in the Pipecat
venv (tests/helpers/clientvenv.py), and the length of an utterance heard whole."""

from __future__ import annotations

from chattts_client import AudioChunkEvent, TTSClient, make_config

# What the scripts share: `run_in` runs it in the Pipecat venv ahead of each script.
SCRIPT_HELPERS = r"""
import time
from loguru import logger
logger.remove()  # before pipecat is imported; each script adds the sink it wants
from pipecat.frames.frames import LLMTextFrame, TTSAudioRawFrame, TTSStoppedFrame
from pipecat.observers.base_observer import BaseObserver
from pipecat.tests.utils import SleepFrame

class Seen(BaseObserver):  # counts what the TTS service pushes
    def __init__(self, tts):
        super().__init__()
        self.tts, self.audio, self.stopped = tts, 0, 0

    async def on_push_frame(self, data):
        if data.source is self.tts and isinstance(data.frame, TTSAudioRawFrame):
            self.audio += 1
        elif data.source is self.tts and isinstance(data.frame, TTSStoppedFrame):
            self.stopped += 1

def wait_until(condition, timeout_s=60.0):
    deadline = time.monotonic() + timeout_s
    while not condition() and time.monotonic() < deadline:
        yield SleepFrame(sleep=0.05)

def tokens(text):  # an LLM's stream: words with their spaces
    words = text.split(" ")
    return [LLMTextFrame(w + (" " if i < len(words) - 1 else "")) for i, w in enumerate(words)]
"""


def reference_bytes(target: str, text: str, num_tokens: int) -> int:
    """The LINEAR16 bytes of `text` synthesized whole with the scripts' voice and seed, every
    utterance `num_tokens` long."""
    config = make_config(voice=7, seed=3, max_new_tokens=num_tokens, min_new_tokens=num_tokens)
    with TTSClient(target) as client:
        return sum(
            len(e.audio)
            for e in client.synthesize(text, config=config, timeout=60)
            if isinstance(e, AudioChunkEvent)
        )
