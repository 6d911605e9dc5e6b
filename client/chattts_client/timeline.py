"""A stream's timeline on the client: the caller's text as sent, where each utterance and word
lies in the audio, and from that what a listener has heard at a playback position.

After barge-in an agent keeps in its LLM context only what the user heard (LiveKit's aligned
transcripts and Pipecat's word timestamps do the same). The server tells where each word and
utterance is in the stream's audio and which characters of the caller's text it came from
(`WordTimingsEvent`, `UtteranceEndEvent`); only the caller knows how much of that audio its
player has played. `Timeline` joins the two:

    timeline = Timeline()
    events = client.stream(timeline.track(items), config=make_config(word_timing=True))
    for event in events:
        timeline.observe(event)
        ...
    heard = timeline.heard_text(played_s=player.position_s, since=turn_start)

The text heard is the caller's own text ("200 m", with its punctuation), cut after the last
word whose end was played; without word timing (the config did not ask, an old server) it is
cut at the last utterance played whole. Text a `Clear` dropped before it was spoken is left out.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator, Iterable, Iterator
from dataclasses import dataclass, field

from chattts_client.messages import (
    MODEL_SAMPLE_RATE_HZ,
    AudioChunkEvent,
    Clear,
    Event,
    MarkEvent,
    SegmentEndEvent,
    StreamItem,
    UtteranceEndEvent,
    WordTiming,
    WordTimingsEvent,
    item_text,
)


@dataclass
class Utterance:
    """One utterance as far as it is known: its words so far and, once it ended, its end."""

    index: int
    words: dict[int, WordTiming] = field(default_factory=dict)  # by start_sample
    end: UtteranceEndEvent | None = None

    def ordered_words(self) -> list[WordTiming]:
        return [self.words[start] for start in sorted(self.words)]


class Timeline:
    """What one stream said and when. Feed it what you send (`track`, `track_async` or `sent`)
    and every event you receive (`observe`); not thread-safe (one stream, one reader)."""

    def __init__(self, text: str = "") -> None:
        """`text`: the caller's text already sent (Synthesize's `text`, for example)."""
        self._sent = text
        self._clear_offsets: list[int] = []  # where in the sent text each Clear came
        self.utterances: dict[int, Utterance] = {}
        self.marks: list[MarkEvent] = []
        self.segment_ends: list[SegmentEndEvent] = []  # how each segment's revision ended
        self.sample_rate_hz = MODEL_SAMPLE_RATE_HZ  # the chunks' rate, once one arrived
        self.timing_source: str | None = None  # how the last word timings were obtained
        self._echoed: dict[int, str] | None = None  # source(): the text the server echoed

    # -- what was sent -----------------------------------------------------------------------

    @property
    def text(self) -> str:
        """Everything sent on the stream: what the server's source offsets count in."""
        return self._sent

    @property
    def num_sent_chars(self) -> int:
        """Code points sent so far: read it before a turn's text to pass as `since` later."""
        return len(self._sent)

    def sent(self, item: StreamItem) -> None:
        """Record one item as it is sent (a `Clear` cuts off the text before it)."""
        if isinstance(item, Clear):
            self._clear_offsets.append(len(self._sent))
        self._sent += item_text(item)
        self._echoed = None

    def track(self, items: Iterable[StreamItem]) -> Iterator[StreamItem]:
        """`items`, unchanged, each recorded as it is handed to the client."""
        for item in items:
            self.sent(item)
            yield item

    async def track_async(
        self, items: Iterable[StreamItem] | AsyncIterable[StreamItem]
    ) -> AsyncIterator[StreamItem]:
        """`track` for the asyncio client."""
        if isinstance(items, AsyncIterable):
            async for item in items:
                self.sent(item)
                yield item
        else:
            for item in items:
                self.sent(item)
                yield item

    # -- what came back ----------------------------------------------------------------------

    def observe(self, event: Event) -> None:
        """Take one received event into the timeline (audio only tells the rate)."""
        self._echoed = None
        if isinstance(event, AudioChunkEvent):
            if event.sample_rate_hz:
                self.sample_rate_hz = event.sample_rate_hz
        elif isinstance(event, WordTimingsEvent):
            utterance = self._utterance(event.utterance_index)
            for word in event.words:  # a batch sent again (up to a cut) replaces the same words
                utterance.words[word.start_sample] = word
            self.timing_source = event.source
        elif isinstance(event, UtteranceEndEvent):
            self._utterance(event.utterance_index).end = event
        elif isinstance(event, MarkEvent):
            self.marks.append(event)
        elif isinstance(event, SegmentEndEvent):
            self.segment_ends.append(event)

    def _utterance(self, index: int) -> Utterance:
        if index not in self.utterances:
            self.utterances[index] = Utterance(index)
        return self.utterances[index]

    def ordered_utterances(self) -> list[Utterance]:
        return [self.utterances[i] for i in sorted(self.utterances)]

    # -- what was heard ----------------------------------------------------------------------

    def to_samples(self, played_samples: int | None, played_s: float | None) -> int:
        """A playback position, given in stream samples or seconds, in stream samples."""
        if (played_samples is None) == (played_s is None):
            raise ValueError("give the playback position as played_samples or played_s")
        if played_samples is not None:
            return played_samples
        assert played_s is not None
        return round(played_s * self.sample_rate_hz)

    def heard_spans(self, played: int) -> list[tuple[int, int]]:
        """[start, end) of the caller's text heard once `played` stream samples have played: one
        span per stretch between clears, each from the stretch's start to its last heard word."""
        ends = [*self._clear_offsets, None]
        starts = [0, *self._clear_offsets]
        cuts = list(starts)
        for start, end in self._heard_pieces(played):
            for k, (lo, hi) in enumerate(zip(starts, ends, strict=True)):
                if start >= lo and (hi is None or start < hi):
                    cuts[k] = max(cuts[k], end)
                    break
        return [(lo, cut) for lo, cut in zip(starts, cuts, strict=True) if cut > lo]

    def _heard_pieces(self, played: int) -> Iterator[tuple[int, int]]:
        for utterance in self.utterances.values():
            # A stretch of text spoken as several words ("200 m") is heard once its last word is.
            last_end: dict[tuple[int, int], int] = {}
            for word in utterance.words.values():
                if word.has_source:
                    span = (word.source_start, word.source_end)
                    last_end[span] = max(last_end.get(span, 0), word.end_sample)
            yield from (span for span, stop in last_end.items() if stop <= played)
            end = utterance.end
            if (
                end is not None
                and end.finish_reason != "cleared"
                and end.source_end > end.source_start
                and end.num_samples > 0
                and end.sample_offset + end.num_samples <= played
            ):
                yield end.source_start, end.source_end

    def heard_text(
        self, played_samples: int | None = None, *, played_s: float | None = None, since: int = 0
    ) -> str:
        """The caller's text a listener has heard at this playback position (stream samples or
        seconds since the stream's first sample), from code point `since` on (e.g. the
        `num_sent_chars` before a turn, for that turn's text alone)."""
        played = self.to_samples(played_samples, played_s)
        heard = ""
        for start, end in self.heard_spans(played):
            if end <= since:
                continue
            piece = self.source(max(start, since), end)
            # Text after a clear is a new stretch, not the dropped text's continuation.
            gap = heard and piece and not heard[-1].isspace() and not piece[0].isspace()
            heard += (" " if gap else "") + piece
        return heard

    def source(self, start: int, end: int) -> str:
        """The caller's text [start, end) in code points: from what was sent, or where that was
        not recorded, from the text the server echoed (a stretch it did not echo reads as one
        space)."""
        if end <= len(self._sent):
            return self._sent[start:end]
        if self._echoed is None:
            self._echoed = self._echoed_text()
        out: list[str] = []
        for i in range(start, end):
            if i in self._echoed:
                out.append(self._echoed[i])
            elif out and out[-1] != " ":
                out.append(" ")
        return "".join(out)

    def _echoed_text(self) -> dict[int, str]:
        """Each code point of the caller's text known from what was sent or echoed, by offset."""
        known: dict[int, str] = dict(enumerate(self._sent))
        for utterance in self.utterances.values():
            spans = [
                (w.source_start, w.source_end, w.source_text) for w in utterance.words.values()
            ]
            if utterance.end is not None:
                u = utterance.end
                spans.append((u.source_start, u.source_end, u.source_text))
            for offset, stop, piece in spans:
                if len(piece) == stop - offset:  # a text that is its span, character for character
                    known.update(enumerate(piece, offset))
        return known
