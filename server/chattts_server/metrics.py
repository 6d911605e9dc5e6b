"""Prometheus metrics, served on their own HTTP port (`--metrics-port`).

Each server builds its own registry, so tests can run several servers in one process.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

_LATENCY_BUCKETS = (0.025, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0)
_LAG_BUCKETS = (0.25, 0.5, 1.0, 2.0, 3.0, 5.0, 7.5, 10.0, 15.0, 20.0, 30.0, 60.0, 120.0)
_RTF_BUCKETS = (0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0)


class Metrics:
    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        latency = partial(Histogram, buckets=_LATENCY_BUCKETS, registry=r)
        counter, gauge = partial(Counter, registry=r), partial(Gauge, registry=r)
        self.ttfa = latency(
            "chattts_time_to_first_audio_seconds", "Stream start to first audio chunk sent"
        )
        self.chunk_gap = latency(
            "chattts_inter_chunk_gap_seconds", "Time between consecutive audio chunks of a stream"
        )
        self.rtf = Histogram(
            "chattts_real_time_factor",
            "Generation time / audio duration per utterance",
            buckets=_RTF_BUCKETS,
            registry=r,
        )
        self.ttfa_by_priority = latency(
            "chattts_time_to_first_audio_by_priority_seconds",
            "Stream start to first audio chunk sent, by the stream's priority class",
            ["priority"],
        )
        self.streams_by_priority = counter(
            "chattts_streams_by_priority_total",
            "Streams finished, by priority class and status",
            ["priority", "status"],
        )
        self.audio_seconds = counter("chattts_audio_seconds_total", "Audio generated")
        self.tokens = counter("chattts_audio_tokens_total", "Audio tokens generated")
        self.started = counter(
            "chattts_streams_started_total",
            "Streams admitted (past validation and the queue), by method",
            ["method"],
        )
        self.streams = counter(
            "chattts_streams_total", "Streams finished, by method and status", ["method", "status"]
        )
        self.rejections = counter(
            "chattts_rejected_streams_total", "Streams refused at admission", ["reason"]
        )
        self.stalled_streams = counter(
            "chattts_stalled_streams_total",
            "Streams cancelled because their client took no audio for --stall-timeout-s",
            ["method"],
        )
        self.lag = Histogram(
            "chattts_utterance_lag_seconds",
            "Per utterance: its first text reaching the server to its first audio heard by a "
            "real-time listener (the max_lag_s lag)",
            buckets=_LAG_BUCKETS,
            registry=r,
        )
        self.utterances = counter(
            "chattts_utterances_total",
            "Utterances ended, by finish_reason (eos, max_tokens, cleared, cut, replaced, "
            "expired, skipped)",
            ["finish_reason"],
        )
        self.segments = counter(
            "chattts_segments_total",
            "Named segments (TextInput.segment, each replace) ended, by outcome (spoken, "
            "replaced, cut, expired, not_spoken)",
            ["outcome"],
        )
        self.parked_streams = gauge(
            "chattts_parked_streams",
            "Resumable streams held for a resume (their connection dropped, or they ended and "
            "the client may not have had the last of them), each for --resume-window-s",
        )
        self.resumes = counter(
            "chattts_resumes_total",
            "ResumeStream calls, by result (ok, not_found, permission_denied, out_of_range)",
            ["result"],
        )
        self.active_streams = gauge("chattts_active_streams", "Streams admitted and running")
        self.queued_streams = gauge("chattts_queued_streams", "Streams waiting for admission")
        self.slots_in_use = gauge("chattts_kv_slots_in_use", "KV-cache slots held by requests")
        self.slots_total = gauge("chattts_kv_slots_total", "KV-cache slots allocated")
        self.gpt_backend = gauge(
            "chattts_gpt_backend",
            "1 for what runs the GPT's layers ('llamacpp Q8_0', 'torch') and its word timing",
            ["backend", "timing_source"],
        )

    def bind(
        self,
        active: Callable[[], float],
        queued: Callable[[], float],
        slots_in_use: Callable[[], float],
        slots_total: Callable[[], float],
    ) -> None:
        """Read gauges from their owners at scrape time."""
        self.active_streams.set_function(active)
        self.queued_streams.set_function(queued)
        self.slots_in_use.set_function(slots_in_use)
        self.slots_total.set_function(slots_total)

    def bind_threads(
        self, threads: Callable[[], float], drops: Callable[[], float], climbs: Callable[[], float]
    ) -> None:
        """Read the thread governor's pool size and its changes at scrape time (CPU serving
        with --adaptive-threads on; absent otherwise)."""
        pool = Gauge(
            "chattts_intra_op_threads",
            "torch intra-op threads the engine runs now (fewer while a neighbour takes the CPUs)",
            registry=self.registry,
        )
        pool.set_function(threads)
        self.registry.register(
            _CounterFromFunctions(
                "chattts_thread_adaptations",
                "Changes of the intra-op thread count under CPU contention, by direction",
                "direction",
                {"down": drops, "up": climbs},
            )
        )

    def set_gpt_backend(self, backend: str, timing_source: str) -> None:
        """Publish what runs the GPT (`ModelInfo.backend`, `.timing_source`)."""
        self.gpt_backend.clear()
        self.gpt_backend.labels(backend=backend, timing_source=timing_source).set(1)

    def serve(self, port: int, host: str = "0.0.0.0") -> None:
        """Serve /metrics over HTTP on host:port (a daemon thread); OSError if the port is taken."""
        start_http_server(port, addr=host, registry=self.registry)

    def streams_started(self, method: str) -> None:
        self.started.labels(method=method).inc()

    def streams_finished(self, method: str, status: str, priority: str = "default") -> None:
        self.streams.labels(method=method, status=status).inc()
        self.streams_by_priority.labels(priority=priority, status=status).inc()

    def stalled(self, method: str) -> None:
        self.stalled_streams.labels(method=method).inc()

    def resumed(self, result: str) -> None:
        self.resumes.labels(result).inc()

    def rejected(self, reason: str) -> None:
        self.rejections.labels(reason=reason).inc()

    def observe_ttfa(self, seconds: float, priority: str = "default") -> None:
        self.ttfa.observe(seconds)
        self.ttfa_by_priority.labels(priority=priority).observe(seconds)

    def observe_chunk_gap(self, seconds: float) -> None:
        self.chunk_gap.observe(seconds)

    def observe_lag(self, lag_s: float, finish_reason: str) -> None:
        self.lag.observe(lag_s)
        self.utterances.labels(finish_reason=finish_reason).inc()

    def segment_ended(self, outcome: str) -> None:
        self.segments.labels(outcome=outcome).inc()

    def observe_utterance(self, generation_s: float, audio_s: float, num_tokens: int) -> None:
        self.audio_seconds.inc(audio_s)
        self.tokens.inc(num_tokens)
        if audio_s > 0:
            self.rtf.observe(generation_s / audio_s)


class _CounterFromFunctions(Collector):
    """A labelled counter whose values its owner keeps (read at scrape time)."""

    def __init__(
        self, name: str, documentation: str, label: str, values: dict[str, Callable[[], float]]
    ) -> None:
        self.name, self.documentation, self.label, self.values = name, documentation, label, values

    def collect(self) -> list[Metric]:
        family = CounterMetricFamily(self.name, self.documentation, labels=[self.label])
        for value, read in self.values.items():
            family.add_metric([value], read())
        return [family]
