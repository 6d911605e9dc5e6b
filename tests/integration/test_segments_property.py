"""Replaceable and expiring segments, as a property: random scripts of segments, plain text,
replaces (every `if_started`), expiries, flushes, marks and clears through the real text
reader, session and tiny engine (in-process: the server's own `Synthesis.stream`), every event
checked against what was sent.

- every segment revision (a `segment` message, and each `replace`) ends with exactly one
  SegmentEnded, and no other SegmentEnded is sent;
- its offset is exact, as a mark's: the samples of every chunk sent before it;
- a revision that ended REPLACED, EXPIRED or NOT_SPOKEN sent no audio at all;
- no replaced text is spoken after its replacement was accepted: nothing of a REPLACED
  revision, at most one chunk of a CUT one (the chunk cut at a word boundary), FINISH aside;
- a SPOKEN revision's utterances all ended before its SegmentEnded.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from dataclasses import dataclass, field, replace

import hypothesis
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from chattts_proto.chattts.v1 import tts_pb2
from chattts_server.stream.events import AudioOut, SegmentEnded, SessionEvent, UtteranceEnded
from chattts_server.stream.reader import TextFragment
from chattts_server.stream.segments import IfStarted, Outcome

WORDS = ["go", "left", "now", "then", "stop", "here", "turn", "east"]
NAMES = ["a", "b", "c"]
STEP_WAIT_S = 0.1


@dataclass(frozen=True)
class Wait:
    """Let the speaking side send one more event before the next message."""


@st.composite
def step(draw: st.DrawFn) -> TextFragment | Wait:
    kind = draw(st.sampled_from(["segment", "replace", "text", "text", "flush", "wait", "clear"]))
    if kind == "wait":
        return Wait()
    words = draw(st.lists(st.sampled_from(WORDS), min_size=1, max_size=4))
    text = " ".join(words) + draw(st.sampled_from(["", ". ", ", ", " "]))
    expires = draw(st.sampled_from([0, 0, 0, 1, 30, 200]))
    if kind == "segment":
        name = draw(st.sampled_from(NAMES))
        return TextFragment(text, segment=name, flush=draw(st.booleans()), expires_in_ms=expires)
    if kind == "replace":
        return TextFragment(
            text,
            replace=draw(st.sampled_from(NAMES)),
            if_started=draw(st.sampled_from(list(IfStarted))),
            expires_in_ms=expires,
        )
    if kind == "flush":
        return TextFragment("", flush=True, mark=draw(st.sampled_from(["", "m"])))
    if kind == "clear":
        return TextFragment(text if draw(st.booleans()) else "", clear=True)
    return TextFragment(text)


@st.composite
def replaced_while_speaking(draw: st.DrawFn) -> list[TextFragment | Wait]:
    """A prompt, a wait for its audio, and its replacement: the case a random script rarely
    hits, a replace of a segment that is speaking."""
    name = draw(st.sampled_from(NAMES))
    how = draw(st.sampled_from(list(IfStarted)))
    return [
        TextFragment("in three hundred meters turn left.", segment=name, flush=True),
        Wait(),
        Wait(),
        TextFragment("in one hundred meters turn left.", replace=name, if_started=how),
    ]


def _speaking_then_replaced(how: IfStarted) -> list[TextFragment | Wait]:
    """A prompt replaced once its audio has surely begun (always run, whatever is drawn)."""
    return [
        TextFragment("go left now then stop here turn east.", segment="a", flush=True),
        Wait(),
        Wait(),
        Wait(),
        TextFragment("turn east.", replace="a", if_started=how),
    ]


SCRIPTS = st.lists(
    st.one_of(step().map(lambda s: [s]), replaced_while_speaking()), min_size=1, max_size=6
).map(lambda parts: [s for part in parts for s in part])


@dataclass
class Revision:
    name: str
    number: int
    start: int
    """Its text's first code point in the caller's text."""
    end: int = -1
    """Its text's end, once closed (-1: open)."""
    if_started: IfStarted | None = None
    """How it was made: None for a `segment` message."""
    replaced_at: int | None = None
    """Events sent before a later replace of its name was surely applied."""
    replaced_how: IfStarted | None = None
    chunks: list[AudioOut] = field(default_factory=list)


def _valid(script: list[TextFragment | Wait]) -> list[TextFragment | Wait]:
    """The script as the server accepts it: each `segment` message gets a fresh name (naming
    an unfinished segment again is INVALID_ARGUMENT, tested elsewhere), and a replace names
    one of the segments so far (picked by its drawn name), or a new name."""
    out: list[TextFragment | Wait] = []
    names: list[str] = []
    for s in script:
        if isinstance(s, TextFragment) and s.segment:
            names.append(f"s{len(names)}")
            s = replace(s, segment=names[-1])
        elif isinstance(s, TextFragment) and s.replace:
            pick = NAMES.index(s.replace)
            s = replace(s, replace=names[-1 - pick] if pick < len(names) else f"new{pick}")
        out.append(s)
    return out


async def _run(synthesis, settings_, script) -> tuple[list[SessionEvent], list[int]]:
    """The events, and for each step the number of events sent before the reader had surely
    applied it (the reader asks for the next message only after applying the last)."""
    events: list[SessionEvent] = []
    applied: list[int] = []
    sent = asyncio.Event()

    async def send(event: SessionEvent) -> None:
        events.append(event)
        sent.set()

    async def fragments():
        for s in script:
            if isinstance(s, Wait):
                applied.append(len(events))
                sent.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(sent.wait(), STEP_WAIT_S)
                continue
            yield s
            applied.append(len(events))

    await synthesis.stream("property", fragments(), settings_, send)
    while len(applied) < len(script):
        applied.append(len(events))
    return events, applied


def _revisions(script, applied) -> list[Revision]:
    """The revisions the script makes, with their text ranges."""
    revisions: list[Revision] = []
    latest: dict[str, Revision] = {}
    open_: Revision | None = None
    at = 0

    def close() -> None:
        nonlocal open_
        if open_ is not None:
            open_.end = at
            open_ = None

    for k, s in enumerate(script):
        if isinstance(s, Wait):
            continue
        if s.clear:
            close()
        if s.replace:
            close()
            old = latest.get(s.replace)
            if old is not None:
                old.replaced_at, old.replaced_how = applied[k], s.if_started
            number = 0 if old is None else old.number + 1
            rev = Revision(s.replace, number, at, at + len(s.text), s.if_started)
            revisions.append(rev)
            at += len(s.text)
            if old is not None and s.if_started is IfStarted.DROP_NEW:
                # kept as the latest only if the old one was speaking; either way a later
                # replace finds one of them: do not check replaced_at through it.
                latest[s.replace] = rev
                rev.replaced_at = None
            else:
                latest[s.replace] = rev
        else:
            if s.segment:
                close()
                rev = Revision(s.segment, 0, at)
                revisions.append(rev)
                latest[s.segment] = rev
                open_ = rev
            at += len(s.text)
            if s.flush or s.mark:
                close()
    close()
    return revisions


def _check(script, events: list[SessionEvent], applied: list[int]) -> None:
    revisions = _revisions(script, applied)
    ends = [e for e in events if isinstance(e, SegmentEnded)]
    got = sorted((e.name, e.revision) for e in ends)
    want = sorted((r.name, r.number) for r in revisions)
    assert got == want, "every revision ends exactly once"
    by_key = {(r.name, r.number): r for r in revisions}

    # Utterances and chunks by revision (an utterance's text lies inside one revision's).
    sent = 0
    index_of_end: dict[tuple[str, int], int] = {}
    utterance_rev: dict[int, Revision] = {}
    ended: dict[int, UtteranceEnded] = {}
    for event in events:
        if isinstance(event, UtteranceEnded):
            ended[event.utterance_index] = event
            span = event.source_span
            for r in revisions:
                if span is not None and r.start <= span[0] and span[1] <= r.end:
                    utterance_rev[event.utterance_index] = r
    for k, event in enumerate(events):
        if isinstance(event, AudioOut):
            assert event.sample_offset == sent
            sent += event.num_samples
            rev = utterance_rev.get(event.utterance_index)
            if rev is not None and not event.silence:
                rev.chunks.append(event)
                at = rev.replaced_at
                if at is not None and k >= at and rev.replaced_how is IfStarted.CUT:
                    later = [c for c in rev.chunks if events.index(c) >= at]
                    assert len(later) <= 1, "a CUT stops within one chunk"
        elif isinstance(event, SegmentEnded):
            assert event.sample_offset == sent, "a segment ends where the audio so far ends"
            assert event.offset_s == pytest.approx(sent / 24000)
            index_of_end[(event.name, event.revision)] = k
    for e in ends:
        rev = by_key[(e.name, e.revision)]
        if e.outcome in (Outcome.REPLACED, Outcome.EXPIRED, Outcome.NOT_SPOKEN):
            assert not rev.chunks, f"{e.outcome} revision {e.name}/{e.revision} sent audio"
        if e.outcome is Outcome.REPLACED and rev.replaced_at is not None:
            assert rev.replaced_how is not None
        if e.outcome is Outcome.SPOKEN:
            mine = [i for i, r in utterance_rev.items() if r is rev]
            end_k = index_of_end[(e.name, e.revision)]
            assert all(events.index(ended[i]) < end_k for i in mine)
        if (
            rev.replaced_at is not None
            and rev.replaced_how is not IfStarted.FINISH
            and rev.replaced_how is not IfStarted.DROP_NEW
        ):
            after = [c for c in rev.chunks if events.index(c) >= rev.replaced_at]
            limit = 1 if rev.replaced_how is IfStarted.CUT else 0
            assert len(after) <= max(limit, 1 if e.outcome is Outcome.CUT else 0), (
                f"replaced text of {e.name}/{e.revision} spoken after the replace"
            )


@pytest.fixture(scope="module")
def stream_settings(server):
    config = tts_pb2.SynthesisConfig(
        voice=tts_pb2.Voice(seed=7),
        sampling=tts_pb2.Sampling(seed=1, min_new_tokens=8, max_new_tokens=8),
        chunking=tts_pb2.Chunking(first_chunk_tokens=1, max_chunk_tokens=2, lookahead_tokens=0),
        text_format=tts_pb2.PLAIN,
    )
    return server.server.synthesis.validator.settings(config)


@settings(
    max_examples=int(os.environ.get("SEGMENTS_EXAMPLES", "40")),
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(script=SCRIPTS)
@example(script=_speaking_then_replaced(IfStarted.CUT))
@example(script=_speaking_then_replaced(IfStarted.FINISH))
@example(script=_speaking_then_replaced(IfStarted.DROP_NEW))
def test_every_segment_ends_once_and_replaced_text_is_not_spoken(server, stream_settings, script):
    script = _valid(script)
    events, applied = server.call(
        _run(server.server.synthesis, stream_settings, script), timeout_s=60
    )
    _check(script, events, applied)
    for e in events:
        if isinstance(e, SegmentEnded):
            hypothesis.event(f"outcome {e.outcome.label}")
