"""Reference clips for zero-shot voices: a short voiced-like tone as WAV bytes."""

from __future__ import annotations

import io

import numpy as np
import soundfile as sf


def clip(seconds: float = 1.5, rate: int = 16000) -> bytes:
    t = np.arange(int(seconds * rate)) / rate
    audio = 0.3 * np.sin(2 * np.pi * 180 * t) * (1 + 0.5 * np.sin(2 * np.pi * 3 * t))
    buf = io.BytesIO()
    sf.write(buf, audio.astype(np.float32), rate, format="WAV", subtype="PCM_16")
    return buf.getvalue()
