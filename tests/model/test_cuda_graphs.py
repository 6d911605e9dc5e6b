"""The CUDA-graph bookkeeping of the decode step, on the CPU (graphs off, same buffers):
padding to captured sizes and lengths, the scratch slot, static buffers reused, and a padded
decode equal to the plain one on the tiny model."""

from __future__ import annotations

import pytest
import torch

from chattts_server.model.cuda_graphs import DecodeGraphs, length_buckets

D = 8
SCRATCH = 9


def recording_step(calls: list[tuple[list[int], list[int], int]]):
    def step(slot_ids, embeds, positions, attend_len):
        calls.append((slot_ids.tolist(), positions.tolist(), attend_len))
        return embeds * 2 + positions[:, None]

    return step


def graphs(calls, sizes=(1, 2, 4, 8), lengths=(128, 256, 512)) -> DecodeGraphs:
    g = DecodeGraphs(
        recording_step(calls),
        sizes,
        lengths,
        D,
        SCRATCH,
        torch.device("cpu"),
        torch.float32,
        capture=False,
    )
    g.capture_all()
    return g


def test_length_buckets_double_up_to_the_slot_size():
    assert length_buckets(1536) == [128, 256, 512, 1024, 1536]
    assert length_buckets(100) == [100]


def test_warm_up_runs_every_size_and_length_largest_first():
    calls: list = []
    graphs(calls, sizes=(1, 4), lengths=(128, 256))
    assert [(len(slots), length) for slots, _, length in calls] == [
        (4, 256),
        (4, 128),
        (1, 256),
        (1, 128),
    ]


def test_a_batch_pads_to_the_next_size_with_rows_on_the_scratch_slot():
    calls: list = []
    g = graphs(calls)
    calls.clear()
    embeds = torch.randn(3, D)
    out = g(torch.tensor([0, 2, 5]), embeds, torch.tensor([10, 200, 7]), max_position=200)
    (slots, positions, length) = calls[-1]
    assert slots == [0, 2, 5, SCRATCH] and positions == [10, 200, 7, 0]
    assert length == 256  # 201 positions attended -> the 256 bucket
    assert out.shape == (3, D)
    torch.testing.assert_close(out, embeds * 2 + torch.tensor([10.0, 200.0, 7.0])[:, None])


def test_static_buffers_are_reused_and_leftover_rows_reset():
    calls: list = []
    g = graphs(calls)
    buffers = g._buffers[4]
    pointers = (
        buffers.slot_ids.data_ptr(),
        buffers.positions.data_ptr(),
        buffers.embeds.data_ptr(),
    )
    g(torch.tensor([0, 1, 2, 3]), torch.randn(4, D), torch.tensor([5, 5, 5, 5]), 5)
    g(torch.tensor([1]), torch.randn(1, D), torch.tensor([3]), 3)  # another size in between
    embeds = torch.randn(3, D)
    g(torch.tensor([4, 6, 7]), embeds, torch.tensor([1, 2, 3]), 3)
    # The same storage every call (what a captured graph reads), row 3 back to padding.
    assert pointers == (
        buffers.slot_ids.data_ptr(),
        buffers.positions.data_ptr(),
        buffers.embeds.data_ptr(),
    )
    assert buffers.slot_ids.tolist() == [4, 6, 7, SCRATCH]
    assert buffers.positions.tolist() == [1, 2, 3, 0]
    torch.testing.assert_close(buffers.embeds[:3], embeds)


def test_too_large_a_batch_or_length_is_refused():
    g = graphs([])
    with pytest.raises(ValueError, match="batch size 9"):
        g.padded_size(9)
    with pytest.raises(ValueError, match="attention length 513"):
        g.padded_length(513)


# -- the real decoder through the padded static path (tiny model, CPU) -----------------------


def test_padded_static_decode_equals_the_plain_decode(tiny_model_dir):
    from chattts_server.model.kv_cache import SlotKVCache
    from chattts_server.model.llama import LlamaDecoder
    from chattts_server.model.loader import load_chattts

    modules = load_chattts(tiny_model_dir, torch.device("cpu"), torch.float32)
    llama = LlamaDecoder.from_state_dict(
        modules.gpt_config, modules.gpt_state_dict, "cpu", torch.float32
    )
    num_slots, max_tokens, d = 6, 256, llama.shape.hidden_size
    plain = SlotKVCache(llama.shape, num_slots + 1, max_tokens, "cpu", torch.float32)
    torch.manual_seed(0)
    for slot in range(num_slots):  # different prompt lengths in every slot
        llama.prefill(slot, torch.randn(10 + 7 * slot, d), 0, plain)
    static = SlotKVCache(llama.shape, num_slots + 1, max_tokens, "cpu", torch.float32)
    static.kv.copy_(plain.kv)
    g = DecodeGraphs(
        lambda s, e, p, n: llama.decode_static(s, e, p, static, n),
        [1, 2, 4, 8],
        length_buckets(max_tokens, smallest=32),
        d,
        scratch_slot=num_slots,
        device=torch.device("cpu"),
        dtype=torch.float32,
        capture=False,
    )
    for step in range(3):  # scattered slots, a batch of 3 padded to 4
        slots = torch.tensor([0, 2, 5])
        positions = torch.tensor([10, 24, 45]) + step
        embeds = torch.randn(3, d)
        expected = llama.decode(slots, embeds, positions, plain)
        got = g(slots, embeds, positions, int(positions.max()))
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
    # The requests' K/V are the same; only the scratch slot differs.
    torch.testing.assert_close(static.kv[:, :, :num_slots], plain.kv[:, :, :num_slots])


def test_engine_codes_are_the_same_through_the_padded_static_path(tiny_model_dir):
    """The runner's whole decode through DecodeGraphs (eager: what CUDA would capture) gives the
    codes of the plain path, for requests joining and leaving a batch."""
    from chattts_server.config import EngineConfig
    from chattts_server.engine.core import EngineCore
    from chattts_server.engine.utterance import (
        SamplingParams,
        UtteranceRequest,
        VoiceKind,
        VoiceSpec,
    )
    from chattts_server.model.loader import load_chattts
    from engine_run import run_core, torch_runner

    config = EngineConfig(max_streams=3, max_tokens=256, max_new_tokens=64)

    def requests(i: int, n: int) -> UtteranceRequest:
        return UtteranceRequest(
            f"r{i}",
            ["first sentence.", "a second one, longer.", "third."][i],
            voice=VoiceSpec(VoiceKind.SEED, seed=i),
            sampling=SamplingParams(top_k=1, min_new_tokens=n, max_new_tokens=n),
        )

    codes = {}
    for graphs in ("off", "eager"):
        modules = load_chattts(tiny_model_dir, torch.device("cpu"), torch.float32)
        runner = torch_runner(modules, config, decode_graphs=graphs)
        runner.warmup(config.max_streams)
        results = run_core(
            EngineCore.from_config(runner, config),
            {0: [requests(0, 30), requests(1, 12)], 5: [requests(2, 20)]},
        )
        codes[graphs] = {rid: r.codes for rid, r in results.items()}
        if graphs == "eager":
            assert runner.gpt.graphs is not None and runner.gpt.graphs.num_replays > 0
    for rid in codes["off"]:
        assert codes["off"][rid] is not None
        torch.testing.assert_close(
            torch.from_numpy(codes["eager"][rid]), torch.from_numpy(codes["off"][rid])
        )


# -- a capture that fails at warm-up: serve eagerly and say so ------------------------------


@pytest.mark.skipif(
    torch.cuda.is_available(), reason="capture fails here only because no GPU can capture"
)
def test_a_failed_capture_at_warm_up_serves_eagerly_and_says_why(tiny_model_dir, caplog):
    """Graphs asked for where none can be captured (this machine has no usable CUDA device, so
    the capture's first CUDA call raises for real): warm-up logs why, drops the graphs, and the
    engine decodes eagerly; ModelInfo carries the reason."""
    import logging

    from chattts_server.config import EngineConfig
    from chattts_server.engine.core import EngineCore
    from chattts_server.engine.gpt import TorchGPT
    from chattts_server.engine.gpt_build import capture_graphs
    from chattts_server.engine.runner import ModelRunner
    from chattts_server.engine.utterance import (
        SamplingParams,
        UtteranceRequest,
        VoiceKind,
        VoiceSpec,
    )
    from chattts_server.model.loader import load_chattts
    from engine_run import run_core

    config = EngineConfig(max_streams=2, max_tokens=256, max_new_tokens=32)
    modules = load_chattts(tiny_model_dir, torch.device("cpu"), torch.float32)
    gpt = TorchGPT.build(modules, config, torch.device("cpu"), torch.float32, "cuda")
    assert gpt.decode_graphs == "cuda"  # asked for, not yet captured
    with caplog.at_level(logging.WARNING, logger="chattts_server.engine.gpt"):
        capture_graphs(gpt)
    runner = ModelRunner(modules, config, gpt, torch.device("cpu"), torch.float32)
    runner.warmup(config.max_streams)
    assert "CUDA graph capture failed at warm-up" in caplog.text
    info = runner.info
    assert runner.gpt.graphs is None and info.decode_graphs == "off"
    assert info.decode_graphs_error.startswith(("AcceleratorError", "RuntimeError", "Assert"))
    request = UtteranceRequest(
        "r0",
        "one sentence.",
        voice=VoiceSpec(VoiceKind.SEED, seed=1),
        sampling=SamplingParams(top_k=1, min_new_tokens=12, max_new_tokens=12),
    )
    results = run_core(EngineCore.from_config(runner, config), {0: [request]})
    assert results["r0"].codes is not None and results["r0"].codes.shape == (12, 4)


def test_health_check_says_how_the_decode_step_runs(server):
    """The in-process CPU server decodes without graphs: its health replies say 'off' and
    carry no capture error."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with grpc.insecure_channel(server.target) as channel:
        reply, call = health_pb2_grpc.HealthStub(channel).Check.with_call(
            health_pb2.HealthCheckRequest(service=""), timeout=10
        )
    assert reply.status == health_pb2.HealthCheckResponse.SERVING
    metadata = dict(call.initial_metadata())
    assert metadata.get("chattts-decode-graphs") == "off"
    assert "chattts-decode-graphs-error" not in metadata
