"""The one way tests wait for something another thread or process does: poll a condition until it
holds, within a bounded time, then say what was awaited if it never did."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(
    predicate: Callable[[], object], timeout_s: float, what: str, interval_s: float = 0.02
) -> None:
    """Return once `predicate()` is true; AssertionError naming `what` after `timeout_s`."""
    wait_for(predicate, bool, timeout_s, what, interval_s)


def wait_for(
    value: Callable[[], T],
    accept: Callable[[T], object],
    timeout_s: float,
    what: str,
    interval_s: float = 0.02,
) -> T:
    """The first `value()` that `accept` takes; AssertionError naming `what` (and the last value)
    after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        current = value()
        if accept(current):
            return current
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}: {current!r}")
        time.sleep(interval_s)
