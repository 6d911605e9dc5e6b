"""Every utterance is spoken whole (RELIABILITY.md promise 10), through the real server.

- Never a silent sentence: even a model that wants to end at once says one audio token first
  (the end code is masked at the first step, as upstream's ensure_non_empty guarantees output).
- A token cap that is still reached is reported: UtteranceEnd.finish_reason "max_tokens" and a
  warning in the server's log.
"""

from __future__ import annotations

import logging

import grpc
import pytest
import torch

from chattts_proto.chattts.v1 import tts_pb2, tts_pb2_grpc
from chattts_server.engine.runner import ModelRunner
from serverutil import DEV_MODEL_CACHE, InProcessServer, tiny_server_config

WAIT_S = 60.0


@pytest.fixture(scope="module")
def eager_to_end(tiny_model_dir):
    """A server whose model always prefers the end code: its audio-head logits are shifted so
    the end code wins every draw it is allowed to win (a model that wants silence)."""
    config = tiny_server_config(DEV_MODEL_CACHE, max_streams=2)

    def prefer_end_runner() -> ModelRunner:
        runner = ModelRunner.load(config.model, config.engine)
        sample, eos = runner.code_sampler.sample, runner.eos_code

        def prefer_end(
            slot_ids: list[int], logits: torch.Tensor, num_generated: list[int]
        ) -> torch.Tensor:
            logits = logits.clone()
            logits[..., eos] += 1e4
            return sample(slot_ids, logits, num_generated)

        runner.code_sampler.sample = prefer_end  # type: ignore[method-assign]
        return runner

    with InProcessServer(config, runner_factory=prefer_end_runner) as srv:
        yield srv


def test_a_model_that_wants_to_end_at_once_still_speaks_one_token(eager_to_end):
    with grpc.insecure_channel(eager_to_end.target) as channel:
        stub = tts_pb2_grpc.TextToSpeechStub(channel)
        replies = list(
            stub.Synthesize(
                tts_pb2.SynthesizeRequest(
                    text="Turn left.", config=tts_pb2.SynthesisConfig(voice=tts_pb2.Voice(seed=1))
                ),
                timeout=WAIT_S,
            )
        )
    audio = [r.audio for r in replies if r.HasField("audio")]
    (end,) = [r.utterance_end for r in replies if r.HasField("utterance_end")]
    assert end.finish_reason == "eos" and end.num_tokens == 1
    assert sum(a.num_samples for a in audio) > 0 and end.audio_duration_s > 0


def test_a_cap_that_is_reached_is_reported_and_logged(server, caplog):
    with grpc.insecure_channel(server.target) as channel, caplog.at_level(logging.WARNING):
        stub = tts_pb2_grpc.TextToSpeechStub(channel)
        config = tts_pb2.SynthesisConfig(
            voice=tts_pb2.Voice(seed=1),
            sampling=tts_pb2.Sampling(seed=2, min_new_tokens=12, max_new_tokens=12),
        )
        replies = list(
            stub.Synthesize(
                tts_pb2.SynthesizeRequest(text="A sentence with a tight cap.", config=config),
                timeout=WAIT_S,
            )
        )
    (end,) = [r.utterance_end for r in replies if r.HasField("utterance_end")]
    assert end.finish_reason == "max_tokens" and end.num_tokens == 12
    assert any("reached its token cap (12)" in r.getMessage() for r in caplog.records)
