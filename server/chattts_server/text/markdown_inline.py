"""Markdown's inline content, for `text/markdown.py`: where a line may be cut while streaming
(its safe points) and what each piece reads as, traced to where it stands."""

from __future__ import annotations

import re

from markdown_it import MarkdownIt

from .script import CJK
from .spans import Span, SpanMap, Traced

MAX_OPEN_CHARS = 160
"""Longest run held back behind an opener that has not closed (then it is a literal)."""

MD = MarkdownIt("commonmark").enable(["table", "strikethrough"])
_CJK_PUNCT = "。！？；，、：…“”‘’「」『』（）《》【】"
_CELL_SEPARATOR = re.compile(r"(?<!\\)\|")


def pieces(text: str, final: bool, before: str) -> list[str]:
    """`text` cut at its safe points (see the module docstring); without `final`, what follows
    the last safe point is held back. `before` is the character before text."""
    cuts = _safe_points(text, before)
    if final and (not cuts or cuts[-1] != len(text)):
        cuts.append(len(text))
    pieces, start = [], 0
    for cut in cuts:
        pieces.append(text[start:cut])
        start = cut
    return pieces


def _safe_points(text: str, before_text: str = " ") -> list[int]:
    """Offsets after which no inline construct is open; a small scanner of CommonMark's openers
    (it may hold back more than needed, never less: the parser then decides what they were)."""
    points: list[int] = []
    stack: list[tuple[str, int]] = []  # (opener, offset)
    i, n = 0, len(text)
    while i < n:
        while stack and i - stack[0][1] > MAX_OPEN_CHARS:
            stack.pop(0)  # never closed: a literal character
        c = text[i]
        if c == "\\":
            i += 2
            continue
        if stack and stack[-1][0].startswith("`"):  # in a code span: only its closer counts
            run = _run(text, i, "`") if c == "`" else 0
            if run == len(stack[-1][0]):
                stack.pop()
            i += max(run, 1)
            continue
        if c in "`*_~":
            run = _marker(text, i, stack, before_text)
            if not run:
                break  # a marker at the end may still grow or open
            i += run
            continue
        at = _link(text, i, stack)
        if at is None:
            break  # "](" may follow
        i = at
        if not stack and (c.isspace() or CJK.match(c) or c in _CJK_PUNCT):
            points.append(i + 1)
        i += 1
    return points


def _marker(text: str, i: int, stack: list[tuple[str, int]], before_text: str) -> int:
    """The run of a code, emphasis or strikethrough marker at `i` opens or closes on `stack`;
    its length, or 0 where it ends the text."""
    c = text[i]
    run = _run(text, i, c)
    if i + run >= len(text):
        return 0
    before = text[i - 1] if i else before_text
    after = text[i + run]
    if c == "`":
        stack.append(("`" * run, i))
    elif c == "_" and before.isalnum() and after.isalnum():
        pass  # snake_case
    elif not before.isspace() and any(o[0] == c for o, _ in stack):
        while stack and stack[-1][0][0] != c:
            stack.pop()
        stack.pop()
    elif not after.isspace():
        stack.append((c, i))
    return run


def _link(text: str, i: int, stack: list[tuple[str, int]]) -> int | None:
    """A link's or an autolink's brackets at `i` open or close on `stack`; where the scan goes
    on (past a link text's `](`), or None where `]` ends the text."""
    c, top = text[i], stack[-1][0] if stack else ""
    if c == "[":
        stack.append(("[", i))
    elif c == "]" and any(o == "[" for o, _ in stack):
        while stack[-1][0] != "[":
            stack.pop()
        stack.pop()
        if i + 1 >= len(text):
            return None
        if text[i + 1] == "(":
            stack.append(("(", i))
            return i + 1
    elif c == ")" and top == "(":
        stack.pop()
    elif c == "<" and i + 1 < len(text) and text[i + 1].isalpha():
        stack.append(("<", i))
    elif c == ">" and top == "<":
        stack.pop()
    return i


def _run(text: str, i: int, c: str) -> int:
    j = i
    while j < len(text) and text[j] == c:
        j += 1
    return j - i


def render(piece: Traced) -> Traced:
    """One piece of a line's inline content, rendered to the words it reads as, each traced to
    where it stands in the piece."""
    if not piece.text.strip():
        return piece
    tokens = MD.parseInline(piece.text)
    src = piece.text
    out: list[Traced] = []
    at = 0  # how far into the piece the rendering has got
    for token in tokens[0].children or []:
        if token.type in ("text", "code_inline", "image"):
            if token.type == "image":
                at = _past(src, "![", at)
            words, at = _find(piece, token.content, at)  # an image reads its alt text
            out.append(words)
            if token.type == "image":
                at = _past_destination(src, at)
        elif token.type in ("softbreak", "hardbreak"):
            out.append(Traced.inserted(" "))
        elif token.type == "link_open" and token.markup not in ("autolink", "linkify"):
            at = _past(src, "[", at)
        elif token.type == "link_close" and token.markup not in ("autolink", "linkify"):
            at = _past_destination(src, at)  # the URL is not read
        elif token.type == "html_inline":
            at = _past(src, token.content, at)
        # anything else is a marker: not read, and the next find skips over it
    return Traced.concat(out)


def _past(src: str, text: str, at: int) -> int:
    found = src.find(text, at)
    return at if found < 0 else found + len(text)


def _find(piece: Traced, words: str, at: int) -> tuple[Traced, int]:
    """`words` as rendered from the piece from `at` on, and where the piece goes on after it.
    Usually they stand there as they are; an entity or an escape is found character by
    character, and a character not there (`&copy;` read as ©) maps to none."""
    found = piece.text.find(words, at)
    if found >= 0:
        return piece[found : found + len(words)], found + len(words)
    ranges: list[Span | None] = []
    for c in words:
        found = piece.text.find(c, at)
        ranges.append(None if found < 0 else piece.spans.ranges[found])
        at = at if found < 0 else found + 1
    return Traced(words, SpanMap(tuple(ranges))), at


def _past_destination(src: str, at: int) -> int:
    """Past a link's or an image's `](destination "title")`, which is not read."""
    start = src.find("](", at)
    if start < 0:
        return at
    depth, quote, i = 1, "", start + 2
    while i < len(src):
        c = src[i]
        if c == "\\":
            i += 1
        elif quote:
            quote = "" if c == quote else quote
        elif c in "\"'" and src[i - 1].isspace():
            quote = c  # a title
        elif c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return at


def render_row(row: Traced) -> Traced:
    row = row.strip()
    start, end = 0, len(row)
    while start < end and row.text[start] == "|":
        start += 1
    while end > start and row.text[end - 1] == "|":
        end -= 1
    inner = row[start:end]
    cells, at = [], 0
    for m in _CELL_SEPARATOR.finditer(inner.text):
        cells.append(inner[at : m.start()])
        at = m.end()
    cells.append(inner[at:])
    rendered = (render(c.strip()).strip() for c in cells)
    return Traced.join(", ", (r for r in rendered if r))
