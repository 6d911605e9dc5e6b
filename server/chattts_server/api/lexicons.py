"""`SynthesisConfig.lexicons` validated: the lexicons a stream reads its text through.

Each value is the name of a server lexicon (`--lexicon FILE`: the file's base name without
.pls) or, starting with "<" after any whitespace, a W3C PLS 1.0 document (text/pls.py). The
stream reads through the server's lexicons first, then its own in the order given: for the same
grapheme the later wins. A bad value is INVALID_ARGUMENT naming it (`config.lexicons[1]`) and,
for bad PLS, the line and column.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..errors import InvalidRequestError
from ..text.lexicon import Lexicon, Lexicons
from ..text.lexicon_library import LexiconLibrary, compile_inline
from ..text.pls import PlsError

MAX_STREAM_LEXICONS = 8
"""Most lexicons one stream names or sends."""
MAX_INLINE_LEXICON_BYTES = 256 << 10
"""The inline lexicons of one stream together, in UTF-8 bytes: each is parsed while the stream
is accepted, so a large one belongs on the server (`--lexicon`, up to text/pls.py's
MAX_PLS_BYTES, parsed once)."""


def stream_lexicons(values: Sequence[str], library: LexiconLibrary, path: str) -> Lexicons | None:
    """The lexicons a stream reads through: the server's, then those `values` name or hold;
    None when there are none. InvalidRequestError names the value (`path[k]`)."""
    if len(values) > MAX_STREAM_LEXICONS:
        raise InvalidRequestError(
            path, f"has {len(values)} lexicons; the limit is {MAX_STREAM_LEXICONS}"
        )
    chosen: list[Lexicon] = []
    inline_bytes = 0
    for k, value in enumerate(values):
        field_name = f"{path}[{k}]"
        if not value.lstrip().startswith("<"):
            chosen.append(_named(value, library, field_name))
            continue
        inline_bytes += len(value) if len(value) > MAX_INLINE_LEXICON_BYTES else len(value.encode())
        if inline_bytes > MAX_INLINE_LEXICON_BYTES:
            raise InvalidRequestError(
                field_name,
                f"the stream's inline lexicons hold over {MAX_INLINE_LEXICON_BYTES} bytes "
                "together; load a large one on the server (--lexicon FILE) and name it",
            )
        try:
            chosen.append(compile_inline(value))
        except PlsError as exc:
            raise InvalidRequestError(field_name, f"PLS {exc}") from None
    if library.default is None and not chosen:
        return None
    return (library.default or Lexicons(())) + chosen


def _named(name: str, library: LexiconLibrary, field_name: str) -> Lexicon:
    lexicon = library.get(name.strip())
    if lexicon is None:
        raise InvalidRequestError(
            field_name, f"names no lexicon {name.strip()[:64]!r} ({library.known()})"
        )
    return lexicon
