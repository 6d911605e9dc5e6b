"""SSML documents into what a stream speaks: utterances at their speed, silences, marks.

    text = SsmlStream(ReleasePolicy(), field_name="text.text")
    text.feed('<speak>Turn left.<break time="5')   # [SpeechItem('Turn left.', 5)]
    text.feed('00ms"/> Then keep right.')          # [Break(0.5), SpeechItem('Then keep right.', 5)]
    text.end()                                     # InvalidRequestError: <speak> is not closed

The document's text is released at sentence ends (punctuation, `<s>`, `<p>`), on flush and
after the policy's `idle_ms`, and cut to the duration budget; a `<break>`, a `<mark>`, a
change of `<prosody rate>` and a new document naming other lexicons each end the text before
them, so a silence or a mark always falls between utterances and an utterance has one speed
and one set of lexicons (`SpeechItem.lexicons`, read by stream/ssml_text.py). The policy's clause and word-count rules do
not apply: where they cut depends on how the document was split. Cuts come only from the document (tags are read
when whole, a `<say-as>` or `<sub>` when closed), so a document sent in any pieces speaks the
same words, silences and marks, in the same order, as the document sent whole.

A stream may send one document after another (a voice agent's turns): text after a `</speak>`
starts the next. A barge-in (`clear`) drops what is buffered and starts a new document: the
text after it is a `<speak>` of its own. Spans, lines and columns count everything the stream
was sent, cleared text included.
"""

from __future__ import annotations

import re
from dataclasses import replace

from ..lexicon import Lexicon
from ..lexicon_library import LexiconLibrary
from ..release import ReleasePolicy, TextReleaser
from ..spans import Traced
from .document import Origin
from .elements import SsmlDocument
from .parts import Item, Part, SpeechItem, SpokenText

_HAS_WORD = re.compile(r"[^\W_]")


class SsmlStream:
    """Fragments of one SSML document in, `Item`s out; no clock, like `StreamText`."""

    def __init__(
        self,
        policy: ReleasePolicy,
        field_name: str = "text",
        ignore_unknown: bool = False,
        lexicons: LexiconLibrary | None = None,
    ) -> None:
        """`lexicons`: the server's, which a document's `<lexicon uri>` may name."""
        # Sentence ends, flush and idle only: the clause and word-count rules cut inside a
        # sentence where its words happen to stand when a fragment arrives, and the normalizer
        # reads each piece on its own ("I-405" | "NB." is not "I four oh five northbound").
        policy = replace(policy, clause_min_words=0, max_words=0, first_words=0)
        self.policy = policy
        self._field = field_name
        self._ignore_unknown = ignore_unknown
        self._library = lexicons
        self._lexicons: tuple[Lexicon, ...] = ()
        """The lexicons the buffered text's document named."""
        self._sent = ""
        """Everything the caller sent: where each document starts (offset, line, column)."""
        self._document = self._new_document(0)
        self._releaser = TextReleaser(policy)

    def _new_document(self, at: int) -> SsmlDocument:
        """A document starting at `at` of the caller's text."""
        line_start = self._sent.rfind("\n", 0, at) + 1
        origin = Origin(at, self._sent.count("\n", 0, at) + 1, at - line_start + 1)
        return SsmlDocument(
            self._field, self.policy.speed, self._ignore_unknown, origin, self._library
        )

    @property
    def speed(self) -> int:
        """The speed of the text buffered now."""
        return self._releaser.policy.speed

    def quiet_deadline_ms(self) -> int | None:
        """After how many quiet milliseconds `on_quiet` would release something; None: never."""
        return self.policy.idle_ms if self._releaser.idle_pending else None

    def on_quiet(self, quiet_ms: float) -> list[Item]:
        if self.policy.idle_ms > 0 and quiet_ms + 2 >= self.policy.idle_ms:
            return self.flush()
        return []

    def feed(self, fragment: str) -> list[Item]:
        """The items a fragment completes. A document that ends (`</speak>`) may be followed
        by the next one, in the same fragment or a later one (a voice agent's next turn)."""
        self._sent += fragment
        out: list[Item] = []
        while True:
            parts, rest = self._document.feed(fragment)
            out += self._items(parts)
            if rest is None:
                return out
            self._document = self._new_document(len(self._sent) - len(rest))
            if not rest:
                return out
            fragment = rest

    def flush(self) -> list[Item]:
        """Release the buffered text (a `<say-as>` or tag not yet whole stays held)."""
        return self._speech(self._releaser.flush_traced())

    def end(self) -> list[Item]:
        """The stream is over: the document must be complete (InvalidRequestError if not)."""
        return self._items(self._document.close()) + self.flush()

    def clear(self) -> None:
        """Barge-in: drop what is buffered; the text after this is a new document."""
        self._releaser.clear()
        self._document = self._new_document(len(self._sent))

    def _items(self, parts: list[Part]) -> list[Item]:
        out: list[Item] = []
        for part in parts:
            if isinstance(part, SpokenText):
                if part.speed != self.speed or part.lexicons != self._lexicons:
                    out += self.flush()  # an utterance has one speed and one document's lexicons
                    self._releaser.policy = replace(self._releaser.policy, speed=part.speed)
                    self._lexicons = part.lexicons
                out += self._speech(self._releaser.feed_traced(part.text))
            else:  # a break or a mark: the text before it is spoken first
                out += self.flush()
                out.append(part)
        return out

    def _speech(self, utterances: list[Traced]) -> list[Item]:
        return [
            SpeechItem(u, self.speed, self._lexicons)
            for u in utterances
            if _HAS_WORD.search(u.text)
        ]


def ssml_items(
    document: str,
    max_s: float,
    speed: int,
    ignore_unknown: bool = False,
    field_name: str = "text",
    lexicons: LexiconLibrary | None = None,
) -> list[Item]:
    """A whole document (Synthesize, POST) as items: utterances cut at sentence ends and, where
    too long for `max_s`, at clause boundaries."""
    policy = ReleasePolicy(
        clause_min_words=0, max_words=0, first_words=0, max_segment_s=max_s, speed=speed
    )
    stream = SsmlStream(policy, field_name, ignore_unknown, lexicons)
    return stream.feed(document) + stream.end()
