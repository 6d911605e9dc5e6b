"""W3C PLS 1.0 lexicons read safely: each lexeme's graphemes and the alias ChatTTS says for them.

    read_pls(document)   # [PlsEntry(grapheme='I-95', alias='Interstate ninety-five', line=3)]

What is read (Pronunciation Lexicon Specification 1.0, https://www.w3.org/TR/pronunciation-lexicon/):

- the root: `<lexicon version="1.0" xmlns="http://www.w3.org/2005/01/pronunciation-lexicon"
  alphabet="...">`. `alphabet` is required, as PLS requires it: "ipa", or a vendor's alphabet
  named "x-organization" or "x-organization-alphabet" (PLS 1.0 section 2: real files use
  x-sampa, x-microsoft-sapi, x-microsoft-ups, x-cmu, ...); any other value is refused, so a
  misspelt file is caught even though its phonemes are never spoken. `xml:lang` may be given
  and is not used: a grapheme matches whatever language the text around it is in.
- `<lexeme>`: one or more `<grapheme>` (alternative spellings, each read as the alias) and one
  or more pronunciations, `<alias>` or `<phoneme>`; `<example>` is skipped. ChatTTS takes no
  phonemes, so the alias is what is said: the first `<alias prefer="true">`, else the first
  `<alias>` (PLS: the first preferred pronunciation, else the first). A lexeme with no alias is
  refused, whatever phonemes it has.
- `<meta>` and `<metadata>` (whatever is inside, in any namespace) are skipped.
- graphemes and aliases are whitespace-normalized (ends stripped, each inner run one space);
  a grapheme of several lexemes keeps the first (the first pronunciation in document order).

Safety: expat through defusedxml, as for SSML (text/ssml/document.py): a document type
declaration is refused at its `<!DOCTYPE`, and with it every entity; external references too.
At most `MAX_PLS_BYTES` (the caller checks a file's size before reading it), `MAX_LEXEMES`
lexemes, `MAX_GRAPHEME_CHARS` per grapheme and `MAX_ALIAS_CHARS` per alias. An alias may not
hold a ChatTTS structural token (text/control_tokens.py). Every refusal is a `PlsError` with
the line and column (both from 1, the column in code points) where the trouble starts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from xml.etree.ElementTree import ParseError, TreeBuilder

from defusedxml import DefusedXmlException
from defusedxml.ElementTree import DefusedXMLParser

from . import control_tokens

PLS_NAMESPACE = "http://www.w3.org/2005/01/pronunciation-lexicon"
MAX_PLS_BYTES = 8 << 20
"""Largest PLS document, in bytes: 50,000 lexemes written one element a line (about 4.5 MB)
fit. A stream's inline lexicons have a far smaller budget (api/lexicons.py)."""
MAX_LEXEMES = 50_000
"""Most lexemes in one document."""
MAX_GRAPHEME_CHARS = 128
MAX_ALIAS_CHARS = 256
"""Longest alias: an utterance's length is budgeted before its aliases are put in."""

_FORBIDDEN = {
    "DTDForbidden": "a document type declaration (<!DOCTYPE>, and so any entity)",
    "EntitiesForbidden": "an entity declaration",
    "ExternalReferenceForbidden": "an external reference",
}


class PlsError(ValueError):
    """A document that is no PLS lexicon ChatTTS can read, and where: `line`, `column`."""

    def __init__(self, line: int, column: int, message: str) -> None:
        super().__init__(f"line {line}, column {column}: {message}")
        self.line = line
        self.column = column
        self.message = message


@dataclass(frozen=True)
class PlsEntry:
    """One grapheme and the alias said for it."""

    grapheme: str
    alias: str
    line: int
    """The line of its `<lexeme>`."""


def read_pls(document: str | bytes, max_lexemes: int = MAX_LEXEMES) -> list[PlsEntry]:
    """The entries of a PLS document, in document order; PlsError if it is not one ChatTTS can
    read (a `str` is read as text, whatever encoding it declares; `bytes` may declare one)."""
    if len(document) > MAX_PLS_BYTES:  # a str's code points never outnumber its bytes
        raise too_large(len(document))
    try:
        data = document.encode("utf-8") if isinstance(document, str) else document
    except UnicodeEncodeError:
        raise PlsError(1, 1, "the lexicon is not valid text (a lone surrogate)") from None
    if len(data) > MAX_PLS_BYTES:
        raise too_large(len(data))
    return _PlsReader(data, max_lexemes, document if isinstance(document, str) else None).read()


def too_large(num_bytes: int) -> PlsError:
    return PlsError(1, 1, f"the lexicon is {num_bytes} bytes; the limit is {MAX_PLS_BYTES}")


def check_alphabet(value: str) -> str | None:
    """Why `value` is no PLS 1.0 alphabet (None: it is one)."""
    name = value.strip().lower()
    vendor = name.startswith("x-") and len(name) > 2
    if name == "ipa" or (vendor and all(c.isalnum() or c in "-_." for c in name)):
        return None
    return (
        f'alphabet="{value[:40]}" is not a PLS 1.0 alphabet: "ipa" or a vendor\'s "x-..." '
        "(x-sampa, x-microsoft-sapi, x-microsoft-ups, x-cmu, ...)"
    )


def _spaced(text: str) -> str:
    return " ".join(text.split())


@dataclass
class _Lexeme:
    line: int
    byte_index: int
    graphemes: list[str] = field(default_factory=list)
    aliases: list[tuple[str, bool]] = field(default_factory=list)
    """(alias, prefer), in document order."""
    has_phoneme: bool = False


class _PlsReader:
    """One document through expat; the entries as it reads them."""

    def __init__(self, data: bytes, max_lexemes: int, text: str | None = None) -> None:
        """`data`: the document's bytes (positions are counted in them); `text`: the same
        document as text, when it came as text (read as such, whatever encoding it declares)."""
        self._data = data
        self._as_text = text
        self._max_lexemes = max_lexemes
        self._entries: list[PlsEntry] = []
        self._seen: set[str] = set()
        self._open: list[str] = []
        self._skip_depth = 0
        """Inside `<metadata>` or `<example>`: elements and text not read."""
        self._lexeme: _Lexeme | None = None
        self._num_lexemes = 0
        self._held: list[str] = []
        """The text of the `<grapheme>` or `<alias>` open now."""
        self._held_at = (0, 0)
        """(line, byte index) of that element."""
        self._prefer = False
        self._started = False
        """The root element has started."""
        self._xml = DefusedXMLParser(target=TreeBuilder(), forbid_dtd=True)
        expat = self._expat = self._xml.parser
        expat.buffer_text = True
        expat.StartElementHandler = self._start
        expat.EndElementHandler = self._end
        expat.CharacterDataHandler = self._text
        expat.CommentHandler = None
        expat.ProcessingInstructionHandler = None

    def read(self) -> list[PlsEntry]:
        try:
            self._xml.feed(self._data if self._as_text is None else self._as_text)
            self._xml.close()
        except ParseError as exc:
            e = self._expat
            message = str(exc).split(": line ")[0]
            if self._open:
                message += f", inside <{self._open[-1]}>"
            elif not self._started and message in ("no element found", "syntax error"):
                what = "no root element" if message == "no element found" else "not XML"
                message = f"{what}: a PLS document is <lexicon>...</lexicon>"
            raise self._error(e.ErrorLineNumber, e.ErrorByteIndex, message) from None
        except DefusedXmlException as exc:
            what = _FORBIDDEN.get(type(exc).__name__, type(exc).__name__)
            raise self._here_error(f"{what} is not allowed in a PLS lexicon") from None
        return self._entries

    # -- positions -------------------------------------------------------------------------

    def _error(self, line: int, byte_index: int, message: str) -> PlsError:
        if byte_index < 0:
            return PlsError(max(line, 1), 1, message)
        line_start = self._data.rfind(b"\n", 0, byte_index) + 1
        column = len(self._data[line_start:byte_index].decode("utf-8", "replace")) + 1
        return PlsError(line, column, message)

    def _here_error(self, message: str) -> PlsError:
        return self._error(self._expat.CurrentLineNumber, self._expat.CurrentByteIndex, message)

    # -- expat's events ----------------------------------------------------------------------

    def _start(self, qualified_name: str, attrs: list[str]) -> None:
        if self._skip_depth:
            self._skip_depth += 1
            return
        self._started = True
        name = _local_name(qualified_name)
        values = dict(zip(attrs[::2], attrs[1::2], strict=True))
        parent = self._open[-1] if self._open else None
        if parent is None:
            self._root(qualified_name, values)
        elif parent == "lexicon" and name in ("meta", "metadata", "lexeme"):
            if name == "metadata":
                self._skip_depth = 1
            elif name == "lexeme":
                self._start_lexeme()
        elif parent == "lexeme" and name in ("grapheme", "alias", "phoneme", "example"):
            self._start_pronunciation(name, values)
        elif parent in ("grapheme", "alias", "phoneme", "meta"):
            raise self._here_error(f"<{parent}> holds text only, not <{name}>")
        else:
            raise self._here_error(f"<{name}> is not a PLS element here, inside <{parent}>")
        self._open.append(name)

    def _root(self, qualified_name: str, values: dict[str, str]) -> None:
        if qualified_name != f"{PLS_NAMESPACE}}}lexicon":
            shown = _local_name(qualified_name)
            if shown == "lexicon":
                why = "the root <lexicon> is not in the PLS namespace"
            else:
                why = f"the root element must be <lexicon>, not <{shown}>"
            raise self._here_error(
                f'{why}: a PLS 1.0 document is <lexicon xmlns="{PLS_NAMESPACE}">'
            )
        version = values.get("version")
        if version != "1.0":
            got = "no version" if version is None else f'version="{version[:20]}"'
            raise self._here_error(f'<lexicon> has {got}; PLS 1.0 is version="1.0"')
        if "alphabet" not in values:
            raise self._here_error('<lexicon> needs an alphabet attribute (PLS 1.0): "ipa"')
        wrong = check_alphabet(values["alphabet"])
        if wrong is not None:
            raise self._here_error(wrong)

    def _start_lexeme(self) -> None:
        self._num_lexemes += 1
        if self._num_lexemes > self._max_lexemes:
            raise self._here_error(f"the lexicon holds over {self._max_lexemes} lexemes")
        e = self._expat
        self._lexeme = _Lexeme(e.CurrentLineNumber, e.CurrentByteIndex)

    def _start_pronunciation(self, name: str, values: dict[str, str]) -> None:
        assert self._lexeme is not None
        if name == "example":
            self._skip_depth = 1
            return
        prefer = values.get("prefer", "false")
        if prefer not in ("true", "false"):
            raise self._here_error(f'<{name}> has prefer="{prefer[:20]}"; it is true or false')
        if name == "phoneme":
            self._lexeme.has_phoneme = True
            why = check_alphabet(values["alphabet"]) if "alphabet" in values else None
            if why is not None:
                raise self._here_error(why)
            return
        self._held = []
        self._held_at = (self._expat.CurrentLineNumber, self._expat.CurrentByteIndex)
        self._prefer = prefer == "true"

    def _end(self, qualified_name: str) -> None:
        if self._skip_depth:
            self._skip_depth -= 1
            if self._skip_depth:
                return
        name = self._open.pop()
        if name == "grapheme":
            self._end_grapheme()
        elif name == "alias":
            self._end_alias()
        elif name == "lexeme":
            self._end_lexeme()

    def _held_text(self, name: str, limit: int) -> str:
        text = _spaced("".join(self._held))
        line, at = self._held_at
        if not text:
            raise self._error(line, at, f"<{name}> is empty")
        if len(text) > limit:
            raise self._error(line, at, f"<{name}> is {len(text)} characters; the limit is {limit}")
        return text

    def _end_grapheme(self) -> None:
        assert self._lexeme is not None
        self._lexeme.graphemes.append(self._held_text("grapheme", MAX_GRAPHEME_CHARS))

    def _end_alias(self) -> None:
        assert self._lexeme is not None
        alias = self._held_text("alias", MAX_ALIAS_CHARS)
        try:
            control_tokens.check(alias)
        except ValueError as exc:
            raise self._error(*self._held_at, f"<alias> {exc}") from None
        self._lexeme.aliases.append((alias, self._prefer))

    def _end_lexeme(self) -> None:
        lexeme, self._lexeme = self._lexeme, None
        assert lexeme is not None
        if not lexeme.graphemes:
            raise self._error(lexeme.line, lexeme.byte_index, "<lexeme> has no <grapheme>")
        if not lexeme.aliases:
            why = ": ChatTTS cannot speak phonemes" if lexeme.has_phoneme else " (what to say)"
            raise self._error(lexeme.line, lexeme.byte_index, f"<lexeme> has no <alias>{why}")
        preferred = [alias for alias, prefer in lexeme.aliases if prefer]
        alias = preferred[0] if preferred else lexeme.aliases[0][0]
        for grapheme in lexeme.graphemes:
            if grapheme not in self._seen:
                self._seen.add(grapheme)
                self._entries.append(PlsEntry(grapheme, alias, lexeme.line))

    def _text(self, data: str) -> None:
        if self._skip_depth or not self._open:
            return
        top = self._open[-1]
        if top in ("grapheme", "alias"):
            self._held.append(data)
        elif top != "phoneme" and data.strip():
            raise self._here_error(f"text directly inside <{top}> is not PLS")


def _local_name(name: str) -> str:
    """expat's 'namespace}name': a PLS element by its own name, another namespace's with it."""
    namespace, brace, local = name.partition("}")
    if not brace:
        return name
    return local if namespace == PLS_NAMESPACE else f"{local} (in namespace {namespace})"
