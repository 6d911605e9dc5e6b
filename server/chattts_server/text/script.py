"""The writing system of text, shared by the text front end: normalization picks its grammars,
the duration estimate its speaking rate, and the release policy counts a CJK ideograph as a word."""

from __future__ import annotations

import re
from typing import Literal

Language = Literal["zh", "en"]

CJK_CHARS = "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"
"""CJK ideographs (Extension A, Unified, Compatibility), as a character-class body."""
CJK = re.compile(f"[{CJK_CHARS}]")


def language(text: str) -> Language:
    """'zh' if text holds any CJK ideograph, else 'en'."""
    return "zh" if CJK.search(text) else "en"
