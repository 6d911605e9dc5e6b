"""Markdown in, the words a person would read out: for LLM replies streamed token by token.

    reader = MarkdownReader()
    reader.feed("**Step")           # ''  (an open marker: held)
    reader.feed(" 1:** Open the")   # 'Step 1: Open '  (the last word may still grow: held)
    reader.feed(" *Wi-Fi* settings\\n")  # 'the Wi-Fi settings\\n'

Chat LLMs answer in markdown by default; read as written, `**Step 1:**` is spoken "asterisk
asterisk step one". The reader removes the markup and keeps the words: emphasis, strong and
strikethrough markers, heading hashes, list bullets and numbers (a numbered item reads its words,
not "one period"), block-quote markers, inline-code ticks (the code is read), links (their text;
the URL is not read), images (their alt text), table pipes and rules, horizontal rules. Fenced
code blocks are not read at all. A heading, a list item and a table row each end a sentence
(a period is added where the line has none); every line ends with a newline, which the release
policy treats as a sentence end.

Parsing is markdown-it-py's (CommonMark, with tables and strikethrough): its block parser says
what kind of line this is, its inline parser renders each piece of a line. Streaming needs one
thing more: a piece may be rendered only when no construct is open in it (`**Step` may still
close), so the reader cuts a line at *safe points*, whitespace or a CJK character with no open
emphasis, code span, link or autolink before it, and renders each piece between two safe points
on its own. Cuts depend only on the text, never on how it was split into fragments, so a reply
streamed in any pieces reads exactly as the same reply sent whole. An opener that stays unclosed
for `MAX_OPEN_CHARS` is taken as a literal character, so a stray `*` holds back no more than that.

Traced (`feed_traced`, `strip_markdown_traced`), each character read maps to the character of the
caller's text it is: markup is in no span, a link reads its text and maps to the link text, a
period added after a list item maps to none. markdown-it gives no offsets inside a line, so each
rendered piece is found again in its source, left to right, skipping link destinations.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from markdown_it import MarkdownIt

from .script import CJK
from .spans import EMPTY, Span, SpanMap, Traced

MAX_OPEN_CHARS = 160
"""Longest run held back behind an opener that has not closed (then it is a literal)."""

_MD = MarkdownIt("commonmark").enable(["table", "strikethrough"])
# A line decides its block kind at its first character that cannot be block markup.
_CONTENT_CHAR = re.compile(r"[^\s#>*+\-=_|:~`.)\d]")
_FENCE = re.compile(r"(`{3,}|~{3,})")
_TABLE_RULE = re.compile(r"^[\s|:\-]*$")
_CLOSING_HASHES = re.compile(r"\s+#+\s*$")
_SENTENCE_END = re.compile(r"[.!?;。！？；…:：]$")
_CJK_PUNCT = "。！？；，、：…“”‘’「」『』（）《》【】"
_HELD_SENTENCE_END = re.compile(r"[.!?;。！？；…][\"')\]”’」』）*_`]*$")
_CELL_SEPARATOR = re.compile(r"(?<!\\)\|")
_NEWLINE = Traced.inserted("\n")


@dataclass
class _Line:
    """The line being received."""

    raw: str = ""
    spans: list[Span | None] = field(default_factory=list)
    """Where each character of `raw` came from."""
    kind: str | None = None
    """None until decided; then 'paragraph', 'heading', 'item', 'quote', 'table', 'skip'."""
    start: int = 0
    """Where the line's inline content begins in `raw`."""
    done: int = 0
    """How much of `raw` has been rendered (an offset at a safe point)."""
    spoken: list[str] = field(default_factory=list)

    def traced(self, start: int) -> Traced:
        return Traced(self.raw[start:], SpanMap(tuple(self.spans[start:])))


class MarkdownReader:
    """Streams markdown fragments in and speakable plain text out; see the module docstring."""

    def __init__(self) -> None:
        self._line = _Line()
        self._fence: str | None = None
        """The opening fence (``` or ~~~ run) while inside a fenced code block."""
        self._num_fed = 0
        """Characters given to `feed` so far: what its spans count."""

    @property
    def pending(self) -> bool:
        """True when text is held back (a flush would release some)."""
        return bool(self._line.raw[self._line.done :].strip())

    @property
    def holds_sentence_end(self) -> bool:
        """True when the held text ends a sentence ("Turn left." with nothing after it yet):
        it is held because "example." may go on as "example.com"; the caller flushes it after
        a short quiet spell."""
        return self._fence is None and bool(
            _HELD_SENTENCE_END.search(self._line.raw[self._line.done :])
        )

    def feed(self, fragment: str) -> str:
        """Add a fragment; return the plain text it completes."""
        offset, self._num_fed = self._num_fed, self._num_fed + len(fragment)
        return self.feed_traced(Traced.source(fragment, offset)).text

    def flush(self) -> str:
        """Render everything held back (an explicit flush, an idle stream, the end)."""
        return self.flush_traced().text

    def end(self) -> str:
        """The text is complete: render what is held and end its last line (a heading, list
        item or table row gets its sentence end)."""
        return self.end_traced().text

    def feed_traced(self, fragment: Traced) -> Traced:
        """`feed`, the text traced to the fragments' own spans (use one of the two)."""
        first = fragment.text[:1]
        if (first.isupper() or CJK.match(first)) and self.holds_sentence_end:
            # "Turn left." then "Then exit": a new sentence, as the releaser reads a
            # sentence end at a fragment's end ("example." then "com" goes on).
            fragment = Traced.inserted(" ") + fragment
        out: list[Traced] = []
        while fragment:
            cut = fragment.text.find("\n")
            head = fragment if cut < 0 else fragment[:cut]
            fragment = EMPTY if cut < 0 else fragment[cut + 1 :]
            self._line.raw += head.text
            self._line.spans += head.spans.ranges
            if cut >= 0:
                out.append(self._end_line())
            else:
                out.append(self._advance(final=False))
        return Traced.concat(out)

    def flush_traced(self) -> Traced:
        return self._advance(final=True)

    def end_traced(self) -> Traced:
        return self._end_line()[:-1]

    def clear(self) -> None:
        """Forget everything (barge-in): the next fragment starts a new reply."""
        self._line = _Line()
        self._fence = None

    # -- lines -------------------------------------------------------------------------

    def _end_line(self) -> Traced:
        line = self._line
        text = self._advance(final=True)
        self._line = _Line()
        if line.kind in (None, "skip"):
            return text + _NEWLINE
        if line.kind in ("heading", "item", "table"):
            spoken = "".join(line.spoken).rstrip()
            if spoken and not _SENTENCE_END.search(spoken):
                end = "。" if CJK.search(spoken[-1]) else "."
                text = text.rstrip() + Traced.inserted(end)
        return text + _NEWLINE

    def _decide(self, final: bool) -> None:
        line = self._line
        stripped = line.raw.lstrip()
        fence = _FENCE.match(stripped)
        if self._fence is not None:
            # Inside a code block: a closing fence is a line of the opening run's character,
            # at least as long, and nothing else.
            if final or fence:
                line.kind = "skip"
                if (
                    fence
                    and stripped.strip().startswith(self._fence)
                    and not stripped.strip(self._fence[0])
                ):
                    self._fence = None
            return
        if fence:
            if final or _CONTENT_CHAR.search(stripped[fence.end() :]) or len(stripped) > 3:
                line.kind = "skip"
                self._fence = fence.group()
            return
        if not final and not _CONTENT_CHAR.search(stripped):
            return  # "1.", "-", "##", "|": the kind is not known yet
        if not re.search(r"\w", stripped):
            if not final:
                return  # "[", "(", "“": a link or a quote whose words are still to come
            line.kind = "skip"  # a rule, a table's delimiter row, a lone marker
            return
        if stripped.startswith("|"):
            line.kind, line.start = "table", len(line.raw) - len(stripped)
            return
        # Indentation is list nesting or continuation in LLM replies, not indented code.
        offset = len(line.raw) - len(stripped)
        tokens = _MD.parse(stripped)
        inline = next((t for t in tokens if t.type == "inline"), None)
        content = inline.content if inline is not None else ""
        types = {t.type for t in tokens}
        if "heading_open" in types:
            line.kind = "heading"
        elif types & {"bullet_list_open", "ordered_list_open"}:
            line.kind = "item"
        elif "blockquote_open" in types:
            line.kind = "quote"
        elif inline is None:
            line.kind = "skip"
            return
        else:
            line.kind = "paragraph"
        body = stripped.rstrip()
        at = len(body) - len(content) if body.endswith(content) else body.find(content)
        line.start = line.done = offset + max(at, 0)

    def _advance(self, final: bool) -> Traced:
        line = self._line
        if line.kind is None and not line.raw.strip():
            # Nothing on the line yet: a flush here (a mark, a flush before any text) must not
            # decide the line, or the text that follows on it would be skipped as a rule.
            return EMPTY
        if line.kind is None:
            self._decide(final)
            if line.kind is None:
                return EMPTY
        if line.kind == "skip":
            line.done = len(line.raw)
            return EMPTY
        if line.kind in ("heading", "table") and not final:
            return EMPTY  # short lines: read whole
        body = line.traced(line.done)
        if line.kind == "heading" and final:
            body = body.sub(_CLOSING_HASHES, "")
        if line.kind == "table":
            text = _render_row(body)
            line.done = len(line.raw)
        else:
            before = line.raw[line.done - 1] if line.done else " "
            rendered, at = [], 0
            for piece in _pieces(body.text, final, before):
                rendered.append(_render(body[at : at + len(piece)]))
                at += len(piece)
            text = Traced.concat(rendered)
            line.done += at
        line.spoken.append(text.text)
        return text


def _pieces(text: str, final: bool, before: str) -> list[str]:
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
        top = stack[-1][0] if stack else ""
        if c == "\\":
            i += 2
            continue
        if top.startswith("`"):
            run = _run(text, i, "`") if c == "`" else 0
            if run == len(top):
                stack.pop()
            i += max(run, 1)
            continue
        if c in "`*_~":
            run = _run(text, i, c)
            if i + run >= n:
                break  # a marker at the end may still grow or open
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
            i += run
            continue
        if c == "[":
            stack.append(("[", i))
        elif c == "]" and any(o == "[" for o, _ in stack):
            while stack[-1][0] != "[":
                stack.pop()
            stack.pop()
            if i + 1 >= n:
                break  # "](" may follow
            if text[i + 1] == "(":
                stack.append(("(", i))
                i += 1
        elif c == ")" and top == "(":
            stack.pop()
        elif c == "<" and i + 1 < n and text[i + 1].isalpha():
            stack.append(("<", i))
        elif c == ">" and top == "<":
            stack.pop()
        if not stack and (c.isspace() or CJK.match(c) or c in _CJK_PUNCT):
            points.append(i + 1)
        i += 1
    return points


def _run(text: str, i: int, c: str) -> int:
    j = i
    while j < len(text) and text[j] == c:
        j += 1
    return j - i


def _render(piece: Traced) -> Traced:
    """One piece of a line's inline content, rendered to the words it reads as, each traced to
    where it stands in the piece."""
    if not piece.text.strip():
        return piece
    tokens = _MD.parseInline(piece.text)
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


def _render_row(row: Traced) -> Traced:
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
    rendered = (_render(c.strip()).strip() for c in cells)
    return Traced.join(", ", (r for r in rendered if r))


def strip_markdown(text: str) -> str:
    """A whole text's markdown removed (unary Synthesize; the same as streaming it)."""
    return strip_markdown_traced(text).text


def strip_markdown_traced(text: str) -> Traced:
    """`strip_markdown`, traced to `text`."""
    reader = MarkdownReader()
    return reader.feed_traced(Traced.source(text)) + reader.end_traced()
