"""How long ChatTTS takes to say a text, estimated on the slow side, and cutting long sentences
at clause boundaries so that every piece fits the per-utterance token cap.

The estimate is deliberately conservative: a piece must never reach the cap, because a capped
utterance ends mid-word. ChatTTS speaks about 4-5 Chinese characters or 12-15 English characters
(letters and spaces) a second at `[speed_5]`; we take the slow end, count a digit as the words it
will become, add the pauses that punctuation and break tokens make, and slow down for lower speed
levels. One second of speech is 46.875 audio tokens (24000 Hz / 256 hop / 2 frames per token,
`audio_constants.py`).
"""

from __future__ import annotations

import math
import re

from ..audio_constants import AUDIO_TOKENS_PER_S
from .control_tokens import BRACKETED, is_allowed
from .script import CJK, language

CJK_CHARS_PER_S = 4.0
"""Chinese characters a second: the slow end of ChatTTS's 4-5."""
LATIN_CHARS_PER_S = 12.0
"""English letters and spaces a second: the slow end of ChatTTS's 12-15."""
DIGIT_S = {"zh": 0.3, "en": 0.3}
"""A digit before normalization (a year, a distance) becomes words: 1-2 syllables in Chinese,
about 4 letters in English."""
PAUSE_S = {"[uv_break]": 0.4, "[v_break]": 0.4, "[lbreak]": 0.8, "[laugh]": 1.0}
"""Pauses and sounds that the control tokens add."""
PUNCTUATION_PAUSE_S = 0.25
"""A comma, period or other stop."""
SPEED_SLOWDOWN_PER_LEVEL = 0.1
"""Each `[speed_N]` level below 5 lengthens speech by this share (faster levels are not counted:
the estimate stays on the slow side)."""
CAP_SHARE = 0.75
"""A piece may fill at most this share of the token cap: margin for slow voices and sampling."""
MIN_SEGMENT_S = 2.0
"""Pieces are never cut shorter than this, whatever the cap; a tiny cap truncates instead."""

_LATIN = re.compile(r"[A-Za-z\s']")
_STOPS = re.compile(r"[,.;:!?，。；：！？、…—]")
_DIGIT = re.compile(r"\d")

# Where a long sentence may be cut, best first: after a clause stop, then after a space.
_CLAUSE_CUT = re.compile(r"(?:[,;:，；：、]|\s[-–—]|…)\s*")
_SPACE_CUT = re.compile(r"\s+")


def estimate_duration_s(text: str, speed: int = 5) -> float:
    """Seconds of speech for text (raw or normalized), on the slow side."""
    body = BRACKETED.sub(lambda m: " " if is_allowed(m.group()) else m.group(), text)
    lang = language(body)
    seconds = len(CJK.findall(body)) / CJK_CHARS_PER_S
    seconds += len(_LATIN.findall(body.strip())) / LATIN_CHARS_PER_S
    seconds += len(_DIGIT.findall(body)) * DIGIT_S[lang]
    seconds += len(_STOPS.findall(body)) * PUNCTUATION_PAUSE_S
    seconds += sum(PAUSE_S.get(m.group(), 0.0) for m in BRACKETED.finditer(text))
    return seconds * (1 + SPEED_SLOWDOWN_PER_LEVEL * max(0, 5 - speed))


def max_segment_s(max_new_tokens: int) -> float:
    """Longest estimated speech a piece may hold under a per-utterance cap of max_new_tokens."""
    return max(MIN_SEGMENT_S, max_new_tokens / AUDIO_TOKENS_PER_S * CAP_SHARE)


TEXT_TOKENS_PER_S = 6.0
"""Upper bound on prompt text tokens per estimated second of a piece: a piece holds at most
4 CJK characters a second (one token each, plus stops) or 12 English characters a second (a
wordpiece token per 2 characters or more)."""
PROMPT_FRAME_TOKENS = 8
"""Tokens around the text in an audio-code prompt: [Stts][spk_emb][speed_N] ... [Ptts]."""


def max_prompt_tokens(max_s: float) -> int:
    """KV positions the prompt of the longest piece (max_s of estimated speech) may take,
    without a reference voice: for sizing the per-slot positions next to the token cap."""
    return math.ceil(max_s * TEXT_TOKENS_PER_S) + PROMPT_FRAME_TOKENS


def slot_tokens_needed(max_new_tokens: int, reference_s: float) -> int:
    """KV positions one slot needs for the longest piece under a `max_new_tokens` cap: its
    prompt, its audio tokens, and a zero-shot reference voice of `reference_s` seconds (the
    clip's audio codes plus its transcript). Size `--max-tokens` at least this."""
    reference = math.ceil(reference_s * (AUDIO_TOKENS_PER_S + TEXT_TOKENS_PER_S))
    return max_new_tokens + max_prompt_tokens(max_segment_s(max_new_tokens)) + reference


def _protected(text: str) -> list[tuple[int, int]]:
    """Spans a cut must not fall inside: bracketed tokens, numbers ('1,000', '3.5', '10:30')."""
    spans = [(m.start(), m.end()) for m in BRACKETED.finditer(text)]
    spans += [(m.start(), m.end()) for m in re.finditer(r"\d[\d,.:]*\d", text)]
    return spans


def _cut_points(text: str, pattern: re.Pattern[str]) -> list[int]:
    spans = _protected(text)
    return [
        m.end()
        for m in pattern.finditer(text)
        if 0 < m.end() < len(text) and not any(a < m.start() < b for a, b in spans)
    ]


def duration_pieces(text: str, max_s: float, speed: int = 5) -> list[tuple[int, int]]:
    """Text cut into (start, end) pieces each estimated at most max_s long: at clause stops
    where possible, else between words, else (Chinese without stops) between characters. Text
    that fits is one piece. Pieces are stripped; none is empty."""
    pieces: list[tuple[int, int]] = []
    start, end = _stripped(text, 0, len(text))
    while start < end and estimate_duration_s(text[start:end], speed) > max_s:
        rest = text[start:end]
        cut = _clause_or_word_cut(rest, max_s, speed) or _char_cut(rest, max_s, speed)
        if cut <= 0 or cut >= len(rest):
            break  # one unbreakable run (a very long word): spoken as is
        pieces.append(_stripped(text, start, start + cut))
        start, end = _stripped(text, start + cut, end)
    if start < end:
        pieces.append((start, end))
    return pieces


def _stripped(text: str, start: int, end: int) -> tuple[int, int]:
    """text[start:end].strip() as offsets."""
    while start < end and text[start].isspace():
        start += 1
    while end > start and text[end - 1].isspace():
        end -= 1
    return start, end


def _clause_or_word_cut(text: str, max_s: float, speed: int) -> int:
    """A cut that keeps the head within budget and near an even share of the text (so the last
    piece is not a stub): at a clause stop if one serves, else at a space; 0 if none."""
    total_s = estimate_duration_s(text, speed)
    target_s = total_s / math.ceil(total_s / max_s)
    # A clause stop is worth a shorter piece; a cut between words must keep pieces even.
    for pattern, min_head_s in (
        (_CLAUSE_CUT, min(MIN_SEGMENT_S, target_s / 2)),
        (_SPACE_CUT, target_s / 2),
    ):
        best, best_miss = 0, math.inf
        for point in _cut_points(text, pattern):
            head_s = estimate_duration_s(text[:point], speed)
            if head_s > max_s:
                break  # the estimate only grows with the head
            if head_s >= min_head_s and abs(head_s - target_s) < best_miss:
                best, best_miss = point, abs(head_s - target_s)
        if best:
            return best
    return 0


def _char_cut(text: str, max_s: float, speed: int) -> int:
    """The longest head, cut between characters outside protected spans, that fits."""
    spans = _protected(text)
    best = 0
    for i in range(1, len(text)):
        if any(a < i < b for a, b in spans) or text[i - 1].isascii() and text[i].isascii():
            continue
        if estimate_duration_s(text[:i], speed) > max_s:
            break
        best = i
    return best
