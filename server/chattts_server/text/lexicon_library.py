"""The server's pronunciation lexicons (`--lexicon FILE`) by name, and lexicons sent inline.

    library = LexiconLibrary.load([Path("lexicons/nav.pls")])  # LexiconFileError: file, line
    library.get("nav")        # a lexicon's name is its file's base name without .pls
    library.default           # all of them, merged: what every stream reads through
    compile_inline(document)  # a stream's own PLS document (PlsError); compiled once per text

A library of server lexicons never changes: SIGHUP loads a new one (server.py's `reload`), and a
stream keeps the one it was accepted with. An inline lexicon is parsed when a stream names it; a
voice agent sends the same lexicon with every turn, so the last few are kept compiled
(`compile_inline`'s cache, by the document's text).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from functools import lru_cache
from pathlib import Path

from .lexicon import Lexicon, Lexicons
from .pls import MAX_PLS_BYTES, PlsError, read_pls

INLINE_CACHE_SIZE = 32
"""Inline lexicons kept compiled (each at most a stream's inline budget)."""


class LexiconFileError(ValueError):
    """A `--lexicon` file that cannot be served; the message names the file and the line."""


def lexicon_name(path: Path) -> str:
    """A server lexicon's name: its file's base name without `.pls` ("nav" for nav.pls)."""
    return path.name.removesuffix(".pls")


def load_lexicon(path: Path) -> Lexicon:
    """A PLS file compiled; LexiconFileError naming the file (and line and column) when it
    cannot be read or is not a lexicon this server can speak. Too large a file is refused from
    its size, before it is read."""
    try:
        size = path.stat().st_size
        if size > MAX_PLS_BYTES:
            raise LexiconFileError(f"{path}: {size} bytes; the limit is {MAX_PLS_BYTES}")
        data = path.read_bytes()
    except OSError as exc:
        raise LexiconFileError(f"cannot read {path}: {exc.strerror}") from None
    try:
        entries = read_pls(data)
    except PlsError as exc:
        raise LexiconFileError(f"{path} {exc}") from None
    return Lexicon.build(lexicon_name(path), ((e.grapheme, e.alias) for e in entries))


class LexiconLibrary:
    """The server's lexicons by name; `default` is all of them, in the order given."""

    def __init__(self, lexicons: Sequence[Lexicon] = ()) -> None:
        self._by_name: dict[str, Lexicon] = {}
        for lexicon in lexicons:
            if lexicon.name in self._by_name:
                raise LexiconFileError(f"two lexicons are named {lexicon.name!r}")
            self._by_name[lexicon.name] = lexicon
        merged = lexicons[0] if len(lexicons) == 1 else Lexicon.merge("server", lexicons)
        self.default: Lexicons | None = Lexicons((merged,)) if lexicons else None
        """Every server lexicon, merged into one (the later file wins for the same grapheme);
        None when there are none."""

    @classmethod
    def load(cls, paths: Iterable[Path]) -> LexiconLibrary:
        """The lexicons of `paths`, in order (LexiconFileError naming the file that fails)."""
        return cls([load_lexicon(path) for path in paths])

    @property
    def names(self) -> list[str]:
        return list(self._by_name)

    def get(self, name: str) -> Lexicon | None:
        return self._by_name.get(name)

    def known(self) -> str:
        """The names a caller may use, for an error message."""
        if not self._by_name:
            return "this server has no lexicons: it loads them with --lexicon FILE"
        return f"known: {', '.join(self._by_name)}"


@lru_cache(maxsize=INLINE_CACHE_SIZE)
def compile_inline(document: str) -> Lexicon:
    """A PLS document a stream sent, compiled (PlsError when it is not one this server can
    speak); the same text again is not parsed again."""
    entries = read_pls(document)
    return Lexicon.build("inline", ((e.grapheme, e.alias) for e in entries))
