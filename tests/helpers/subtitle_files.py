"""Caption files read back by the formats' own libraries (webvtt-py for WebVTT, srt for SRT) and
by ffmpeg's demuxers (libavformat, through PyAV)."""

from __future__ import annotations

import html
from pathlib import Path

import av
import srt
import webvtt


def _vtt_seconds(timestamp: str) -> float:
    hours, minutes, seconds = timestamp.split(":")
    return int(hours) * 3600 + int(minutes) * 60 + float(seconds)


def read_cues(path: Path) -> list[tuple[float, float, str]]:
    """(start s, end s, text) of each cue of a .vtt or .srt file, to the millisecond."""
    if path.suffix == ".vtt":
        return [
            (_vtt_seconds(c.start), _vtt_seconds(c.end), html.unescape(c.text))
            for c in webvtt.read(str(path)).captions
        ]
    return [
        (s.start.total_seconds(), s.end.total_seconds(), s.content)
        for s in srt.parse(path.read_text(encoding="utf-8"))
    ]


def demux_cues(path: Path) -> list[tuple[int, int, str]]:
    """(start ms, duration ms, text) of each cue as libavformat's demuxer reads the file."""
    out = []
    with av.open(str(path)) as container:
        assert container.format.name == {".vtt": "webvtt", ".srt": "srt"}[path.suffix]
        stream = container.streams.subtitles[0]
        for packet in container.demux(stream):
            if packet.size:
                out.append((int(packet.pts), int(packet.duration), bytes(packet).decode()))
    return out
