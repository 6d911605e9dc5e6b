"""The chunk schedule's decisions: the server's shorter first chunk and first lookahead
(--first-chunk-tokens, --first-lookahead-tokens), the per-chunk lookahead, and what a request's
own fields change."""

from __future__ import annotations

import pytest

from chattts_server.config import EngineConfig
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
