"""One utterance being spoken: what of it has gone out, how it stops, and the events that close
it (its last audio, its word timings when asked for, its `UtteranceEnded`)."""

from __future__ import annotations

import time

import numpy as np

from ..engine.events import UtteranceDone
from ..engine.utterance import UtteranceRequest
from ..text.spans import Traced
from ..timing.timeline import heard_until, own_text, word_ends, word_timings
from .events import SessionEvent, UtteranceEnded
from .items import Speak
from .output import StreamOutput
from .segments import State

_CUT_FADE_S = 0.005
"""A chunk cut at a word boundary fades out over its last 5 ms, so the stop makes no click."""


class Utterance:
    def __init__(
        self, index: int, item: Speak, request: UtteranceRequest, out: StreamOutput
    ) -> None:
        self.index = index
        self.item = item
        self.request = request
        self.started = time.monotonic()
        self.start_offset = out.sample_offset
        self.pcm: list[np.ndarray] = []
        """The native samples sent."""
        self.spoken: Traced | None = None
        """What the engine read (normalized), once it says."""
        self.first_audio_s: float | None = None
        self.lag_s: float | None = None
        """Set when its first chunk goes out."""
        self.stopped = False
        """It ends now, with `finish_reason`."""
        self.cut_at_word = False
        """Its next chunk is cut at the next word boundary, and it ends there ("cut")."""
        self.finish_reason = "cleared"

    @property
    def speed(self) -> int:
        return self.request.speed

    @property
    def sent(self) -> bool:
        return bool(self.pcm)

    def halt(self, reason: str) -> None:
        """Stop now (the chunk on its way is not sent); the first reason stands."""
        if not self.stopped:
            self.stopped = True
            self.finish_reason = reason

    def expire(self) -> None:
        """Its segment could not start in time: no audio of it is sent."""
        self.halt("expired")
        if self.item.segment is not None:
            self.item.segment.end(State.EXPIRED)

    def first_chunk(self, heard_at: float) -> bool:
        """Its first chunk is going out (heard from `heard_at`); False: its segment expired."""
        segment = self.item.segment
        if segment is not None and segment.state is State.TAKEN:
            if segment.expired():
                self.expire()
                return False
            segment.move(State.SPEAKING)
        now = time.monotonic()
        self.lag_s = heard_at - (self.item.received_at or self.started)
        self.first_audio_s = now - self.started
        return True

    def take(self, chunk: np.ndarray, native_rate: int) -> np.ndarray:
        """The part of `chunk` to send: all of it, or up to the next word boundary when cutting
        (then the utterance ends "cut")."""
        if self.cut_at_word:
            chunk = self._up_to_word_end(chunk, native_rate)
            self.halt("cut")
        self.pcm.append(chunk)
        return chunk

    def heard_source_end(self, out: StreamOutput) -> int | None:
        """Where the caller's text stands once its audio sent so far is heard (see
        `StreamOutput.heard_source_end`): after its last word wholly sent, else at its start."""
        span = self.item.text.span()
        if span is None:
            return None
        sent = round((out.sample_offset - self.start_offset) * out.native_rate / out.sample_rate_hz)
        text = self.spoken if self.spoken is not None else self.item.text
        end = heard_until(text, sent, out.native_rate, self.speed)
        return span[0] if end is None else end

    def _up_to_word_end(self, chunk: np.ndarray, native_rate: int) -> np.ndarray:
        """The part of `chunk` up to the utterance's next word boundary: the whole chunk when
        none falls inside it, nothing when the words (as the duration model places them) are
        all said already."""
        sent = sum(len(p) for p in self.pcm)
        text = self.spoken if self.spoken is not None else self.item.text
        ends = word_ends(text, sent + len(chunk), native_rate, self.speed)
        after = [e for e in ends if e > sent]
        if not after:
            return chunk[:0]
        keep = min(len(chunk), after[0] - sent)
        out = chunk[:keep].astype(np.float32, copy=True)
        fade = min(keep, round(_CUT_FADE_S * native_rate))
        if fade:
            out[keep - fade :] *= np.linspace(1.0, 0.0, fade, dtype=np.float32)
        return out

    def closing(
        self,
        out: StreamOutput,
        done: UtteranceDone | None,
        word_timing: bool,
        samples_per_token: int,
    ) -> list[SessionEvent]:
        """Its last events: `done` from the engine, or None when it was stopped (what was sent
        is the utterance)."""
        events: list[SessionEvent] = list(out.end_utterance(self.index))
        if done is None:  # what was sent is the utterance: its words as read, or as asked
            said: Traced | None = self.spoken if self.spoken is not None else self.item.text
        else:
            said = done.spoken or self.spoken
        if word_timing and said is not None:
            events.append(self._timings(out, said, done, samples_per_token))
        if done is None:
            done = self._stopped_done(samples_per_token)
            if self.lag_s is None:  # no audio: its lag is the wait until now
                self.lag_s = out.playout.heard_at(time.monotonic()) - (
                    self.item.received_at or self.started
                )
        events.append(
            ended(self.index, self.item, self.speed, out, done, self.start_offset, self.lag_s)
        )
        return events

    def _stopped_done(self, samples_per_token: int) -> UtteranceDone:
        now_s = time.monotonic() - self.started
        native_samples = sum(len(p) for p in self.pcm)
        return UtteranceDone(
            text=self.spoken.text if self.spoken is not None else self.item.text.text,
            num_tokens=native_samples // samples_per_token,
            num_samples=native_samples,
            time_to_first_audio_s=now_s if self.first_audio_s is None else self.first_audio_s,
            generation_time_s=now_s,
            finish_reason=self.finish_reason,
        )

    def _timings(
        self, out: StreamOutput, said: Traced, done: UtteranceDone | None, samples_per_token: int
    ) -> SessionEvent:
        audio = np.concatenate(self.pcm) if self.pcm else np.zeros(0, dtype=np.float32)
        return word_timings(
            self.index,
            self.item,
            said,
            audio,
            cut=done is None,
            native_rate=out.native_rate,
            speed=self.speed,
            stream_offset=self.start_offset,
            stream_samples=out.sample_offset - self.start_offset,
            stream_rate=out.sample_rate_hz,
            alignment=done.alignment if done is not None else None,
            samples_per_token=samples_per_token,
        )


def ended(
    index: int,
    item: Speak,
    speed: int,
    out: StreamOutput,
    done: UtteranceDone,
    start_offset: int,
    lag_s: float | None,
) -> UtteranceEnded:
    """An utterance's `UtteranceEnded`: its audio is what the stream sent since `start_offset`."""
    return UtteranceEnded(
        index,
        done,
        done.num_samples / out.native_rate,
        sample_offset=start_offset,
        num_samples=out.sample_offset - start_offset,
        source_text=own_text(item),
        source_span=item.text.span(),
        lag_s=max(0.0, lag_s or 0.0),
        speed=speed,
    )
