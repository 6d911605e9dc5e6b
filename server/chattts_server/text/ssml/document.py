"""A safe, incremental XML reader for SSML: expat through defusedxml, with positions.

defusedxml's parser refuses a document type declaration (so no entity is ever declared: the
billion-laughs document is refused at its `<!DOCTYPE`, before anything is expanded), entity
declarations and external references; expat itself refuses a reference to an undeclared entity.
On top of that: at most `MAX_DEPTH` nested elements and `MAX_ELEMENTS` elements in a document
(its size is bounded by the caller's text limits).

The reader is fed fragments as they arrive; expat reports an element once its tag is complete
and character data as far as it has seen it, so the events and their text do not depend on
how the document was split (the handler still sees text in different pieces). Each piece of
text comes traced to the caller's document in code points (`Traced`): expat counts UTF-8 bytes,
the reader converts. A character or entity reference (`&amp;`, `&#233;`) maps to the whole
reference. Every error is an InvalidRequestError naming the line and column (both from 1) and
the element it is in, as lines and columns of everything the caller sent (`Origin`: a stream
may send one document after another).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol
from xml.etree.ElementTree import ParseError, TreeBuilder

from defusedxml import DefusedXmlException
from defusedxml.ElementTree import DefusedXMLParser

from ...errors import InvalidRequestError
from ..spans import SpanMap, Traced

MAX_DEPTH = 32
"""Deepest element nesting accepted."""
MAX_ELEMENTS = 4096
"""Most elements in one document."""


@dataclass(frozen=True)
class Position:
    """Where an event starts in the caller's document."""

    line: int
    """From 1."""
    column: int
    """From 1, in code points of the line."""
    offset: int
    """Code points from the start of everything the caller sent."""


@dataclass(frozen=True)
class Origin:
    """Where a document starts in everything the caller sent (a stream may send several)."""

    offset: int = 0
    """Code points before it."""
    line: int = 1
    column: int = 1


START = Origin()
"""A document that is all the caller sent, or its first."""


class DocumentHandler(Protocol):
    def start(self, name: str, attrs: dict[str, str], at: Position) -> None: ...

    def end(self, name: str, at: Position) -> None: ...

    def text(self, text: Traced) -> None: ...


def ssml_error(field_name: str, at: Position, message: str) -> InvalidRequestError:
    return InvalidRequestError(field_name, f"SSML line {at.line}, column {at.column}: {message}")


class SafeXmlReader:
    """Feeds one document to expat and its events to a `DocumentHandler`."""

    def __init__(self, handler: DocumentHandler, field_name: str, origin: Origin = START) -> None:
        self._handler = handler
        self._field = field_name
        self._origin = origin
        self._offset = origin.offset
        self._doc = ""
        self._num_bytes = 0
        self._wide_ends: list[int] = []
        """UTF-8 byte offsets just after each non-ASCII character, and (below) the extra bytes
        of all such characters up to there: a byte offset less the extra is a code point."""
        self._wide_extra: list[int] = []
        self._open: list[str] = []
        self._num_elements = 0
        self._xml = DefusedXMLParser(target=TreeBuilder(), forbid_dtd=True)
        expat = self._expat = self._xml.parser
        expat.buffer_text = False  # each run with its own position
        expat.StartElementHandler = self._start
        expat.EndElementHandler = self._end
        expat.CharacterDataHandler = self._text
        expat.CommentHandler = None
        expat.ProcessingInstructionHandler = None

    @property
    def blank(self) -> bool:
        """Nothing but whitespace was fed (a stream that sent no further document)."""
        return not self._doc.strip()

    def feed(self, fragment: str) -> str | None:
        """Parse a fragment; once the root element closes, the text after it (None before)."""
        self._append(fragment)
        try:
            self._parse(lambda: self._xml.feed(fragment))
        except _RootClosed as closed:
            return self._doc[closed.end :]
        return None

    def close(self) -> None:
        """The document is complete: InvalidRequestError if it is not."""
        self._parse(self._xml.close)

    # -- positions -------------------------------------------------------------------------

    def _append(self, fragment: str) -> None:
        if not fragment.isascii():
            extra = self._wide_extra[-1] if self._wide_extra else 0
            at = self._num_bytes
            for c in fragment:
                size = len(c.encode("utf-8", "surrogatepass"))
                at += size
                if size > 1:
                    extra += size - 1
                    self._wide_ends.append(at)
                    self._wide_extra.append(extra)
            self._num_bytes = at
        else:
            self._num_bytes += len(fragment)
        self._doc += fragment

    def _code_point(self, byte_index: int) -> int:
        k = bisect.bisect_right(self._wide_ends, byte_index)
        return byte_index - (self._wide_extra[k - 1] if k else 0)

    def _here(self) -> Position:
        return self._position(self._expat.CurrentByteIndex, self._expat.CurrentLineNumber)

    def _position(self, byte_index: int, line: int) -> Position:
        at = self._code_point(byte_index)
        line_start = self._doc.rfind("\n", 0, at) + 1
        return self._in_caller_text(line, at - line_start + 1, at)

    def _in_caller_text(self, line: int, column: int, at: int) -> Position:
        """A line and column of this document as lines and columns of the caller's text."""
        if line == 1:
            column += self._origin.column - 1
        return Position(line + self._origin.line - 1, column, self._offset + at)

    # -- expat's events ----------------------------------------------------------------------

    def _start(self, qualified_name: str, attrs: list[str]) -> None:
        at = self._here()
        name = _local_name(qualified_name)
        self._num_elements += 1
        if len(self._open) >= MAX_DEPTH:
            raise ssml_error(
                self._field, at, f"<{name}> is nested deeper than {MAX_DEPTH} elements"
            )
        if self._num_elements > MAX_ELEMENTS:
            raise ssml_error(self._field, at, f"the document holds over {MAX_ELEMENTS} elements")
        self._open.append(name)
        names = (_local_name(a) for a in attrs[::2])
        self._handler.start(name, dict(zip(names, attrs[1::2], strict=True)), at)

    def _end(self, qualified_name: str) -> None:
        at = self._here()
        self._open.pop()
        self._handler.end(_local_name(qualified_name), at)
        if not self._open:
            # The document is whole: what follows is the next one (expat would refuse it).
            raise _RootClosed(self._doc.find(">", at.offset - self._offset) + 1)

    def _text(self, data: str) -> None:
        start = self._code_point(self._expat.CurrentByteIndex)
        source = self._doc[start : start + len(data)]
        if source == data and "&" not in source:
            traced = Traced.source(data, self._offset + start)
        else:  # a reference (&amp;, &#233;) or a line end expat normalized
            end = self._doc.find(";", start) + 1 if self._doc.startswith("&", start) else 0
            span = (self._offset + start, self._offset + max(end, start + 1))
            traced = Traced(data, SpanMap.run(len(data), span))
        self._handler.text(traced)

    def _parse(self, step: Callable[[], object]) -> None:
        try:
            step()
        except ParseError as exc:
            raise self._syntax_error(exc) from None
        except DefusedXmlException as exc:
            what = type(exc).__name__.replace("Forbidden", "").replace("DTD", "a DTD")
            raise ssml_error(
                self._field,
                self._here(),
                f"{_FORBIDDEN.get(type(exc).__name__, what)} is not allowed in SSML here",
            ) from None

    def _syntax_error(self, exc: ParseError) -> InvalidRequestError:
        message = str(exc).split(": line ")[0]
        e = self._expat
        if e.ErrorByteIndex >= 0:
            at = self._position(e.ErrorByteIndex, e.ErrorLineNumber)
            tag = _tag_at(self._doc, at.offset - self._offset)
        else:
            line, column = exc.position
            at, tag = self._in_caller_text(line, column + 1, len(self._doc)), ""
        if tag:
            message += f" at {tag}"
        if self._open:
            message += f", inside <{self._open[-1]}>"
        elif message in ("no element found", "syntax error") and not self._num_elements:
            what = (
                "no root element" if message == "no element found" else "text outside any element"
            )
            message = f"{what}: an SSML document is <speak>...</speak>"
        return ssml_error(self._field, at, message)


class _RootClosed(Exception):  # noqa: N818 (a signal, not an error)
    """Raised from expat's end handler to stop at the end of the root element."""

    def __init__(self, end: int) -> None:
        super().__init__(end)
        self.end = end
        """Code points of the document up to the end of its root's end tag."""


SSML_NAMESPACE = "http://www.w3.org/2001/10/synthesis"
_XML_NAMESPACE = "http://www.w3.org/XML/1998/namespace"


def _local_name(name: str) -> str:
    """expat's 'namespace}name' as SSML spells it: an SSML element or attribute by its own
    name, `xml:lang` as such, another namespace's element with it ('effect (in namespace
    http://...)'), so it is no element of the table."""
    namespace, brace, local = name.partition("}")  # expat's own form: 'namespace}name'
    if not brace:
        return name
    if namespace == SSML_NAMESPACE:
        return local
    if namespace == _XML_NAMESPACE:
        return f"xml:{local}"
    return f"{local} (in namespace {namespace})"


_FORBIDDEN = {
    "DTDForbidden": "a document type declaration (<!DOCTYPE>, and so any entity)",
    "EntitiesForbidden": "an entity declaration",
    "ExternalReferenceForbidden": "an external reference",
}


def _tag_at(doc: str, at: int) -> str:
    """The tag at `at` ('</p>', '<s'; expat may point at its name), or '' when none is."""
    opening = doc.rfind("<", max(0, at - 2), at + 1)
    if opening < 0:
        return ""
    at = opening
    end = at + 1
    while end < len(doc) and end - at < 64 and (doc[end].isalnum() or doc[end] in "/:-_."):
        end += 1
    return doc[at:end] + (">" if doc.startswith(">", end) else "")
