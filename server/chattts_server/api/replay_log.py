"""A resumable stream's events in order, each on the stream's timeline of samples: what a call
has not written yet, and RETAIN_S of audio behind what it has, so that a listener who lost the
connection can be given exactly what it lacks (`seek`)."""

from __future__ import annotations

import dataclasses
from collections import deque
from dataclasses import dataclass

from ..errors import InvalidRequestError
from ..stream.events import AudioOut, SessionEvent
from .errors import ResumeError

RETAIN_S = 30.0
"""Sent audio kept behind the last written event, for a resume (ResumeStream's OUT_OF_RANGE)."""


@dataclass(frozen=True)
class _Entry:
    event: SessionEvent
    start: int
    """Stream samples before it."""
    samples: int
    """Its own samples: an audio chunk's; 0 for every other event (and an empty chunk)."""


class ReplayLog:
    """Entries are numbered from 0 over the stream's life; `next_write` is the first one the
    attached call has not written."""

    def __init__(self) -> None:
        self._entries: deque[_Entry] = deque()
        self._base = 0
        """The number of the first entry kept."""
        self.next_write = 0
        self._handed = 0
        """One past the last entry handed to a write: the client may have it before the write
        is known to be done."""
        self._rate = 0
        self._samples = 0
        """The samples of every entry appended."""

    @property
    def end(self) -> int:
        """One past the last entry's number."""
        return self._base + len(self._entries)

    def append(self, event: SessionEvent) -> int:
        """Add the stream's next event; its number."""
        if isinstance(event, AudioOut):
            entry = _Entry(event, event.sample_offset, event.num_samples)
            self._rate = event.sample_rate_hz
        else:
            entry = _Entry(event, self._samples, 0)
        self._samples = max(self._samples, entry.start + entry.samples)
        self._entries.append(entry)
        return self.end - 1

    def event(self, number: int) -> SessionEvent:
        return self._entries[number - self._base].event

    def writing(self, number: int) -> None:
        """Entry `number` is handed to the client's transport."""
        self._handed = max(self._handed, number + 1)

    def wrote(self, number: int) -> None:
        """Entry `number` reached the client's transport; sent audio older than RETAIN_S behind
        it is let go."""
        self.next_write = number + 1
        keep_from = self._samples_before(self.next_write) - int(RETAIN_S * self._rate)
        while self._base < self.next_write - 1 and self._entries[0].start < keep_from:
            first = self._entries[0]
            if first.start + first.samples > keep_from:
                break
            self._entries.popleft()
            self._base += 1

    def unsent_s(self) -> float:
        """Seconds of audio appended but not yet written."""
        if not self._rate:
            return 0.0
        return (self._samples - self._samples_before(self.next_write)) / self._rate

    def all_written(self) -> bool:
        return self.next_write >= self.end

    def seek(self, sample_offset: int, events_received: int) -> tuple[int, int]:
        """Where a listener that has `sample_offset` samples and `events_received` later events
        (ResumeStream) resumes: the first entry it lacks, and the samples of it already heard.
        ResumeError OUT_OF_RANGE when that is beyond what was written or no longer kept."""
        written = self._samples_before(max(self.next_write, self._handed))
        if sample_offset > written:
            raise ResumeError(
                "OUT_OF_RANGE",
                f"sample_offset {sample_offset} is beyond the {written} samples sent",
            )
        if self._entries and sample_offset < self._entries[0].start:
            raise ResumeError(
                "OUT_OF_RANGE",
                f"sample_offset {sample_offset} is older than the {RETAIN_S:g} s of sent audio "
                "a stream keeps",
            )
        skip = events_received
        for number, entry in enumerate(self._entries, start=self._base):
            if entry.samples:
                if entry.start + entry.samples <= sample_offset:
                    continue
                return number, max(0, sample_offset - entry.start)
            if entry.start < sample_offset:
                continue
            if skip:
                skip -= 1
                continue
            return number, 0
        return self.end, 0

    def _samples_before(self, number: int) -> int:
        """The stream's samples in the entries before `number` (a kept one, or the end)."""
        if number >= self.end:
            return self._samples
        return self._entries[number - self._base].start


def heard_cut(event: SessionEvent, samples: int) -> SessionEvent:
    """An audio chunk without its first `samples` (a listener that has them resumes inside it):
    byte-exact for the sample encodings; OGG_OPUS pages cannot be cut (INVALID_ARGUMENT)."""
    if not samples or not isinstance(event, AudioOut):
        return event
    if event.encoding == "OGG_OPUS":
        raise InvalidRequestError(
            "resume.sample_offset", "an OGG_OPUS stream resumes only at a chunk boundary"
        )
    width = len(event.data) // event.num_samples
    return dataclasses.replace(
        event,
        data=event.data[samples * width :],
        sample_offset=event.sample_offset + samples,
        num_samples=event.num_samples - samples,
    )
