"""The check that a stream which went on elsewhere spoke each of the caller's words once: from
its word timings, and for the words of an utterance cut by the loss, from where the client
library says the new stream started (`ResumedEvent.from_source`)."""

from __future__ import annotations

from collections.abc import Sequence

from chattts_client import ResumedEvent, WordTimingsEvent


def assert_each_word_heard_once(text: str, events: Sequence[object]) -> None:
    """Word timings never overlap (no word twice) and cover every word of `text`, except those
    between the last timed word before a new stream and that stream's `from_source` (heard
    before the loss, in an utterance whose timings the lost server never sent)."""
    timed = sorted(
        (w.source_start, w.source_end)
        for e in events
        if isinstance(e, WordTimingsEvent)
        for w in e.words
        if w.has_source
    )
    for (_, a_end), (b_start, _) in zip(timed, timed[1:], strict=False):
        assert a_end <= b_start, f"a word spoken twice: {timed}"
    heard_untimed = []
    for e in events:
        if isinstance(e, ResumedEvent) and e.new_stream:
            before = max((t[1] for t in timed if t[1] <= e.from_source), default=0)
            heard_untimed.append((before, e.from_source))
            assert all(end <= e.from_source or start >= e.from_source for start, end in timed)
    for span in word_spans(text):
        covered = [t for t in timed if t[0] < span[1] and span[0] < t[1]]
        untimed = any(a <= span[0] and span[1] <= b for a, b in heard_untimed)
        word = text[span[0] : span[1]]
        assert len(covered) == 1 or (not covered and untimed), (word, span, timed, heard_untimed)


def word_spans(text: str) -> list[tuple[int, int]]:
    """Each whitespace-separated word of `text`: [start, end) in code points."""
    spans, at = [], 0
    for word in text.split():
        at = text.index(word, at)
        spans.append((at, at + len(word)))
        at += len(word)
    return spans
