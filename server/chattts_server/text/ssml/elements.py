"""The SSML elements read here and what each does with ChatTTS: a document in, `Part`s out.

| element | here |
|---|---|
| `<speak>` | the root (required); `xml:lang` is a language hint |
| `<p>`, `<s>` | a sentence end before and after |
| `<break time strength>` | exact silence of that length (time wins; strength: none 0, x-weak 0.25 s, weak 0.5 s, medium 0.75 s, strong 1 s, x-strong 1.25 s; a bare break is medium; at most 10 s) |
| `<prosody rate>` | the speed level: x-slow 1, slow 3, medium 5, fast 7, x-fast 9; "80%" or "0.8" scale the enclosing rate and "+20%" changes it, 10% a level; `pitch`, `volume` and the rest: accepted, no effect (ChatTTS has no such control) |
| `<say-as interpret-as format>` | characters, spell-out, verbatim, cardinal, number, ordinal, digits, fraction, date (format mdy, dmy, ymd, md, ...), time, telephone, unit: read by the normalizer's rules |
| `<sub alias>` | the alias is spoken instead of the text |
| `<lang xml:lang>` | a language hint: say-as inside it reads in that language (without a hint: Chinese once the document's text has held a CJK character); the utterance's language is still its script's (any CJK character is Chinese) |
| `<emphasis>`, `<phoneme>` | no effect: the text is spoken |
| `<mark name>` | a Mark event at that point of the stream |
| `<lexicon uri xml:id>` | the server lexicon named `uri` (`--lexicon FILE`: the base name) is read for the whole document, after the stream's (a later one wins for the same grapheme); first in `<speak>`, before any text or other element (SSML 1.1); `xml:id` names it for `<lookup>` (unique in the document); `type` is accepted |
| `<lookup ref>` | the document's lexicon whose `xml:id` is `ref` is read first for the text inside (a nested lookup's before its parent's); that text is its own utterance, as for a rate change |
| `<audio>` | refused (INVALID_ARGUMENT): no audio is inserted |
| any other | refused naming it, unless `ssml_ignore_unknown_elements`: then its text is read |

Comments and processing instructions are skipped; XML whitespace (newlines, indentation) is a
space, never a sentence end.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ...errors import InvalidRequestError
from ..lexicon import Lexicon
from ..lexicon_library import LexiconLibrary
from ..script import CJK, Language
from ..spans import EMPTY, SpanMap, Traced
from .attributes import break_seconds, language_hint, rate_level, speed_level
from .document import START, Origin, Position, SafeXmlReader, ssml_error
from .parts import Break, MarkPart, Part, SpokenText
from .say_as import INTERPRETATIONS, say_as

# fmt: off
ELEMENTS = (
    "speak", "p", "s", "break", "prosody", "say-as", "sub", "lang", "emphasis", "phoneme", "mark",
    "lexicon", "lookup", "audio",
)
# fmt: on
"""The table above."""
MAX_MARK_NAME_CHARS = 256
MAX_HELD_CHARS = 512
"""Longest text of one `<say-as>` or `<sub>` (held whole until the element ends)."""

_SENTENCE_END = Traced.inserted("\n")


@dataclass(frozen=True)
class _Frame:
    name: str
    level: float
    """Speed level, unrounded (nested relative rates compound)."""
    lang: Language | None
    lookups: tuple[Lexicon, ...] = ()
    """The lexicons the enclosing `<lookup>`s name, innermost last (it wins)."""


@dataclass
class _Held:
    """A `<say-as>` or `<sub>` whose text is read only once it is whole."""

    frame: _Frame
    at: Position
    attrs: dict[str, str]
    text: Traced = EMPTY


class SsmlDocument:
    """One SSML document, fed in fragments (any split), read into parts as it arrives."""

    def __init__(
        self,
        field_name: str,
        speed: int,
        ignore_unknown: bool = False,
        origin: Origin = START,
        lexicons: LexiconLibrary | None = None,
    ) -> None:
        """`field_name`: what errors name (`text`, `input`); `speed`: the stream's level;
        `origin`: where the document starts in everything the caller sent (spans, errors);
        `lexicons`: the server's, which `<lexicon uri>` may name."""
        self._field = field_name
        self._library = lexicons or LexiconLibrary()
        self._lexicons: tuple[Lexicon, ...] = ()
        """The lexicons the document named: read with all of its text."""
        self._ids: dict[str, Lexicon] = {}
        """The document's lexicons by `xml:id`, for `<lookup ref>`."""
        self._begun = False
        """Text or an element other than `<lexicon>` came in `<speak>`: no `<lexicon>` now."""
        self._speed = speed
        self._ignore_unknown = ignore_unknown
        self._reader = SafeXmlReader(self, field_name, origin)
        self._frames: list[_Frame] = []
        self._held: _Held | None = None
        self._parts: list[Part] = []
        self._chinese = False
        """The document's text so far holds a CJK character: say-as without a hint reads
        Chinese (what comes before a say-as is known when it is read, however it was split)."""
        self.ended = False
        """The root element has closed."""

    def feed(self, fragment: str) -> tuple[list[Part], str | None]:
        """The parts a fragment completes and, once the root element has closed, the text
        after it (None while the document is open)."""
        rest = self._reader.feed(fragment)
        return self._take(), rest

    def close(self) -> list[Part]:
        """The caller's text is over: InvalidRequestError if the document is not complete. A
        document that was sent nothing but whitespace is no document: nothing happens."""
        if not self._reader.blank:
            self._reader.close()
        return self._take()

    def _take(self) -> list[Part]:
        parts, self._parts = self._parts, []
        return parts

    # -- DocumentHandler -----------------------------------------------------------------

    def start(self, name: str, attrs: dict[str, str], at: Position) -> None:
        if not self._frames and name != "speak":
            raise ssml_error(self._field, at, f"the root element must be <speak>, not <{name}>")
        if self._held is not None:
            held = self._held.frame.name
            raise ssml_error(self._field, at, f"<{held}> holds text only, not <{name}>")
        parent = self._frames[-1] if self._frames else _Frame("", float(self._speed), None)
        frame = _Frame(name, parent.level, parent.lang, parent.lookups)
        if "xml:lang" in attrs:
            frame = replace(frame, lang=language_hint(attrs["xml:lang"]))
        try:
            frame = self._open(frame, attrs, at)
        except ValueError as exc:
            raise ssml_error(self._field, at, f"<{name}> {exc}") from None
        self._frames.append(frame)
        self._begun = self._begun or name not in ("speak", "lexicon")

    def end(self, name: str, at: Position) -> None:
        frame = self._frames.pop()
        held = self._held
        if held is not None and held.frame is frame:
            self._held = None
            self._speak(self._read_held(held), frame)
        elif name in ("p", "s"):
            self._speak(_SENTENCE_END, frame)
        if not self._frames:
            self.ended = True

    def text(self, text: Traced) -> None:
        if self._held is not None:
            self._held.text += text
            if len(self._held.text) > MAX_HELD_CHARS:
                raise ssml_error(
                    self._field,
                    self._held.at,
                    f"<{self._held.frame.name}> holds over {MAX_HELD_CHARS} characters",
                )
            return
        if self._frames and self._frames[-1].name != "lexicon":  # <lexicon> says nothing
            self._begun = self._begun or not text.text.isspace()
            self._chinese = self._chinese or bool(CJK.search(text.text))
            self._speak(text.map_chars(lambda c: " " if c.isspace() else c), self._frames[-1])

    # -- the table -----------------------------------------------------------------------

    def _open(self, frame: _Frame, attrs: dict[str, str], at: Position) -> _Frame:
        """What element `frame.name` does as it opens; ValueError says what is wrong with it."""
        name = frame.name
        if name == "speak":
            if self._frames:
                raise ValueError("may only be the root element")
        elif name in ("p", "s"):
            self._speak(_SENTENCE_END, frame)
        elif name == "break":
            seconds = break_seconds(attrs.get("time"), attrs.get("strength"))
            if seconds > 0:
                self._parts.append(Break(seconds))
        elif name == "prosody":
            if "rate" in attrs:
                frame = replace(frame, level=rate_level(attrs["rate"], frame.level))
        elif name == "say-as":
            kind = attrs.get("interpret-as")
            if kind not in INTERPRETATIONS:
                got = "no interpret-as" if kind is None else f'interpret-as="{kind[:32]}"'
                raise ValueError(f"has {got}; supported: {', '.join(INTERPRETATIONS)}")
            self._held = _Held(frame, at, attrs)
        elif name == "sub":
            if not attrs.get("alias", "").strip():
                raise ValueError("needs an alias attribute: the words to say")
            self._held = _Held(frame, at, attrs)
        elif name == "lang":
            if "xml:lang" not in attrs:
                raise ValueError("needs an xml:lang attribute")
        elif name == "mark":
            mark = attrs.get("name", "")
            if not 1 <= len(mark) <= MAX_MARK_NAME_CHARS:
                raise ValueError(f"needs a name of 1 to {MAX_MARK_NAME_CHARS} characters")
            self._parts.append(MarkPart(mark))
        elif name == "lexicon":
            self._name_lexicon(attrs)
        elif name == "lookup":
            frame = replace(frame, lookups=(*frame.lookups, self._looked_up(attrs)))
        elif name == "audio":
            raise ValueError("is not supported: this server inserts no audio (send the words)")
        elif name not in ("emphasis", "phoneme") and not self._ignore_unknown:
            raise ValueError(
                f"is not supported (supported: {', '.join(ELEMENTS[:-1])}); "
                "set ssml_ignore_unknown_elements to read its text"
            )
        return frame

    def _name_lexicon(self, attrs: dict[str, str]) -> None:
        """`<lexicon uri="NAME"/>`: the server lexicon NAME is read for the whole document."""
        if len(self._frames) != 1 or self._begun:
            raise ValueError(
                "must come first in <speak>, before any text or other element (SSML 1.1)"
            )
        name = attrs.get("uri", "").strip()
        if not name:
            raise ValueError("needs a uri attribute: the name of a server lexicon")
        lexicon = self._library.get(name)
        if lexicon is None:
            raise ValueError(f'uri="{name[:64]}" names no lexicon ({self._library.known()})')
        lexicon_id = attrs.get("xml:id")
        if lexicon_id is not None:
            if lexicon_id in self._ids:
                raise ValueError(f'xml:id="{lexicon_id[:64]}" names another <lexicon> already')
            self._ids[lexicon_id] = lexicon
        self._lexicons += (lexicon,)

    def _looked_up(self, attrs: dict[str, str]) -> Lexicon:
        """`<lookup ref="ID">`: the document's lexicon whose xml:id is ID."""
        ref = attrs.get("ref", "").strip()
        if not ref:
            raise ValueError("needs a ref attribute: the xml:id of a <lexicon> of the document")
        lexicon = self._ids.get(ref)
        if lexicon is None:
            known = ", ".join(self._ids) or "none"
            raise ValueError(
                f'ref="{ref[:64]}" names no <lexicon xml:id> of the document (known: {known})'
            )
        return lexicon

    def _read_held(self, held: _Held) -> Traced:
        """A say-as rendered, or a sub's alias, traced to the element's text as a whole."""
        if held.frame.name == "sub":
            words = held.attrs["alias"]
        else:
            chinese = self._chinese or CJK.search(held.text.text)
            lang = held.frame.lang or ("zh" if chinese else "en")
            words = say_as(
                held.attrs["interpret-as"], held.text.text, lang, held.attrs.get("format")
            )
        span = held.text.span()
        if span is None:
            span = (held.at.offset, held.at.offset + 1)
        return Traced(f" {words} ", SpanMap.run(len(words) + 2, span))

    def _speak(self, text: Traced, frame: _Frame) -> None:
        if text:
            speed = speed_level(frame.level)
            lexicons = self._lexicons + frame.lookups
            self._parts.append(SpokenText(text, speed, frame.lang, lexicons))


def parse_ssml(
    document: str, field_name: str = "text", speed: int = 5, ignore_unknown: bool = False
) -> list[Part]:
    """A whole document's parts (InvalidRequestError naming line, column and element); one
    document only: text after its root is refused."""
    doc = SsmlDocument(field_name, speed, ignore_unknown)
    parts, rest = doc.feed(document)
    if rest is None:
        return parts + doc.close()
    if rest.strip():
        raise InvalidRequestError(field_name, "SSML: text after the document's </speak>")
    return parts
