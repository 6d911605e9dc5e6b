"""Navigation prompts in SSML, written from real turn-by-turn phrasing (tests/data/navigation_ssml.json).

Each carries the words it must be spoken as (`says`: normalized, lowercase, in order, checked
on UtteranceEnd.text), its breaks in seconds and its marks, in order. Shared by the SSML unit
tests (test_ssml_stream.py) and the end-to-end checks through the real server (test_ssml_e2e.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

_DATA = Path(__file__).resolve().parent.parent / "data" / "navigation_ssml.json"

TAG_WORDS = (
    "speak",
    "say as",
    "interpret",
    "break",
    "prosody",
    "mark",
    "alias",
    "emphasis",
    "phoneme",
    "xml",
    "lang",
    "amp",
    "lt",
)
"""Words that come only from markup: none may be spoken."""


@dataclass(frozen=True)
class Prompt:
    name: str
    ssml: str
    says: tuple[str, ...]
    breaks: tuple[float, ...]
    marks: tuple[str, ...]


PROMPTS = tuple(
    Prompt(p["name"], p["ssml"], tuple(p["says"]), tuple(p["breaks"]), tuple(p["marks"]))
    for p in json.loads(_DATA.read_text(encoding="utf-8"))
)
