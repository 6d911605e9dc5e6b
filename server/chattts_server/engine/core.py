"""`EngineCore`: the engine's step loop, synchronous and single-threaded.

One `step()`: expire deadlines -> `scheduler.schedule()` -> `runner.execute(plan)` ->
`scheduler.update_from_output(plan, output)` -> per-request outputs. No threads and no asyncio
here: `ChatTTSEngine` wraps the core in a thread with queues, and tests drive it directly.

A request's path: `add_request` (the runner prepares its prompt, the scheduler queues it) ->
`schedule` gives it a slot and prefill chunks -> decode steps, each sampling one token and
streaming audio -> the scheduler sees the end code or the budget -> the next plan has the runner
flush the last audio (or, after the refine pass, build the audio-code prompt) -> a
`RequestOutput` with `done`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from ..config import EngineConfig
from ..errors import EngineError, ExpiredError, InvalidRequestError
from ..text.spans import Traced
from .events import UtteranceDone
from .protocol import EngineStats, ModelInfo
from .request import EngineRequest
from .scheduler import Scheduler
from .step_io import FinishedAudio, ModelOutput, PreparedPrompt, SchedulerOutput
from .utterance import UtteranceRequest

log = logging.getLogger(__name__)

MAX_CONSECUTIVE_STEP_FAILURES = 3
"""One failed step may be one bad request; this many in a row mean the engine is broken."""


class Runner(Protocol):
    """What the core needs of the model runner (`runner.ModelRunner`; tests wrap it, see
    tests/helpers/serverutil.FaultyRunner)."""

    info: ModelInfo

    def prepare(self, request_id: str, params: UtteranceRequest) -> PreparedPrompt: ...

    def execute(self, plan: SchedulerOutput) -> ModelOutput: ...


@dataclass
class RequestOutput:
    """What one step produced for one request."""

    request_id: str
    audio: list[np.ndarray] = field(default_factory=list)
    """PCM chunks (float32 mono, model rate) to send, in order."""
    done: UtteranceDone | None = None
    """Set on the utterance's last step, after its last audio."""
    error: BaseException | None = None
    """The request failed (others are unaffected); no more outputs follow."""
    codes: np.ndarray | None = None
    """With `done`: (num_tokens, num_vq) audio codes of the utterance (parity tests)."""
    spoken: Traced | None = None
    """With the utterance's first audio: the text it speaks (`events.Spoken`), sent before it."""

    @property
    def is_last(self) -> bool:
        """No more outputs follow for this request (it is done or failed)."""
        return self.done is not None or self.error is not None


class EngineCore:
    def __init__(
        self, runner: Runner, scheduler: Scheduler, is_paused: Callable[[str], bool]
    ) -> None:
        self.runner = runner
        self.scheduler = scheduler
        self.is_paused = is_paused
        """Whether a request's reader is behind; its generation then skips steps."""
        self.consecutive_failures = 0
        """Steps in a row whose model execution raised."""
        self.tokens_generated = 0
        self.ran_model = False
        """The last step computed something (False: nothing runnable, e.g. all readers behind)."""
        self._requests: dict[str, EngineRequest] = {}
        self._outputs: dict[str, RequestOutput] = {}
        """This step's outputs, by request id."""

    @classmethod
    def from_config(
        cls,
        runner: Runner,
        config: EngineConfig,
        is_paused: Callable[[str], bool] = lambda request_id: False,
    ) -> EngineCore:
        c = config
        scheduler = Scheduler(
            c.max_streams,
            c.max_tokens,
            c.prefill_chunk_tokens,
            c.max_new_tokens,
            c.interactive_hold_tokens,
        )
        return cls(runner, scheduler, is_paused)

    # -- requests in -----------------------------------------------------------------------

    def add_request(self, params: UtteranceRequest) -> EngineRequest:
        """Prepare and queue one utterance. Raises InvalidRequestError (nothing is queued)."""
        if params.request_id in self._requests:
            raise InvalidRequestError("request_id", f"{params.request_id!r} is already running")
        prepared = self.runner.prepare(params.request_id, params)
        request = EngineRequest(
            params.request_id,
            time.monotonic(),
            params.deadline,
            expires_at=params.expires_at,
            priority=params.priority,
        )
        self.scheduler.add(request, prepared)
        self._requests[params.request_id] = request
        return request

    def abort_request(self, request_id: str) -> None:
        """Stop a request (client gone); its slot is free before the next step computes."""
        request = self._requests.pop(request_id, None)
        if request is not None:
            self.scheduler.cancel(request)

    @property
    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_requests

    def stats(self) -> EngineStats:
        return EngineStats(
            active_requests=len(self.scheduler.running),
            waiting_requests=len(self.scheduler.waiting),
            num_slots=self.scheduler.num_slots,
            tokens_generated=self.tokens_generated,
        )

    # -- the step ----------------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        """Run one engine step; outputs for the requests that produced audio or finished.

        Raises only when `MAX_CONSECUTIVE_STEP_FAILURES` steps in a row have failed."""
        self._outputs = {}
        self._expire_deadlines()
        plan = self.scheduler.schedule(lambda r: self.is_paused(r.request_id))
        self.ran_model = plan.has_model_work
        output = self._execute(plan)
        if output is not None:
            decisions = self.scheduler.update_from_output(plan, output)
            now = time.monotonic()
            for request, chunks in decisions.audio:
                self._emit_audio(request, chunks, now)
            for request, error in decisions.failed:
                self._drop(request, error)
            for request, end in decisions.completed:
                self._finish(request, end, now)
        return list(self._outputs.values())

    # -- internals ---------------------------------------------------------------------------

    def _execute(self, plan: SchedulerOutput) -> ModelOutput | None:
        """The runner's step, guarded: on an exception the plan's requests fail (None)."""
        try:
            output = self.runner.execute(plan)
        except Exception:
            self.consecutive_failures += 1
            log.exception("engine step failed (%d in a row)", self.consecutive_failures)
            for request in self.scheduler.abandon(plan):
                self._drop(request, EngineError("internal error during generation"))
            if self.consecutive_failures >= MAX_CONSECUTIVE_STEP_FAILURES:
                raise
            return None
        self.consecutive_failures = 0
        self.tokens_generated += len(output.sampled)
        return output

    def _finish(self, request: EngineRequest, end: FinishedAudio, now: float) -> None:
        """An utterance is complete: its last audio, then done."""
        self._emit_audio(request, [end.pcm], now)
        out = self._output(request)
        out.done, out.codes = request.utterance_done(now, end), end.codes
        self._requests.pop(request.request_id, None)
        if request.finish_reason == "max_tokens":
            log.warning(
                "request %s reached its token cap (%d): the sentence may be cut",
                request.request_id,
                request.max_new_tokens,
            )

    def _output(self, request: EngineRequest) -> RequestOutput:
        return self._outputs.setdefault(request.request_id, RequestOutput(request.request_id))

    def _emit_audio(self, request: EngineRequest, chunks: list[np.ndarray], now: float) -> None:
        chunks = [pcm for pcm in chunks if pcm.size]
        if not chunks:
            return
        if request.first_audio_at is None:
            self._output(request).spoken = request.spoken
        for pcm in chunks:
            request.record_audio(len(pcm), now)
        self._output(request).audio.extend(chunks)

    def _drop(self, request: EngineRequest, error: BaseException) -> None:
        """A request ends with `error` (the scheduler has freed it); no more outputs follow."""
        self._requests.pop(request.request_id, None)
        self._output(request).error = error

    def _expire_deadlines(self) -> None:
        # Before scheduling, so no plan ever holds a request whose slot is being released.
        now = time.monotonic()
        for request in list(self._requests.values()):
            if request.deadline is not None and now > request.deadline:
                self.scheduler.fail(request)
                self._drop(request, TimeoutError("deadline exceeded"))
            elif _expired_before_prefill(request, now):
                self.scheduler.fail(request)
                self._drop(request, ExpiredError("its segment could not start in time"))


def _expired_before_prefill(request: EngineRequest, now: float) -> bool:
    """Its segment's time to start has passed and nothing of it is computed yet."""
    return (
        request.expires_at is not None
        and now >= request.expires_at
        and request.num_prefilled == 0
        and request.first_audio_at is None
    )
