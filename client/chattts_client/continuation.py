"""A lost stream goes on as a new one, from the first word its listener has not wholly heard.

When a resumable stream's server is gone (killed, restarted, or its resume window passed),
`resuming.ResumingEventStream` starts a new stream with the same config. Three pieces here:

    Heard       what the caller has received, on the caller's one timeline: the samples, the
                caller's text heard up to (the chunks' `heard_source_end`, the utterance ends),
                the marks answered and the segment revisions ended.
    plan        the items the new stream is sent: the caller's items from that point of its
                text on, less what is answered already (a mark, a segment's revision).
    Timeline    the new stream's events moved onto the caller's timeline: samples after those
                received, utterance indices after those begun, text offsets and segment
                revisions as the caller sent them.

    heard = Heard(); heard.observe(event)           # each event the caller gets
    plan = continuation_plan(items_sent, heard)     # the stream is lost
    plan.items, plan.timeline.event(new_event)
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from chattts_client.messages import (
    MODEL_SAMPLE_RATE_HZ,
    AudioChunkEvent,
    Clear,
    Event,
    Flush,
    Mark,
    MarkEvent,
    Replace,
    Segment,
    SegmentEndEvent,
    StreamItem,
    UtteranceEndEvent,
    WordTimingsEvent,
    item_text,
)


@dataclass
class Heard:
    """What the caller has received, on its timeline (events after `Timeline.event`)."""

    samples: int = 0
    """Samples of audio received."""
    source_end: int = 0
    """Every word of the caller's text before this code point is wholly received."""
    next_utterance: int = 0
    """The index the first utterance of a new stream takes: the one being received (when it
    was cut) or the one after the last ended."""
    sample_rate_hz: int = MODEL_SAMPLE_RATE_HZ
    marks: Counter[str] = field(default_factory=Counter)
    """Marks answered, by name."""
    segment_ends: set[tuple[str, int]] = field(default_factory=set)
    """(name, revision) of each segment revision ended."""

    def observe(self, event: Event) -> None:
        if isinstance(event, AudioChunkEvent):
            self.samples = max(self.samples, event.sample_offset + event.num_samples)
            self.source_end = max(self.source_end, event.heard_source_end)
            self.next_utterance = max(self.next_utterance, event.utterance_index)
            self.sample_rate_hz = event.sample_rate_hz or self.sample_rate_hz
        elif isinstance(event, UtteranceEndEvent):
            self.source_end = max(self.source_end, event.source_end)
            self.next_utterance = max(self.next_utterance, event.utterance_index + 1)
        elif isinstance(event, WordTimingsEvent):
            for w in event.words:
                if w.has_source and w.end_sample <= self.samples:
                    self.source_end = max(self.source_end, w.source_end)
        elif isinstance(event, MarkEvent):
            self.marks[event.name] += 1
        elif isinstance(event, SegmentEndEvent):
            self.segment_ends.add((event.name, event.revision))


@dataclass(frozen=True)
class Piece:
    """Text the new stream was sent: `length` code points from `new_start` of its text, which
    are the caller's from `caller_start`."""

    new_start: int
    caller_start: int
    length: int


@dataclass(frozen=True)
class Timeline:
    """A stream's events on the caller's timeline: the first stream's as they are (`IDENTITY`),
    a new stream's after what the caller received of the one before."""

    sample_base: int = 0
    utterance_base: int = 0
    sample_rate_hz: int = MODEL_SAMPLE_RATE_HZ
    source_base: int = 0
    """The caller's code point the new stream's text starts at (where it has no piece)."""
    pieces: tuple[Piece, ...] | None = None
    """None: text offsets are the caller's as they are."""
    revisions: dict[str, tuple[int, ...]] = field(default_factory=dict)
    """Per segment name, the caller's revision of each revision the new stream was sent."""

    def event(self, event: Event) -> Event:
        if self.pieces is None:
            return event
        at, base_s = self.sample_base, self.sample_base / self.sample_rate_hz
        replace = dataclasses.replace
        if isinstance(event, AudioChunkEvent):
            return replace(
                event,
                sample_offset=event.sample_offset + at,
                utterance_index=event.utterance_index + self.utterance_base,
                heard_source_end=self.source(event.heard_source_end, end=True),
            )
        if isinstance(event, UtteranceEndEvent):
            return replace(
                event,
                utterance_index=event.utterance_index + self.utterance_base,
                sample_offset=event.sample_offset + at,
                source_start=self.source(event.source_start),
                source_end=self.source(event.source_end, end=True),
            )
        if isinstance(event, WordTimingsEvent):
            words = tuple(
                replace(
                    w,
                    start_sample=w.start_sample + at,
                    end_sample=w.end_sample + at,
                    start_s=w.start_s + base_s,
                    end_s=w.end_s + base_s,
                    source_start=self.source(w.source_start) if w.has_source else 0,
                    source_end=self.source(w.source_end, end=True) if w.has_source else 0,
                )
                for w in event.words
            )
            index = event.utterance_index + self.utterance_base
            return replace(event, utterance_index=index, words=words)
        if isinstance(event, MarkEvent):
            return replace(
                event, sample_offset=event.sample_offset + at, offset_s=event.offset_s + base_s
            )
        if isinstance(event, SegmentEndEvent):
            return replace(
                event,
                revision=self._revision(event.name, event.revision),
                sample_offset=event.sample_offset + at,
                offset_s=event.offset_s + base_s,
            )
        return event

    def source(self, at: int, end: bool = False) -> int:
        """The caller's code point for the new stream's `at` (a range's `end`: the piece it
        closes, where two meet)."""
        if self.pieces is None:
            return at
        caller = self.source_base
        for p in self.pieces:
            if p.new_start <= at < p.new_start + p.length or (end and at == p.new_start + p.length):
                return p.caller_start + at - p.new_start
            if p.new_start + p.length <= at:
                caller = p.caller_start + p.length + at - (p.new_start + p.length)
        return caller

    def _revision(self, name: str, revision: int) -> int:
        sent = self.revisions.get(name, ())
        if revision < len(sent):
            return sent[revision]
        return (sent[-1] + 1 if sent else 0) + revision - len(sent)


IDENTITY = Timeline()
"""The first stream's timeline: the caller's."""


@dataclass(frozen=True)
class Plan:
    """How a lost stream goes on: the new stream's items and its events' timeline."""

    items: tuple[StreamItem, ...]
    timeline: Timeline
    from_source: int
    """The caller's code point the new stream starts from."""
    from_word: int
    """Whitespace-separated words of the caller's text before `from_source`."""


def continuation_plan(sent: Sequence[StreamItem], heard: Heard) -> Plan:
    """The items a new stream is sent to go on from `heard.source_end` of the text `sent`.

    Each item keeps its kind with its text cut to what is not heard; left out are text heard,
    a mark answered, a segment revision ended (whatever its text) and a clear already passed.
    Before a clear still to come, text goes (the clear would drop it) but marks and segments
    stay, to be answered as dropped and not spoken."""
    at_heard = heard.source_end
    spans, at = [], 0
    for item in sent:
        spans.append((at, at + len(item_text(item))))
        at += len(item_text(item))
    last_clear = max(
        (k for k, item in enumerate(sent) if isinstance(item, Clear) and spans[k][0] >= at_heard),
        default=-1,
    )
    marks: Counter[str] = Counter()
    revisions: Counter[str] = Counter()
    sent_revisions: dict[str, list[int]] = {}
    items: list[StreamItem] = []
    pieces: list[Piece] = []
    new_at = 0
    for k, item in enumerate(sent):
        a, b = spans[k]
        text = item_text(item)[max(at_heard - a, 0) :] if b > at_heard else ""
        if k < last_clear:
            text = ""
        if isinstance(item, Mark):
            marks[item.name] += 1
            if marks[item.name] <= heard.marks[item.name]:
                continue
            kept: StreamItem | None = Mark(item.name, text)
        elif isinstance(item, Segment | Replace):
            revision = revisions[item.name]
            revisions[item.name] += 1
            if (item.name, revision) in heard.segment_ends:
                continue
            sent_revisions.setdefault(item.name, []).append(revision)
            kept = dataclasses.replace(item, text=text)
        elif isinstance(item, Clear):
            kept = Clear(text) if k == last_clear else (text or None)
        elif isinstance(item, Flush):
            kept = Flush(text) if b > at_heard or a >= at_heard else None
        else:
            kept = text or None
        if kept is None:
            continue
        if text:
            pieces.append(Piece(new_at, b - len(text), len(text)))
            new_at += len(text)
        items.append(kept)
    whole = "".join(item_text(item) for item in sent)
    timeline = Timeline(
        sample_base=heard.samples,
        utterance_base=heard.next_utterance,
        sample_rate_hz=heard.sample_rate_hz,
        source_base=at_heard,
        pieces=tuple(pieces),
        revisions={name: tuple(r) for name, r in sent_revisions.items()},
    )
    return Plan(tuple(items), timeline, at_heard, len(whole[:at_heard].split()))
