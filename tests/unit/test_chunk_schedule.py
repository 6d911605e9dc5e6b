"""The chunk schedule's decisions: the server's shorter first chunk and first lookahead
(--first-chunk-tokens, --first-lookahead-tokens), the per-chunk lookahead, and what a request's
own fields change; and the planner that cuts a stream by it (`plan_chunks`), on plain numbers."""

from __future__ import annotations

import pytest

from chattts_server.config import EngineConfig
from chattts_server.engine.chunk_plan import (
    ChunkGeometry,
    PlanPosition,
    StreamChunking,
    plan_chunks,
)
from chattts_server.engine.chunking import ChunkSchedule
from chattts_server.engine.utterance import ChunkingOptions


def test_the_server_s_schedule_shortens_only_the_first_chunk_s_lookahead() -> None:
    config = ChunkSchedule.from_config(EngineConfig())
    assert config.first_chunk_tokens == 4
    assert config.schedule(100) == [4, 8, 16, 32, 32, 8]
    assert [config.lookahead_of(i) for i in range(3)] == [4, 8, 8]
    assert config.min_lookahead_tokens == 4


def test_a_first_lookahead_never_lengthens_the_lookahead() -> None:
    config = ChunkSchedule(first_chunk_tokens=2, lookahead_tokens=1, first_lookahead_tokens=4)
    assert config.lookahead_of(0) == config.lookahead_of(1) == 1


def test_a_request_s_own_lookahead_holds_for_its_first_chunk_too() -> None:
    server = ChunkSchedule.from_config(EngineConfig())
    own = server.with_options(ChunkingOptions(lookahead_tokens=12))
    assert [own.lookahead_of(i) for i in range(3)] == [12, 12, 12]
    only_first = server.with_options(ChunkingOptions(first_chunk_tokens=8))
    assert only_first.first_chunk_tokens == 8 and only_first.lookahead_of(0) == 4
    assert server.with_options(ChunkingOptions()) is server


@pytest.mark.parametrize("first_lookahead", [-1, 129])
def test_first_lookahead_bounds(first_lookahead: int) -> None:
    with pytest.raises(ValueError, match="first_lookahead_tokens"):
        ChunkSchedule(lookahead_tokens=8, first_lookahead_tokens=first_lookahead)


@pytest.mark.parametrize(
    "bad",
    [
        dict(first_chunk_tokens=0),
        dict(first_chunk_tokens=40, max_chunk_tokens=32),
        dict(growth=0.5),
        dict(left_context_tokens=-1),
        dict(lookahead_tokens=-1),
        dict(crossfade_samples=-1),
    ],
)
def test_schedule_bounds(bad: dict) -> None:
    with pytest.raises(ValueError):
        ChunkSchedule(**bad)


def test_chunk_sizes_grow_as_floats_up_to_the_cap() -> None:
    config = ChunkSchedule(first_chunk_tokens=8, growth=1.5, max_chunk_tokens=32)
    assert [config.chunk_tokens(i) for i in range(6)] == [8, 12, 18, 27, 32, 32]
    assert ChunkSchedule(first_chunk_tokens=8, growth=2.0, max_chunk_tokens=32).schedule(100) == [
        8,
        16,
        32,
        32,
        12,
    ]


# The tiny dev Vocos's figures: 512 samples a token, a decode one hop short, 52 tokens of
# receptive field either side.
GEOMETRY = ChunkGeometry(
    hop_length=256,
    end_trim_samples=256,
    vocoder_left=28,
    vocoder_right=29,
    receptive_field_tokens=(52, 52),
)
SERVER = ChunkSchedule(first_chunk_tokens=4, lookahead_tokens=8, first_lookahead_tokens=4)


def test_the_first_chunk_waits_for_its_own_lookahead_and_the_next_for_the_longer_one() -> None:
    chunking = StreamChunking.resolve(SERVER, GEOMETRY)
    assert not chunking.exact and chunking.left_context_tokens == 52
    assert plan_chunks(chunking, PlanPosition(), 7, ended=False) == ([], PlanPosition())
    (first,), position = plan_chunks(chunking, PlanPosition(), 8, ended=False)
    assert (first.t0, first.t1, first.ta, first.tb, first.final) == (0, 4, 0, 8, False)
    assert position == PlanPosition(4, 1, (first.seam_start, first.seam_end))
    # The second chunk (8 tokens) waits for 8 tokens of lookahead past it.
    assert plan_chunks(chunking, position, 19, ended=False)[0] == []
    (second,), position = plan_chunks(chunking, position, 20, ended=False)
    assert (second.t0, second.t1, second.tb) == (4, 12, 20)
    assert second.emit_lo == first.seam_start


def test_at_the_end_everything_left_is_planned_and_the_last_chunk_ends_at_the_last_sample() -> None:
    chunking = StreamChunking.resolve(SERVER, GEOMETRY)
    chunks, position = plan_chunks(chunking, PlanPosition(), 25, ended=True)
    assert [(c.t0, c.t1, c.tb) for c in chunks] == [(0, 4, 8), (4, 12, 20), (12, 25, 25)]
    assert [c.final for c in chunks] == [False, False, True]
    last = chunks[-1]
    assert last.seam_start == last.seam_end == GEOMETRY.total_samples(25) == 25 * 512 - 256
    assert position.final_planned
    assert plan_chunks(chunking, position, 25, ended=True) == ([], position)


def test_a_chunk_that_ended_at_the_last_token_before_the_end_is_followed_by_an_empty_flush() -> (
    None
):
    chunking = StreamChunking.resolve(
        ChunkSchedule(first_chunk_tokens=4, lookahead_tokens=0), GEOMETRY
    )
    (mid,), position = plan_chunks(chunking, PlanPosition(), 4, ended=False)
    assert (mid.t1, mid.final) == (4, False)
    (flush,), position = plan_chunks(chunking, position, 4, ended=True)
    assert (flush.t0, flush.t1, flush.final) == (4, 4, True)
    assert flush.emit_lo == mid.seam_start and flush.seam_end == GEOMETRY.total_samples(4)


def test_planning_as_tokens_arrive_cuts_the_same_chunks_as_planning_at_the_end() -> None:
    chunking = StreamChunking.resolve(SERVER, GEOMETRY)
    chunks, position = [], PlanPosition()
    for num_tokens in range(1, 101):
        new, position = plan_chunks(chunking, position, num_tokens, ended=False)
        chunks += new
    chunks += plan_chunks(chunking, position, 100, ended=True)[0]
    assert chunks == plan_chunks(chunking, PlanPosition(), 100, ended=True)[0]
    assert [c.t1 - c.t0 for c in chunks] == [4, 8, 16, 32, 32, 8]


def test_exact_seams_are_empty_and_short_lookahead_seams_crossfade_around_the_boundary() -> None:
    exact = StreamChunking.resolve(
        ChunkSchedule(first_chunk_tokens=8, lookahead_tokens=52), GEOMETRY
    )
    assert exact.exact
    first = plan_chunks(exact, PlanPosition(), 60, ended=False)[0][0]
    assert first.seam_start == first.seam_end == 8 * 512
    # The vocoder window reaches the receptive field past the kept samples' last block.
    assert (first.va, first.vb) == (0, 8 * 2 + 29)

    short = StreamChunking.resolve(
        ChunkSchedule(first_chunk_tokens=8, lookahead_tokens=4), GEOMETRY
    )
    crossfade = short.config.crossfade_samples
    (first, second), _ = plan_chunks(short, PlanPosition(), 28, ended=False)
    assert (first.seam_start, first.seam_end) == (
        8 * 512 - crossfade // 2,
        8 * 512 + crossfade // 2,
    )
    assert second.emit_lo == first.seam_start
    # Too short a left context (Vocos drops a hop at the end) or too long a crossfade cannot
    # overlap the seams: refused.
    with pytest.raises(ValueError):
        StreamChunking.resolve(ChunkSchedule(left_context_tokens=0, lookahead_tokens=0), GEOMETRY)
    with pytest.raises(ValueError):
        StreamChunking.resolve(
            ChunkSchedule(first_chunk_tokens=1, crossfade_samples=1024), GEOMETRY
        )
