"""What an SSML document says, in order: text to speak, silences and marks.

The parser (`document.py`, `elements.py`) turns a document into these parts; the stream stage
(`stream.py`) turns them into the items a stream speaks (`SpeechItem`, `Break`, `MarkPart`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeAlias

from ..lexicon import Lexicon
from ..script import Language
from ..spans import Traced


@dataclass(frozen=True)
class SpokenText:
    """Text to speak. Sentence ends (`<s>`, `<p>`) are newlines that come from no caller text."""

    text: Traced
    """The words, traced to the caller's document in code points (markup is in no span; a
    `<say-as>` rendering and a `<sub>` alias map to the element's text as a whole)."""
    speed: int
    """The `[speed_N]` level, 0..9: the stream's, or what the enclosing `<prosody rate>` made of it."""
    lang: Language | None = None
    """The `xml:lang` hint of the enclosing `<speak>` or `<lang>` (None: none, or a language
    ChatTTS does not speak); say-as renders in it."""
    lexicons: tuple[Lexicon, ...] = ()
    """The document's own lexicons (`<lexicon uri>`), read after the stream's."""


@dataclass(frozen=True)
class Break:
    """`<break>`: exact silence of this length in the audio, between utterances."""

    duration_s: float


@dataclass(frozen=True)
class MarkPart:
    """`<mark name>`: a Mark event of the stream's timeline at this point."""

    name: str


Part: TypeAlias = SpokenText | Break | MarkPart


@dataclass(frozen=True)
class SpeechItem:
    """One utterance to synthesize, at its own speed."""

    text: Traced
    speed: int
    lexicons: tuple[Lexicon, ...] = ()
    """The lexicons its document named (`<lexicon uri>`), read after the stream's."""


Item: TypeAlias = SpeechItem | Break | MarkPart
"""What a stream speaks, in order: utterances, silences, marks."""
