"""Captions that keep up (stream/catch_up.py): the speed level for a lag, skipping the oldest
of a backlog, and the playout clock a real-time listener's lag is counted on."""

from __future__ import annotations

import pytest

from chattts_server.stream.catch_up import LagLimits, PlayoutClock


def test_under_the_soft_limit_the_stream_speaks_at_its_own_speed() -> None:
    limits = LagLimits(2.0, 4.0, 8)
    assert limits.speed_for(0.0, 5) == 5
    assert limits.speed_for(2.0, 5) == 5


def test_between_the_limits_the_speed_rises_with_the_lag_up_to_the_cap() -> None:
    limits = LagLimits(2.0, 4.0, 8)
    speeds = [limits.speed_for(lag, 5) for lag in (2.01, 2.7, 3.4, 4.0)]
    assert speeds == sorted(speeds)
    assert speeds[0] == 6 and speeds[-1] == 8
    assert all(s is not None and 5 < s <= 8 for s in speeds)


def test_past_the_hard_limit_the_utterance_is_spoken_at_the_fastest() -> None:
    assert LagLimits(2.0, 4.0).speed_for(4.01, 5) == 8


def test_a_burst_skips_the_oldest_and_keeps_the_newest() -> None:
    """30 caption lines at once, 1.5 s of audio each: the newest would be heard 43.5 s late
    after the rest, so the oldest go until what is left before it fits in the hard limit."""
    limits = LagLimits(2.0, 4.0)
    lags, durations = [0.0] * 30, [1.5] * 30
    assert limits.oldest_to_skip(lags, durations) == 27  # 2 lines (3 s) left before the newest
    # Each next one, reached in turn, is still one too many until the backlog fits.
    assert limits.oldest_to_skip(lags[27:], durations[27:]) == 0


def test_an_utterance_over_the_hard_limit_itself_is_skipped_unless_it_is_the_newest() -> None:
    limits = LagLimits(2.0, 4.0)
    assert limits.oldest_to_skip([5.0, 0.5], [1.0, 1.0]) == 1
    assert limits.oldest_to_skip([5.0], [1.0]) == 0, "the newest is never skipped for lag"
    assert limits.oldest_to_skip([1.0, 0.5], [1.0, 1.0]) == 0


def test_a_stream_faster_than_the_cap_keeps_its_own_speed() -> None:
    assert LagLimits(1.0, 2.0, 8).speed_for(1.5, 9) == 9


def test_equal_limits_never_divide_by_zero() -> None:
    limits = LagLimits(2.0, 2.0, 8)
    assert limits.speed_for(2.0, 5) == 5
    assert limits.speed_for(2.5, 5) == 8


def test_the_playout_clock_queues_audio_sent_ahead_and_forgives_gaps() -> None:
    clock = PlayoutClock()
    assert clock.heard_at(10.0) == 10.0
    clock.sent(3.0, 10.0)  # 3 s sent at once: heard 10..13
    assert clock.heard_at(11.0) == pytest.approx(13.0)
    clock.sent(1.0, 11.0)  # queued behind: heard 13..14
    assert clock.heard_at(11.5) == pytest.approx(14.0)
    assert clock.heard_at(20.0) == 20.0  # an idle gap is a gap, not a debt


def test_the_playout_clock_says_how_far_the_audio_sent_runs_ahead() -> None:
    clock = PlayoutClock()
    assert clock.ahead_s(5.0) == 0.0
    clock.sent(2.0, 5.0)
    assert clock.ahead_s(5.5) == pytest.approx(1.5)
    assert clock.ahead_s(8.0) == 0.0
