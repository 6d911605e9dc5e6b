"""Marks on the stream's timeline, as a property: random interleavings of fragments, flushes,
marks and clears through the real text reader, session and tiny engine (in-process: the
server's own `Synthesis.stream`, no transport), every event checked against what was sent.

- every mark is answered exactly once, in the order sent;
- a mark not dropped is answered after the end of every utterance whose text came before it,
  before any audio of the text after it, at the offset where the audio sent so far ends;
- a mark is dropped only by a clear sent after it, and a dropped mark's offset is the cut;
- utterance ends say where their audio lies and quote the caller's own text.

Each case holds a few utterances of 2 audio tokens: the whole run takes about a second per ten
cases on the 2-core machine.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from dataclasses import dataclass

import hypothesis
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chattts_proto.chattts.v1 import tts_pb2
from chattts_server.stream.events import AudioOut, MarkReached, SessionEvent, UtteranceEnded
from chattts_server.stream.reader import TextFragment

WORDS = ["go", "left", "now", "then", "stop", "here", "turn", "east"]
PUNCT = ["", "", " ", ". ", ", ", "\n"]
STEP_WAIT_S = 0.05
"""The most a `Wait` step waits for the speaking side to send more (it varies the
interleaving; nothing depends on it ending one way or the other)."""


@dataclass(frozen=True)
class Wait:
    """Let the speaking side send one more event before the next message."""


@st.composite
def fragment(draw: st.DrawFn) -> TextFragment:
    words = draw(st.lists(st.sampled_from(WORDS), min_size=0, max_size=3))
    text = " ".join(words) + draw(st.sampled_from(PUNCT)) if words else draw(st.sampled_from(PUNCT))
    return TextFragment(
        text,
        flush=draw(st.booleans()),
        clear=draw(st.integers(0, 3)) == 0,
        mark="m" if draw(st.integers(0, 2)) == 0 else "",
    )


PROGRAMS = st.lists(st.one_of(fragment(), st.just(Wait())), min_size=1, max_size=10)


def _named(program: list[TextFragment | Wait]) -> list[TextFragment | Wait]:
    """Each mark gets its own name, in order: m0, m1, ..."""
    out: list[TextFragment | Wait] = []
    for step in program:
        if isinstance(step, TextFragment) and step.mark:
            step = TextFragment(
                step.text, step.flush, step.clear, f"m{sum(1 for _ in _marks(out))}"
            )
        out.append(step)
    return out


def _marks(program: list[TextFragment | Wait]) -> list[TextFragment]:
    return [s for s in program if isinstance(s, TextFragment) and s.mark]


async def _run(synthesis, settings_, program: list[TextFragment | Wait]) -> list[SessionEvent]:
    events: list[SessionEvent] = []
    sent = asyncio.Event()

    async def send(event: SessionEvent) -> None:
        events.append(event)
        sent.set()

    async def fragments():
        for step in program:
            if isinstance(step, Wait):
                sent.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(sent.wait(), STEP_WAIT_S)
                continue
            yield step

    await synthesis.stream("property", fragments(), settings_, send)
    return events


def _check(program: list[TextFragment | Wait], events: list[SessionEvent]) -> None:
    # Where each mark sits in the caller's text, and whether a clear follows it.
    caller, mark_at, cleared_after = "", {}, {}
    for step in program:
        if not isinstance(step, TextFragment):
            continue
        if step.clear:
            for name in mark_at:
                cleared_after[name] = True
        caller += step.text
        if step.mark:
            mark_at[step.mark] = len(caller)
            cleared_after[step.mark] = False

    answered = [e for e in events if isinstance(e, MarkReached)]
    assert [m.name for m in answered] == list(mark_at), "each mark once, in order"

    sent_samples = 0
    ended: list[UtteranceEnded] = []
    audio_by_utterance: dict[int, list[AudioOut]] = {}
    for event in events:
        if isinstance(event, AudioOut):
            assert event.sample_offset == sent_samples, "chunks are contiguous"
            sent_samples += event.num_samples
            audio_by_utterance.setdefault(event.utterance_index, []).append(event)
        elif isinstance(event, UtteranceEnded):
            chunks = audio_by_utterance.get(event.utterance_index, [])
            assert event.num_samples == sum(c.num_samples for c in chunks)
            if chunks:
                assert event.sample_offset == chunks[0].sample_offset
            assert event.sample_offset + event.num_samples == sent_samples
            start, end = event.source_span or (0, 0)
            assert event.source_text == caller[start:end]
            ended.append(event)
        elif isinstance(event, MarkReached):
            assert event.sample_offset == sent_samples, "a mark is where the audio so far ends"
            assert event.offset_s == pytest.approx(sent_samples / 24000)
            if event.dropped:
                assert cleared_after[event.name], "only a later clear drops a mark"
                continue
            position = mark_at[event.name]
            # The text before it has ended; none after it has begun.
            assert all(e.source_span[1] <= position for e in ended if e.source_span)
            assert not [e for e in ended if e.source_span and e.source_span[1] > position], (
                "an utterance after the mark ended before it"
            )
    # Every utterance whose text came before an undropped mark ended before that mark.
    for mark in answered:
        if mark.dropped:
            continue
        before = [e for e in ended if e.source_span and e.source_span[1] <= mark_at[mark.name]]
        mark_index = events.index(mark)
        assert all(events.index(e) < mark_index for e in before)


@pytest.fixture(scope="module")
def stream_settings(server):
    config = tts_pb2.SynthesisConfig(
        voice=tts_pb2.Voice(seed=7),
        sampling=tts_pb2.Sampling(seed=1, min_new_tokens=2, max_new_tokens=2),
        text_format=tts_pb2.PLAIN,
    )
    return server.server.synthesis.validator.settings(config)


@settings(
    max_examples=int(os.environ.get("MARKS_EXAMPLES", "200")),
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(program=PROGRAMS)
def test_every_mark_is_answered_once_in_order_at_the_audio_before_it(
    server, stream_settings, program
):
    program = _named(program)
    events = server.call(_run(server.server.synthesis, stream_settings, program), timeout_s=60)
    _check(program, events)
    marks = [e for e in events if isinstance(e, MarkReached)]
    hypothesis.event(f"marks dropped: {any(m.dropped for m in marks)}")
    cut = any(isinstance(e, UtteranceEnded) and e.done.finish_reason == "cleared" for e in events)
    hypothesis.event(f"utterance cut: {cut}")
