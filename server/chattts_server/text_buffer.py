"""Buffer text as it arrives and cut it into sentences to synthesize.

Clients stream text in arbitrary fragments (tokens of an LLM, words of a caption). A sentence
end, an explicit flush, the end of the stream, or a sentence growing past `max_chars` releases
text for synthesis. Inline ChatTTS control tokens (`[uv_break]`, `[laugh]`) are never split and a
period inside one is not a sentence end.
"""

from __future__ import annotations

import re

# A sentence ends at . ! ? ; followed by whitespace or the end of the buffer, or at a CJK
# terminator. At the end of the buffer "3." may still become "3.5", so a period right after a
# digit waits for the next fragment (or a flush).
_ASCII_END = re.compile(r"[.!?;]+[\"')\]]*(?=\s|$)")
_DECIMAL_PENDING = re.compile(r"\d\.$")
_CJK_END = re.compile(r"[。！？；…]+[”’」』）]*")
_NEWLINE = re.compile(r"\n+")
_CONTROL_TOKEN = re.compile(r"\[[a-z_]+(?:_\d+)?\]")


def _cut_points(text: str) -> list[int]:
    """Offsets just after each sentence end in text, skipping ends inside control tokens."""
    protected = [(m.start(), m.end()) for m in _CONTROL_TOKEN.finditer(text)]
    points = set()
    for pattern in (_ASCII_END, _CJK_END, _NEWLINE):
        for m in pattern.finditer(text):
            if any(a <= m.start() < b for a, b in protected):
                continue
            if m.end() == len(text) and _DECIMAL_PENDING.search(text):
                continue
            points.add(m.end())
    return sorted(points)


def _clean(sentence: str) -> str:
    return " ".join(sentence.split())


class SentenceBuffer:
    """Accumulates text fragments; `feed` and `flush` return the sentences ready to speak."""

    def __init__(self, max_chars: int = 400) -> None:
        self.max_chars = max_chars
        self._pending = ""

    @property
    def pending(self) -> str:
        return self._pending

    def feed(self, fragment: str) -> list[str]:
        self._pending += fragment
        out: list[str] = []
        start = 0
        for point in _cut_points(self._pending):
            sentence = _clean(self._pending[start:point])
            if sentence:
                out.append(sentence)
            start = point
        self._pending = self._pending[start:]
        while len(self._pending) > self.max_chars:
            head, self._pending = self._split_long(self._pending)
            if head:
                out.append(head)
        return out

    def flush(self) -> list[str]:
        """Release everything buffered, sentence end or not."""
        sentence = _clean(self._pending)
        self._pending = ""
        return [sentence] if sentence else []

    def _split_long(self, text: str) -> tuple[str, str]:
        """Cut an over-long run at the last space (or comma) before max_chars."""
        window = text[: self.max_chars]
        cut = max(window.rfind(" "), window.rfind(","), window.rfind("，"))
        if cut <= 0:
            cut = self.max_chars
        else:
            cut += 1
        # Never cut through a control token.
        for m in _CONTROL_TOKEN.finditer(text):
            if m.start() < cut < m.end():
                cut = m.start() if m.start() > 0 else m.end()
        return _clean(text[:cut]), text[cut:]


def split_sentences(text: str, max_chars: int = 400) -> list[str]:
    """Split a complete text into sentences (used by unary Synthesize)."""
    buffer = SentenceBuffer(max_chars)
    return buffer.feed(text) + buffer.flush()
