"""The chunk schedule's decisions: a shorter first chunk for a stream that starts while the
decode batch is large (`BusyFirstChunk`), and the per-chunk lookahead it sets."""

from __future__ import annotations

import pytest

from chattts_server.engine.chunking import BusyFirstChunk, ChunkSchedule
from chattts_server.engine.utterance import ChunkingOptions

BUSY = BusyFirstChunk(min_batch=8, first_chunk_tokens=4, lookahead_tokens=4)


def test_below_the_batch_a_stream_keeps_its_schedule() -> None:
    config = ChunkSchedule()
    assert BUSY.apply(config, batch=7) is config
    assert config.lookahead_of(0) == config.lookahead_of(1) == config.lookahead_tokens


def test_at_the_batch_only_the_first_chunk_is_shorter() -> None:
    config = BUSY.apply(ChunkSchedule(first_chunk_tokens=8, lookahead_tokens=8), batch=8)
    assert config.first_chunk_tokens == 4
    assert config.schedule(100) == [4, 8, 16, 32, 32, 8]
    assert [config.lookahead_of(i) for i in range(3)] == [4, 8, 8]
    assert config.min_lookahead_tokens == 4


def test_off_never_applies() -> None:
    config = ChunkSchedule()
    assert BusyFirstChunk(min_batch=0).apply(config, batch=1024) is config


def test_never_lengthens_a_schedule() -> None:
    config = ChunkSchedule(first_chunk_tokens=2, lookahead_tokens=1)
    busy = BUSY.apply(config, batch=16)
    assert busy.first_chunk_tokens == 2
    assert busy.first_lookahead_tokens is None and busy.lookahead_of(0) == 1


def test_a_request_s_own_fields_win() -> None:
    config = ChunkSchedule(first_chunk_tokens=8, lookahead_tokens=8)
    fixed = BUSY.apply(config, 16, ChunkingOptions(first_chunk_tokens=8, lookahead_tokens=8))
    assert fixed is config
    only_first = BUSY.apply(config, 16, ChunkingOptions(first_chunk_tokens=8))
    assert only_first.first_chunk_tokens == 8 and only_first.lookahead_of(0) == 4


@pytest.mark.parametrize("first_lookahead", [-1, 9])
def test_first_lookahead_bounds(first_lookahead: int) -> None:
    with pytest.raises(ValueError, match="first_lookahead_tokens"):
        ChunkSchedule(lookahead_tokens=8, first_lookahead_tokens=first_lookahead)
