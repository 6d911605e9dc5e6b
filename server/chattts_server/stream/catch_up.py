"""Captions that keep up: a stream's lag, and what it does when the lag grows (max_lag_s).

A live-caption reader sends text at the speaker's pace. If synthesis falls behind (the voice is
slower than the captions, or the machine is), the lag grows without bound and the viewer hears
speech minutes after the picture. So a stream may set a soft and a hard limit on its lag:

    lag <= soft      the stream's own speed
    soft < lag       the next utterance a speed level faster per share of the way to the hard
                     limit, up to `max_speed` (ChatTTS's own [speed_N] control)
    lag > hard       the oldest queued utterances are skipped (`oldest_to_skip`) until both the
                     next one's lag and the newest's (counting the audio queued before it) are
                     back under the hard limit: a listener who fell behind hears the most recent
                     text, never a backlog. A skipped utterance ends with finish_reason "skipped"
                     and its text, and no audio (the whole of it: never a sentence cut in half).
                     The newest released utterance is never skipped for lag.

Lag is the time from a piece of text reaching the server to its first audio being heard by a
listener who plays the stream in real time from its first chunk (`PlayoutClock`): the later of
the audio being sent and the end of the audio sent before it. A server faster than real time
sends audio ahead of the listener; the lag still counts what the listener has yet to hear.
Utterances of a named segment (navigation prompts) are never sped up or skipped: they have
their own expiry.

The same clock paces a stream that asks (`pace_lead_s`): its audio is sent at most that far
ahead of the listener, so what the server calls started is what the listener is hearing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

DEFAULT_MAX_SPEED = 8
"""The fastest level catching up uses unless the stream says (speed_9 sounds rushed)."""
MIN_LAG_S = 0.5
MAX_LAG_S = 600.0
MIN_PACE_LEAD_S = 0.1
MAX_PACE_LEAD_S = 60.0


@dataclass(frozen=True)
class LagLimits:
    """A stream's SynthesisConfig.max_lag_s, hard_lag_s and catch_up_max_speed."""

    soft_s: float
    hard_s: float
    max_speed: int = DEFAULT_MAX_SPEED

    def speed_for(self, lag_s: float, base_speed: int) -> int:
        """The speed level to speak an utterance at whose lag is `lag_s` (if it started now):
        the fastest past the hard limit."""
        top = max(base_speed, self.max_speed)
        if lag_s <= self.soft_s or top == base_speed:
            return base_speed
        share = (lag_s - self.soft_s) / max(1e-9, self.hard_s - self.soft_s)
        return min(top, base_speed + max(1, math.ceil(share * (top - base_speed))))

    def oldest_to_skip(self, lags_s: list[float], durations_s: list[float]) -> int:
        """How many of the oldest queued utterances to skip. `lags_s[i]`: utterance i's lag if
        it started now (oldest first, the newest last); `durations_s[i]`: its estimated audio.
        The newest is heard after every utterance kept before it, so each kept one adds to its
        lag; it is never skipped itself."""
        newest = len(lags_s) - 1
        for k in range(newest):
            newest_lag_s = lags_s[newest] + sum(durations_s[k:newest])
            if lags_s[k] <= self.hard_s and newest_lag_s <= self.hard_s:
                return k
        return max(0, newest)


class PlayoutClock:
    """When a listener who plays the stream in real time from its first chunk hears what the
    stream sends: each chunk starts playing when it arrives or when the audio before it ends,
    whichever is later (an idle gap in the text is a gap in the playback, not a debt)."""

    def __init__(self) -> None:
        self._ends_at: float | None = None

    def heard_at(self, now: float) -> float:
        """When audio sent at `now` starts playing."""
        return now if self._ends_at is None else max(now, self._ends_at)

    def sent(self, duration_s: float, now: float) -> None:
        """`duration_s` of audio was sent at `now`."""
        self._ends_at = self.heard_at(now) + duration_s

    def ahead_s(self, now: float) -> float:
        """How far the audio sent so far runs ahead of the listener at `now`."""
        return 0.0 if self._ends_at is None else max(0.0, self._ends_at - now)
