"""Word timings as the caller's own words: what a framework's transcript shows while the audio
plays (LiveKit's `TimedString`s, Pipecat's word timestamps).

The server times each spoken word and names the stretch of the caller's text it came from; a
stretch said as several words ("200 m": "two hundred meters") is one caller word here, timed
from its first spoken word's start to its last one's end. Each caller word carries the
punctuation and the space that follow it in the caller's text ("world. "), and an opening
mark right before it ('"', "**"), so the words put end to end read as the text that was sent,
less what no word covers (markup, text a clear dropped).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from chattts_client.messages import WordTiming, WordTimingsEvent

# After a word: its closing punctuation, then the space before the next word.
_TRAILING = re.compile(r"[^\w\s]*\s*")
# Before a word: an opening mark glued to it (a quote, a bracket, emphasis), never a closing
# one, which ends text no word covered (e.g. what a clear dropped).
_LEADING = re.compile(r"[\"'“‘(\[{«「『（¿¡*_~`]+$")


@dataclass(frozen=True)
class CallerWord:
    """One stretch of the caller's text and where its speech lies in the stream's audio."""

    text: str  # the caller's text, with the punctuation and space after it ("200 m. ")
    start_sample: int  # stream samples, at the chunks' rate
    end_sample: int
    start_s: float  # the same in seconds since the stream's first sample
    end_s: float


class CallerWords:
    """Turns a stream's `WordTimingsEvent`s, in order, into `CallerWord`s, each word once.

    `sent()` gives the caller's text sent so far (e.g. `Timeline.text`), which the words'
    source offsets count into. Words without a source (a refine insert) are skipped, and a
    word sent again (an utterance's timings repeated up to a cut) is not given twice.
    """

    def __init__(self, sent: Callable[[], str]) -> None:
        self._sent = sent
        self._timed_until = 0  # stream sample: words ending at or before it were given
        self._text_until = 0  # code point: the caller's text up to here was given

    def take(self, event: WordTimingsEvent) -> list[CallerWord]:
        text = self._sent()
        fresh = (w for w in event.words if w.has_source and w.end_sample > self._timed_until)
        spans = [s for s in _spans(fresh) if s[0] >= self._text_until]
        out: list[CallerWord] = []
        for k, (start, end, first, last) in enumerate(spans):
            limit = spans[k + 1][0] if k + 1 < len(spans) else len(text)
            lead = _LEADING.search(text[self._text_until : start])
            begin = start - (len(lead.group()) if lead else 0)
            trailing = _TRAILING.match(text, end, max(end, limit))
            stop = trailing.end() if trailing else end
            out.append(
                CallerWord(
                    text[begin:stop], first.start_sample, last.end_sample, first.start_s, last.end_s
                )
            )
            self._timed_until, self._text_until = last.end_sample, stop
        return out


def _spans(words: Iterable[WordTiming]) -> list[tuple[int, int, WordTiming, WordTiming]]:
    """Consecutive words of the same source stretch joined: (start, end, first, last)."""
    spans: list[tuple[int, int, WordTiming, WordTiming]] = []
    for word in words:
        span = (word.source_start, word.source_end)
        if spans and spans[-1][:2] == span:
            start, end, first, _ = spans[-1]
            spans[-1] = (start, end, first, word)
        else:
            spans.append((*span, word, word))
    return spans
