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

from .markdown_inline import MD, pieces, render, render_row
from .script import CJK
from .spans import EMPTY, Span, SpanMap, Traced

# A line decides its block kind at its first character that cannot be block markup.
_CONTENT_CHAR = re.compile(r"[^\s#>*+\-=_|:~`.)\d]")
_FENCE = re.compile(r"(`{3,}|~{3,})")
_TABLE_RULE = re.compile(r"^[\s|:\-]*$")
_CLOSING_HASHES = re.compile(r"\s+#+\s*$")
_SENTENCE_END = re.compile(r"[.!?;。！？；…:：]$")
_HELD_SENTENCE_END = re.compile(r"[.!?;。！？；…][\"')\]”’」』）*_`]*$")
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
        if self._fence is not None or fence:
            self._decide_fenced(stripped, fence, final)
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
        self._decide_block(stripped)

    def _decide_fenced(self, stripped: str, fence: re.Match[str] | None, final: bool) -> None:
        """A line in a fenced code block, or one that may open it."""
        line = self._line
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
        elif fence and (
            final or _CONTENT_CHAR.search(stripped[fence.end() :]) or len(stripped) > 3
        ):
            line.kind = "skip"
            self._fence = fence.group()

    def _decide_block(self, stripped: str) -> None:
        """The line's kind and where its inline content starts, as markdown-it parses it."""
        line = self._line
        # Indentation is list nesting or continuation in LLM replies, not indented code.
        offset = len(line.raw) - len(stripped)
        tokens = MD.parse(stripped)
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
            text = render_row(body)
            line.done = len(line.raw)
        else:
            before = line.raw[line.done - 1] if line.done else " "
            rendered, at = [], 0
            for piece in pieces(body.text, final, before):
                rendered.append(render(body[at : at + len(piece)]))
                at += len(piece)
            text = Traced.concat(rendered)
            line.done += at
        line.spoken.append(text.text)
        return text


def strip_markdown(text: str) -> str:
    """A whole text's markdown removed (unary Synthesize; the same as streaming it)."""
    return strip_markdown_traced(text).text


def strip_markdown_traced(text: str) -> Traced:
    """`strip_markdown`, traced to `text`."""
    reader = MarkdownReader()
    return reader.feed_traced(Traced.source(text)) + reader.end_traced()
