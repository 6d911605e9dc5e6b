"""The Pipecat service's stream as turns: which audio context the stream's events are for.

One stream carries every turn of a conversation. Each turn's text is ended by a mark
(`TextInput.mark`), and the server answers a mark right after the last audio of the text
before it, so the events between two marks are exactly one turn's: its audio, its word
timings, then the mark, on which the turn ends. A turn whose text made no sound ends at once.
An interruption clears the stream with a mark at the cut: the cleared turns' events are dropped
until that mark arrives, so none of their audio reaches the next turn, whose text is sent at
once behind it. No timer decides anything.

Prompts (`ChatTTSSegmentFrame`) are named segments on the stream; a revision of one that has
not ended is sent as a replace and heard in a turn of its own right behind the prompt's (see
`Turns.revise`). Nothing here imports Pipecat: the service (chattts_client.pipecat) turns
what this tells into frames.
"""

from __future__ import annotations

import uuid
from collections import deque
from dataclasses import dataclass

from chattts_client.messages import MarkEvent, SegmentEndEvent
from chattts_client.push_stream import PushStream


@dataclass
class Turn:
    """A stretch of the stream, in the order it was sent: one audio context's text, or (with no
    context) the rest of a cleared stream up to the clear's mark."""

    context_id: str | None
    mark: str | None = None  # the mark that ends it, once sent
    cancelled: bool = False  # interrupted: its events are dropped
    # Its timed words go to Pipecat: until a SegmentEnd in it, after which it speaks a prompt's
    # revision, whose text Pipecat's word tracker does not have (it holds the turn's first).
    words: bool = True


@dataclass
class _Prompt:
    """A named prompt on the stream."""

    name: str  # the segment's name on the stream: the frames', or a new one after a barge-in
    turn: Turn  # the turn of its latest revision (a barge-in cancels it with that revision)
    num_open: int = 0  # revisions sent whose SegmentEnd has not come back


class Turns:
    """What was sent on the conversation's stream, as turns ended by marks; oldest first, each
    kept until its mark comes back. `stream` is None while no stream is open."""

    def __init__(self) -> None:
        self.stream: PushStream | None = None
        self.start_s = 0.0  # stream time where the oldest turn's audio begins
        self._turns: deque[Turn] = deque()
        self._num_marks = 0
        self._prompts: dict[str, _Prompt] = {}  # by the frames' segment name
        self._prompt_names: dict[str, str] = {}  # segment name on the stream -> the frames'

    def reset(self, stream: PushStream | None) -> None:
        """Forget every turn and prompt: `stream` is new, or (None) failed."""
        self.stream = stream
        self.start_s = 0.0
        self._turns.clear()
        self._prompts.clear()
        self._prompt_names.clear()

    # -- text in -------------------------------------------------------------------------------

    def push(self, context_id: str, text: str) -> None:
        """A fragment of `context_id`'s text."""
        self._turn_for(context_id)
        self._open_stream().push(text)

    def send_prompt(
        self, context_id: str, segment: str, text: str, if_started: str, expires_in_ms: int
    ) -> None:
        """A prompt's first text, or a new text of one that has ended (the server queues it at
        the end): the turn's text, ended by its mark."""
        stream = self._open_stream()
        turn = self._turn_for(context_id)
        prompt = self._prompts.get(segment)
        if prompt is not None and (prompt.num_open == 0 or not prompt.turn.cancelled):
            stream.replace(prompt.name, text, if_started, expires_in_ms)
            prompt.turn = turn
        else:
            # New, or cleared by a barge-in whose end of it has not come back: the server may
            # still hold that one unfinished, so the prompt goes on under a name of its own.
            name = segment if prompt is None else f"{segment}#{uuid.uuid4().hex[:8]}"
            stream.segment(name, text, expires_in_ms)
            prompt = self._prompts[segment] = _Prompt(name, turn)
            self._prompt_names[name] = segment
        prompt.num_open += 1
        self._end_text(turn)  # ends the segment's text, and the turn at the mark's answer

    def revisable(self, segment: str) -> bool:
        """Whether the prompt `segment` has not ended (a revision is heard in its turn)."""
        prompt = self._prompts.get(segment)
        return (
            prompt is not None
            and prompt.num_open > 0
            and not prompt.turn.cancelled
            and self.stream is not None
        )

    def revise(self, segment: str, text: str, if_started: str, expires_in_ms: int) -> None:
        """Replace the text of a prompt that has not ended. Its audio comes in the prompt's
        turn, before that turn's mark; if the old text ended on the server before the replace
        arrived, after everything sent before it: in a turn of its own, ended by a mark of its
        own, whose context opens at its first audio."""
        stream = self._open_stream()
        prompt = self._prompts[segment]
        open_turn = self._open_turn()
        if open_turn is not None:
            self._end_text(open_turn)  # the replace ends the text before it, as a mark does
        stream.replace(prompt.name, text, if_started, expires_in_ms)
        prompt.num_open += 1
        turn = prompt.turn = Turn(str(uuid.uuid4()), words=False)
        self._turns.append(turn)
        self._end_text(turn)

    def end_text(self, context_id: str | None = None) -> None:
        """The end of the open turn's text (if it is `context_id`'s): its mark goes out now."""
        turn = self._open_turn()
        if turn is not None and (context_id is None or turn.context_id == context_id):
            self._end_text(turn)

    def clear(self) -> None:
        """Barge-in: the server drops every turn's unspoken text, so every turn sent is over;
        the clear's mark closes the stretch whose events are dropped."""
        stream = self._open_stream()
        self._num_marks += 1
        name = f"clear-{self._num_marks}"
        for turn in self._turns:
            turn.cancelled = True
        open_turn = self._open_turn()
        if open_turn is not None:
            open_turn.mark = name
        else:
            self._turns.append(Turn(None, mark=name, cancelled=True))
        stream.clear(mark=name)

    def live(self) -> list[str]:
        """The contexts of the turns not cancelled, oldest first."""
        return [t.context_id for t in self._turns if not t.cancelled and t.context_id is not None]

    def _open_stream(self) -> PushStream:
        assert self.stream is not None, "no stream is open"
        return self.stream

    def _turn_for(self, context_id: str) -> Turn:
        """The open turn of `context_id`, opened now if need be (a turn still open for another
        context is ended first: its text is complete once another's begins)."""
        turn = self._open_turn()
        if turn is not None and turn.context_id == context_id:
            return turn
        if turn is not None:
            self._end_text(turn)
        turn = Turn(context_id)
        self._turns.append(turn)
        return turn

    def _open_turn(self) -> Turn | None:
        last = self._turns[-1] if self._turns else None
        return last if last is not None and last.mark is None else None

    def _end_text(self, turn: Turn) -> None:
        self._num_marks += 1
        turn.mark = f"turn-{self._num_marks}"
        if self.stream is not None:
            self.stream.mark(turn.mark)

    # -- events out ----------------------------------------------------------------------------

    def speaking(self) -> Turn | None:
        """The turn the stream's events are for now (None: they are dropped)."""
        turn = self._turns[0] if self._turns else None
        return None if turn is None or turn.cancelled else turn

    def on_mark(self, event: MarkEvent) -> tuple[list[str], bool]:
        """The turns up to `event`'s are over: the contexts to end, and whether one of them
        was the mark's (False: it matched no turn)."""
        self.start_s = event.offset_s
        ended: list[str] = []
        while self._turns:
            turn = self._turns.popleft()
            if not turn.cancelled and turn.context_id is not None:
                ended.append(turn.context_id)
            if turn.mark == event.name:
                return ended, True
        return ended, False

    def on_segment_end(self, event: SegmentEndEvent) -> str:
        """The prompt's name in the frames (its name on the stream may differ)."""
        name = self._prompt_names.get(event.name, event.name)
        prompt = self._prompts.get(name)
        if prompt is not None and prompt.name == event.name:
            prompt.num_open -= 1
        if self._turns:
            self._turns[0].words = False  # what follows in this turn is a revision's
        return name
