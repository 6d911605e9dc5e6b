"""The timeline's items without a model: what the text side queues (utterances with the
caller's own text, marks, marks a clear dropped, bad mark names), silences written into the
audio and counted in the offsets, marks answered at the offset of the audio sent so far."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import numpy as np
import pytest

from chattts_server.api.convert import Validator
from chattts_server.api.voices import VoiceLibrary
from chattts_server.errors import InvalidRequestError
from chattts_server.stream.events import AudioOut, MarkReached
from chattts_server.stream.items import MarkAt, Silence, Speak
from chattts_server.stream.reader import EndOfText, Received, TextFragment, read_text
from chattts_server.stream.segments import check_name
from chattts_server.stream.settings import AudioOptions, StreamSettings
from chattts_server.stream.stream import Stream
from chattts_server.stream.text_front_end import CallerText, MarkdownText
from chattts_server.stream.text_queue import TextQueue
from chattts_server.text.release import ReleasePolicy
from chattts_server.text.spans import Traced
from chattts_server.timing.timeline import own_text
from model_info import TINY_MODEL_INFO

RATE = 24000
MODEL = TINY_MODEL_INFO


class _NoEngine:
    """An engine that is never asked to speak: silences and marks need none."""

    model_info = MODEL


def _read(*fragments: TextFragment, markdown: bool = False) -> list[object]:
    async def run() -> list[object]:
        async def source() -> AsyncIterator[TextFragment]:
            for f in fragments:
                yield f

        inbox: asyncio.Queue = asyncio.Queue()
        await read_text(source(), inbox, Validator(VoiceLibrary(None), MODEL), 10_000)
        text = TextQueue(MarkdownText(ReleasePolicy(idle_ms=0, first_words=0), markdown))
        posted = [inbox.get_nowait() for _ in range(inbox.qsize())]
        for message in posted:
            if isinstance(message, Received):
                text.apply(message.fragment, message.at)
            elif isinstance(message, EndOfText):
                text.end()
        return [*text.pending, posted[-1]]

    return asyncio.run(run())


def test_a_mark_ends_the_text_before_it_and_follows_it():
    items = _read(
        TextFragment("turn left"),
        TextFragment(" in 200 m", mark="turn"),
        TextFragment(" then stop"),
    )
    assert isinstance(items[0], Speak) and items[0].text.text == "turn left in 200 m"
    assert items[0].source == "turn left in 200 m"
    assert items[1] == MarkAt("turn")
    assert isinstance(items[2], Speak) and items[2].source == "then stop"
    assert items[2].text.span() == (19, 28)
    assert isinstance(items[3], EndOfText)


def test_a_mark_with_nothing_before_it_is_queued_alone():
    assert _read(TextFragment("", mark="start"))[:1] == [MarkAt("start")]


def test_the_utterance_quotes_the_callers_text_without_markup():
    items = _read(TextFragment("Turn **left** now.", flush=True), markdown=True)
    speak = items[0]
    assert isinstance(speak, Speak)
    assert speak.source == "Turn **left** now."
    assert own_text(speak) == "Turn left now."


def test_caller_text_is_cut_across_fragments():
    caller = CallerText()
    for part in ("ab", "", "cde", "f"):
        caller.append(part)
    assert caller.cut((1, 5)) == "bcde"
    assert caller.cut((5, 6)) == "f"
    assert caller.cut(None) == ""


def test_mark_names_are_bounded_and_named_in_the_error():
    assert check_name("x" * 256) is None
    assert check_name("x" * 257) is not None
    assert check_name("a\x00b") is not None
    items = _read(TextFragment("hello", mark="y" * 300))
    error = items[-1]
    assert isinstance(error, InvalidRequestError) and error.field_name == "text.mark"


def test_silence_is_bounded():
    for bad in (-0.1, float("nan"), float("inf"), 61.0):
        with pytest.raises(ValueError):
            Silence(bad)


def _play(rate_hz: int, *items) -> list[object]:
    settings = StreamSettings(audio=AudioOptions("LINEAR16", rate_hz))
    stream = Stream(_NoEngine(), settings, None, items=items)  # type: ignore[arg-type]

    async def run() -> list[object]:
        return [e async for e in stream.events()]

    return asyncio.run(run())


@pytest.mark.parametrize(("rate_hz", "expected"), [(24000, 30000), (16000, 20000), (8000, 10000)])
def test_silence_is_exact_zeros_counted_in_the_offsets(rate_hz, expected):
    events = _play(rate_hz, Silence(1.25), MarkAt("after"), Silence(0.0))
    audio = [e for e in events if isinstance(e, AudioOut)]
    assert sum(a.num_samples for a in audio) == expected
    assert all(a.silence for a in audio)
    assert not np.frombuffer(b"".join(a.data for a in audio), dtype="<i2").any()
    offsets = [a.sample_offset for a in audio]
    assert offsets == [sum(a.num_samples for a in audio[:i]) for i in range(len(audio))]
    mark = events[len(audio)]
    assert mark == MarkReached("after", expected, expected / rate_hz, False)
    assert events[-1] is mark  # a zero silence writes nothing


def test_a_dropped_mark_says_so():
    (mark,) = _play(RATE, MarkAt("gone", dropped=True))
    assert mark == MarkReached("gone", 0, 0.0, True)


def test_speak_of_cuts_its_source():
    text = Traced.source("say 500元 now", 10)[4:8]
    assert Speak.of(text, "0123456789say 500元 now").source == "500元"


def test_the_server_logs_the_timing_source_it_serves(caplog):
    from chattts_server.api.admission import Admission
    from chattts_server.api.synthesis import Synthesis
    from chattts_server.config import AdmissionConfig, LimitsConfig
    from chattts_server.metrics import Metrics

    synthesis = Synthesis(
        _NoEngine(),  # type: ignore[arg-type]
        VoiceLibrary(None),
        Admission(1, 0),
        LimitsConfig(),
        AdmissionConfig(),
        Metrics(),
    )
    with caplog.at_level("INFO", logger="chattts_server.api.synthesis"):
        synthesis.bind_model(MODEL, ("LINEAR16",))
    assert "word timing" in caplog.text and "source estimate" in caplog.text
