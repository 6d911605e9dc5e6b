"""Per-stream figures for metrics and the one-line request log."""

from __future__ import annotations

import logging
import time

from ..engine.utterance import Priority
from ..metrics import Metrics
from ..stream.events import AudioOut, SegmentEnded, SessionEvent, UtteranceEnded

log = logging.getLogger("chattts_server.api.synthesis")


class StreamRecord:
    """One stream, admitted or refused: what it sent, and the status it ended with."""

    def __init__(
        self, metrics: Metrics, method: str, priority: Priority = Priority.DEFAULT
    ) -> None:
        self.metrics = metrics
        self.method = method
        self.priority = priority
        self.started = time.monotonic()
        self.last_chunk_at: float | None = None
        self.first_audio_s: float | None = None
        self.num_chunks = 0
        self.num_utterances = 0
        self.audio_s = 0.0
        self.num_tokens = 0
        self.status = "OK"
        """The status the stream ends with, once known."""

    def on_event(self, event: SessionEvent) -> None:
        now = time.monotonic()
        if isinstance(event, AudioOut):
            if self.first_audio_s is None and not event.silence:
                self.first_audio_s = now - self.started
                self.metrics.observe_ttfa(self.first_audio_s, self.priority.label)
            elif self.last_chunk_at is not None:
                self.metrics.observe_chunk_gap(now - self.last_chunk_at)
            self.last_chunk_at = now
            self.num_chunks += 1
        elif isinstance(event, UtteranceEnded):
            self.num_utterances += 1
            self.audio_s += event.audio_duration_s
            self.num_tokens += event.done.num_tokens
            self.metrics.observe_utterance(
                event.done.generation_time_s, event.audio_duration_s, event.done.num_tokens
            )
            self.metrics.observe_lag(event.lag_s, event.done.finish_reason)
        elif isinstance(event, SegmentEnded):
            self.metrics.segment_ended(event.outcome.label)

    def finish(self, status: str) -> None:
        wall_s = time.monotonic() - self.started
        self.metrics.streams_finished(self.method, status, self.priority.label)
        log.info(
            "stream method=%s status=%s chunks=%d audio_s=%.2f wall_s=%.2f ttfa_ms=%s tokens=%d "
            "rtf=%s priority=%s",
            self.method,
            status,
            self.num_chunks,
            self.audio_s,
            wall_s,
            "-" if self.first_audio_s is None else f"{self.first_audio_s * 1000:.0f}",
            self.num_tokens,
            f"{wall_s / self.audio_s:.2f}" if self.audio_s else "-",
            self.priority.label,
        )
