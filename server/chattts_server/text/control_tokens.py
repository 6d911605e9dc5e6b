"""Which inline ChatTTS control tokens a client may send, and the rest.

ChatTTS's tokenizer holds word-level controls that speech may contain (`[uv_break]`,
`[v_break]`, `[lbreak]`, `[laugh]`), the refine-pass levels (`[break_0-7]`, `[oral_0-9]`,
`[laugh_0-2]`) and the speed levels (`[speed_0-9]`). It also holds the structural tokens that
frame a prompt (`[Stts]`, `[spk_emb]`, `[empty_spk]`, `[Ptts]`, `[Sbreak]`, `[Pbreak]`,
`[Ebreak]`) and BERT's own (`[PAD]`, `[UNK]`, `[CLS]`, `[SEP]`, `[MASK]`, `[unusedN]`). A
structural token in user text would rewrite the prompt (a second speaker slot, an early end),
so the API rejects it; `[break_9]` and the like name no token at all and are rejected too.
Any other bracketed text (`[1]`, `[sic]`) is ordinary text: the normalizer drops the brackets.
"""

from __future__ import annotations

import re

WORD_CONTROLS = ("[uv_break]", "[v_break]", "[lbreak]", "[laugh]")
"""Controls that may stand anywhere in the text."""
LEVEL_CONTROLS = {"break": 7, "oral": 9, "laugh": 2, "speed": 9}
"""`[name_N]` controls and their highest level N."""

# fmt: off
STRUCTURAL = frozenset((
    "[Stts]", "[Ptts]", "[spk_emb]", "[empty_spk]", "[Sbreak]", "[Pbreak]", "[Ebreak]", "[PAD]",
    "[UNK]", "[CLS]", "[SEP]", "[MASK]",
))
# fmt: on

# A bracketed run without spaces: candidates for a control token.
BRACKETED = re.compile(r"\[[^\[\]\s]{1,32}\]")
_LEVEL = re.compile(r"\[([a-z]+)_(\d+)\]")
_UNUSED = re.compile(r"\[unused\d+\]")


def is_allowed(token: str) -> bool:
    """True for a documented control token (`[uv_break]`, `[speed_3]`, ...)."""
    if token in WORD_CONTROLS:
        return True
    m = _LEVEL.fullmatch(token)
    if m is None or m.group(1) not in LEVEL_CONTROLS:
        return False
    return int(m.group(2)) <= LEVEL_CONTROLS[m.group(1)]


def is_forbidden(token: str) -> bool:
    """True for a structural token, or a control name with a level the tokenizer lacks."""
    if token in STRUCTURAL or _UNUSED.fullmatch(token):
        return True
    m = _LEVEL.fullmatch(token)
    return m is not None and m.group(1) in LEVEL_CONTROLS and not is_allowed(token)


def first_forbidden(text: str) -> str | None:
    """The first forbidden token in text, or None."""
    for m in BRACKETED.finditer(text):
        if is_forbidden(m.group()):
            return m.group()
    return None


def check(text: str) -> None:
    """Raise ValueError naming the first forbidden token in text."""
    token = first_forbidden(text)
    if token is not None:
        allowed = ", ".join(WORD_CONTROLS) + ", [break_0-7], [oral_0-9], [laugh_0-2], [speed_0-9]"
        raise ValueError(f"contains the ChatTTS structural token {token}; allowed: {allowed}")


def control_pieces(text: str) -> list[tuple[int, int, bool]]:
    """Text cut into (start, end, is_control) pieces. Allowed controls are their own pieces;
    forbidden tokens are dropped (the API has rejected them already; this is the engine's last
    guard); other bracketed text stays in the text pieces."""
    pieces: list[tuple[int, int, bool]] = []
    start = 0
    for m in BRACKETED.finditer(text):
        token = m.group()
        if not (is_allowed(token) or is_forbidden(token)):
            continue
        if m.start() > start:
            pieces.append((start, m.start(), False))
        if is_allowed(token):
            pieces.append((m.start(), m.end(), True))
        start = m.end()
    if start < len(text):
        pieces.append((start, len(text), False))
    return pieces
