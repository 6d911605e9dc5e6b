"""Named segments of a stream's text: prompts that can be replaced, and that expire.

A navigation engine says "In 300 m, turn left" and, ten seconds later, "In 100 m, turn left":
the first is wrong by then, and a turn prompt is useless once the junction has passed. So a
text message may name its text (`TextInput.segment`), replace a named segment's text
(`TextInput.replace`, with `if_started` for one already speaking) and give it a time to start
(`expires_in_ms`). Every revision of a segment ends with exactly one `SegmentEnded` event, on
the timeline as a mark is (stream/items.py `SegmentDone`).

A revision's life, every move through `Segment.move` and the table `_MOVES`:

    QUEUED --its first utterance goes to the engine--> TAKEN --first audio sent--> SPEAKING
    QUEUED | TAKEN --> REPLACED | EXPIRED | NOT_SPOKEN | SPOKEN (nothing to say)
    SPEAKING --> SPOKEN | CUT

SPOKEN, CUT, REPLACED, EXPIRED and NOT_SPOKEN are its outcome; its `SegmentEnded` is sent when
the stream reaches its `SegmentDone` (`reported`). "Started" for `if_started` means audio has
been sent: a revision taken for synthesis whose first chunk has not gone out yet is replaced as
if it had not started, and what the engine did for it is thrown away.
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass

from chattts_proto.chattts.v1 import tts_pb2

from ..errors import InvalidRequestError

MAX_EXPIRES_MS = 3_600_000
"""Longest `expires_in_ms` accepted (an hour)."""
MAX_NAME_CHARS = 256
"""Longest mark or segment name (tts.proto TextInput.mark, TextInput.segment)."""


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
    QUEUED = "queued"
    TAKEN = "taken"
    SPEAKING = "speaking"
    SPOKEN = "spoken"
    CUT = "cut"
    REPLACED = "replaced"
    EXPIRED = "expired"
    NOT_SPOKEN = "not_spoken"

    @property
    def outcome(self) -> Outcome | None:
        """The outcome this state is; None while more of it may be spoken."""
        return Outcome[self.name] if self.name in Outcome.__members__ else None


_S = State
_MOVES: dict[State, frozenset[State]] = {
    _S.QUEUED: frozenset({_S.TAKEN, _S.SPOKEN, _S.REPLACED, _S.EXPIRED, _S.NOT_SPOKEN}),
    _S.TAKEN: frozenset({_S.SPEAKING, _S.SPOKEN, _S.REPLACED, _S.EXPIRED, _S.NOT_SPOKEN}),
    _S.SPEAKING: frozenset({_S.SPOKEN, _S.CUT}),
}
"""The legal moves of a revision; an outcome state moves nowhere."""


class IllegalMove(RuntimeError):
    """A bug: a segment asked to move where its table does not allow."""


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
    state: State = State.QUEUED
    reported: bool = False
    """Its SegmentEnded has been sent."""

    def move(self, to: State) -> None:
        """The one way its state changes; IllegalMove if the table forbids it."""
        if to is self.state and to in (State.TAKEN, State.SPEAKING):
            return  # its next utterance: still taken, still speaking
        if to not in _MOVES.get(self.state, frozenset()):
            raise IllegalMove(f"segment {self.name!r} r{self.revision}: {self.state} -> {to}")
        self.state = to

    def end(self, outcome: State) -> None:
        """Nothing more of it will be spoken (no-op once it has its outcome)."""
        if self.open:
            self.move(outcome)

    @property
    def open(self) -> bool:
        """More of it may still be spoken."""
        return self.state.outcome is None

    def expired(self, now: float | None = None) -> bool:
        """It has sent no audio and its time to start has passed."""
        if self.expires_at is None or self.state not in (State.QUEUED, State.TAKEN):
            return False
        return (time.monotonic() if now is None else now) >= self.expires_at

    def report(self) -> Outcome:
        """Its SegmentEnded is being sent: it ends SPOKEN unless it has another outcome."""
        self.end(State.SPOKEN)
        self.reported = True
        outcome = self.state.outcome
        assert outcome is not None
        return outcome


def check_name(name: str) -> str | None:
    """Why `name` is no mark or segment name (None: it is one)."""
    if not name:
        return "must not be empty"
    if len(name) > MAX_NAME_CHARS:
        return f"is {len(name)} characters; the limit is {MAX_NAME_CHARS}"
    if "\x00" in name:
        return "must not contain NUL characters"
    return None


def check_segment_name(name: str, field_name: str) -> None:
    """A segment name follows a mark name's rules (1 to 256 characters, no NUL)."""
    if (why := check_name(name)) is not None:
        raise InvalidRequestError(field_name, why)


def check_expires_ms(expires_ms: int, field_name: str) -> None:
    if not 0 <= expires_ms <= MAX_EXPIRES_MS:
        raise InvalidRequestError(field_name, f"must be 0 to {MAX_EXPIRES_MS}, got {expires_ms}")


class SegmentBook:
    """The stream's record of its segments: per name, the revision in force (the one a replace
    acts on) and the next revision number (every replace takes one, a refused one too)."""

    def __init__(self) -> None:
        self._in_force: dict[str, Segment] = {}
        self._next_revision: dict[str, int] = {}

    def in_force(self, name: str) -> Segment | None:
        return self._in_force.get(name)

    def begin(self, name: str, received_at: float, expires_ms: int, field_name: str) -> Segment:
        """A new segment (TextInput.segment): INVALID_ARGUMENT if one of the name is unfinished."""
        old = self._in_force.get(name)
        if old is not None and not old.reported:
            raise InvalidRequestError(
                field_name,
                f"segment {name!r} is not finished yet; send `replace` to change its text",
            )
        return self.revise(name, received_at, expires_ms)

    def revise(self, name: str, received_at: float, expires_ms: int) -> Segment:
        """The next revision of `name`, now in force (TextInput.replace; the first if new)."""
        expires_at = received_at + expires_ms / 1000 if expires_ms else None
        revision = self._next_revision.get(name, 0)
        self._next_revision[name] = revision + 1
        segment = Segment(name, revision, received_at, expires_at)
        self._in_force[name] = segment
        return segment

    def keep(self, segment: Segment) -> None:
        """`segment` stays in force (a DROP_NEW replacement was refused); the refused revision
        keeps its number."""
        self._in_force[segment.name] = segment
