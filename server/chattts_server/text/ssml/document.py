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
the element it is in.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Protocol
from xml.etree.ElementTree import ParseError, TreeBuilder

from defusedxml import DefusedXmlException
from defusedxml.ElementTree import DefusedXMLParser

from ...engine.types import InvalidRequestError
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


class DocumentHandler(Protocol):
    def start(self, name: str, attrs: dict[str, str], at: Position) -> None: ...

    def end(self, name: str, at: Position) -> None: ...

    def text(self, text: Traced) -> None: ...


def ssml_error(
    field_name: str, at: Position | tuple[int, int], message: str
) -> InvalidRequestError:
    line, column = (at.line, at.column) if isinstance(at, Position) else at
    return InvalidRequestError(field_name, f"SSML line {line}, column {column}: {message}")


class SafeXmlReader:
    """Feeds one document to expat and its events to a `DocumentHandler`."""

    def __init__(self, handler: DocumentHandler, field_name: str, offset: int = 0) -> None:
        self._handler = handler
        self._field = field_name
        self._offset = offset
        """Where the document starts in everything the caller sent (code points)."""
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
    def open_elements(self) -> tuple[str, ...]:
        return tuple(self._open)

    def feed(self, fragment: str) -> None:
        self._append(fragment)
        self._parse(lambda: self._xml.feed(fragment))

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
        return Position(line, at - line_start + 1, self._offset + at)

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

    def _parse(self, step: object) -> None:
        try:
            step()  # type: ignore[operator]
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
            here = self._position(e.ErrorByteIndex, e.ErrorLineNumber)
            at: Position | tuple[int, int] = here
            tag = _tag_at(self._doc, here.offset - self._offset)
        else:
            line, column = exc.position
            at, tag = (line, column + 1), ""
        if tag:
            message += f" at {tag}"
        if self._open:
            message += f", inside <{self._open[-1]}>"
        elif message == "no element found":
            message = "the document is empty or has no root element: an SSML document is <speak>...</speak>"
        return ssml_error(self._field, at, message)


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
