"""A LiveKit Agents TTS stream against chattts-stream, as an AgentSession drives it per reply.

Run `make run` in one shell, then: python examples/livekit_say.py [--target HOST:PORT] [--out F]
(needs `pip install "chattts-stream[livekit]"`). In an agent, pass the same object to
`AgentSession(tts=...)`; tests/e2e/test_livekit_adapter.py runs this script.
"""

from __future__ import annotations

import argparse
import asyncio
import wave

from chattts_client import SynthesisOptions
from chattts_client.livekit import TTS


async def say(target: str, out: str, max_new_tokens: int | None = None) -> float:
    tts = TTS(target, SynthesisOptions(voice="seed:1234", max_new_tokens=max_new_tokens))
    stream = tts.stream()  # one segment: an agent opens one per reply
    for token in ["Hello", " from", " LiveKit", " Agents.", " Tokens", " stream", " in."]:
        stream.push_text(token)  # LLM tokens as they come
    stream.end_input()  # flush, then half-close the call
    with wave.open(out, "wb") as wav:
        wav.setnchannels(1)
        wav.setsampwidth(2)
        wav.setframerate(tts.sample_rate)
        async for audio in stream:
            wav.writeframes(audio.frame.data.tobytes())
        seconds = wav.tell() / tts.sample_rate
    await stream.aclose()
    await tts.aclose()
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="localhost:50051")
    parser.add_argument(
        "--max-new-tokens", type=int, help="cap on audio tokens per sentence (server default)"
    )
    parser.add_argument("--out", default="livekit.wav")
    args = parser.parse_args()
    print(
        f"wrote {args.out}: {asyncio.run(say(args.target, args.out, args.max_new_tokens)):.2f} s of audio"
    )


if __name__ == "__main__":
    main()
