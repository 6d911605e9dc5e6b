"""Named segments of a stream's text: prompts that can be replaced, and that expire.

A navigation engine says "In 300 m, turn left" and, ten seconds later, "In 100 m, turn left":
the first is wrong by then, and a turn prompt is useless once the junction has passed. So a
text message may name its text (`TextInput.segment`), replace a named segment's text
(`TextInput.replace`, with `if_started` for one already speaking) and give it a time to start
(`expires_in_ms`). Every revision of a segment ends with exactly one `SegmentEnded` event, on
the timeline as a mark is (api/stream_items.py `SegmentDone`).

Both sides of a stream share a `Segment` (one event loop, no locks): the reader (text_reader.py)
creates it, tags the utterances it releases with it and rewrites the queue on replace; the
speaking side (session.py) moves it along

    PENDING --taken for synthesis--> TAKEN --first audio sent--> SPEAKING
        \\________________________________________________________\\__> DONE --its SegmentDone--> ENDED

DONE means nothing more of it will be spoken (its outcome is decided: replaced, cut, expired,
not spoken); a segment that reaches its SegmentDone without one was spoken. "Started" for
`if_started` means audio has been sent: a segment taken for synthesis whose first chunk has
not gone out yet is replaced as if it had not started, and what the engine did for it is
thrown away.
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field

from chattts_proto.chattts.v1 import tts_pb2

from ..errors import InvalidRequestError
from .items import check_mark_name

MAX_EXPIRES_MS = 3_600_000
"""Longest `expires_in_ms` accepted (an hour)."""


class Outcome(enum.Enum):
    """How a segment's revision ended (tts.proto SegmentOutcome)."""

    SPOKEN = tts_pb2.SEGMENT_SPOKEN
    REPLACED = tts_pb2.SEGMENT_REPLACED
    CUT = tts_pb2.SEGMENT_CUT
    EXPIRED = tts_pb2.SEGMENT_EXPIRED
    NOT_SPOKEN = tts_pb2.SEGMENT_NOT_SPOKEN

    @property
    def label(self) -> str:
        """The JSON name ("spoken", "cut", ...)."""
        return self.name.lower()


class IfStarted(enum.Enum):
    """What a replace does to a segment already speaking (tts.proto IfStarted)."""

    FINISH = "finish"
    CUT = "cut"
    DROP_NEW = "drop_new"

    @classmethod
    def from_pb(cls, value: int) -> IfStarted:
        if value == tts_pb2.CUT:
            return cls.CUT
        if value == tts_pb2.DROP_NEW:
            return cls.DROP_NEW
        return cls.FINISH


class State(enum.Enum):
    PENDING = "pending"
    TAKEN = "taken"
    SPEAKING = "speaking"
    DONE = "done"
    ENDED = "ended"


@dataclass(eq=False)
class Segment:
    """One revision of a named segment (identity semantics: the queue finds its items by it)."""

    name: str
    revision: int
    received_at: float
    """time.monotonic() when the message that began it reached the server."""
    expires_at: float | None = None
    """time.monotonic() by which its first audio must be sent; None: it never expires."""
    text: str = ""
    """The caller's text of it, as sent."""
    state: State = State.PENDING
    outcome: Outcome | None = None
    """Decided before its end (REPLACED, CUT, EXPIRED, NOT_SPOKEN); None: SPOKEN at its end."""
    cut_offset: int | None = None
    """Where a CUT stopped it (stream samples), set by the speaking side."""
    dropped_items: bool = field(default=False)
    """Utterances of it were taken off the queue (a CUT, a clear): not all of it was said."""

    @property
    def started(self) -> bool:
        """Audio of it has been sent."""
        return self.state is State.SPEAKING or (
            self.state is State.DONE and self.cut_offset is not None
        )

    @property
    def open(self) -> bool:
        """More of it may still be spoken."""
        return self.state in (State.PENDING, State.TAKEN, State.SPEAKING)

    def expired(self, now: float | None = None) -> bool:
        """It has sent no audio and its time to start has passed."""
        if self.expires_at is None or self.state not in (State.PENDING, State.TAKEN):
            return False
        return (time.monotonic() if now is None else now) >= self.expires_at

    def finish(self, outcome: Outcome) -> None:
        """Nothing more of it will be spoken: it ends with `outcome` when its end is reached."""
        if self.open:
            self.outcome = outcome
            self.state = State.DONE

    def final_outcome(self) -> Outcome:
        return Outcome.SPOKEN if self.outcome is None else self.outcome


def check_segment_name(name: str, field_name: str) -> None:
    """A segment name follows a mark name's rules (1 to 256 characters, no NUL)."""
    if (why := check_mark_name(name)) is not None:
        raise InvalidRequestError(field_name, why)


def check_expires_ms(expires_ms: int, field_name: str) -> None:
    if not 0 <= expires_ms <= MAX_EXPIRES_MS:
        raise InvalidRequestError(field_name, f"must be 0 to {MAX_EXPIRES_MS}, got {expires_ms}")


class SegmentBook:
    """The reader's record of a stream's segments: the latest revision of each name."""

    def __init__(self) -> None:
        self._latest: dict[str, Segment] = {}

    def latest(self, name: str) -> Segment | None:
        return self._latest.get(name)

    def begin(self, name: str, received_at: float, expires_ms: int, field_name: str) -> Segment:
        """A new segment (TextInput.segment): INVALID_ARGUMENT if one of the name is unfinished."""
        old = self._latest.get(name)
        if old is not None and old.state is not State.ENDED:
            raise InvalidRequestError(
                field_name,
                f"segment {name!r} is not finished yet; send `replace` to change its text",
            )
        return self._add(name, old, received_at, expires_ms)

    def revise(self, name: str, received_at: float, expires_ms: int) -> Segment:
        """The next revision of `name` (TextInput.replace); the first if the name is new."""
        return self._add(name, self._latest.get(name), received_at, expires_ms)

    def keep(self, segment: Segment) -> None:
        """`segment` is the name's latest revision again (a DROP_NEW replacement was refused)."""
        self._latest[segment.name] = segment

    def _add(self, name: str, old: Segment | None, received_at: float, expires_ms: int) -> Segment:
        expires_at = received_at + expires_ms / 1000 if expires_ms else None
        revision = 0 if old is None else old.revision + 1
        segment = Segment(name, revision, received_at, expires_at)
        self._latest[name] = segment
        return segment
