"""The engine's way into word timing: the GPT's alignment heads when it is built
(`HeadCache.settle`), each decode step's most attended text token of the rows it captured
(`attended_tokens`), and an utterance's `TokenAlignment` at its end (`utterance_alignment`),
which travels with `UtteranceDone` to the stream (`timing/timeline.py`)."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from pathlib import Path

import torch
from torch import Tensor

from ..audio_constants import AUDIO_TOKENS_PER_S
from ..model.loader import ChatTTSModules
from ..model.warmup_cache import WarmupCache, weights_digest
from .calibration import (
    CALIBRATION_TEXT,
    MIN_SCORE,
    PromptFor,
    SpeakingGPT,
    calibrate_alignment_heads,
)
from .capture import AttentionWeights
from .types import ATTENTION, ESTIMATE, HeadId, PromptText, TokenAlignment

log = logging.getLogger(__name__)


class HeadCache:
    """The alignment heads of the GPT that serves: calibrated once per weights and what runs
    them, kept in the GGUF folder."""

    def __init__(self, folder: Path, digest: str, modules: ChatTTSModules) -> None:
        self.store = WarmupCache(folder, "alignment")
        self.digest, self.modules = digest, modules
        self._known: dict[str, tuple[HeadId, ...] | None] = {}

    @functools.cached_property
    def _embed_digest(self) -> str:
        """Hashed only where heads are looked up (not behind CUDA graphs)."""
        return weights_digest(self.modules.embed.state_dict())

    def _key(self, served: str) -> dict[str, object]:
        return {
            "version": 3,  # 3: llama.cpp's K cached in Q8_0
            "gpt": self.digest,
            "embed": self._embed_digest,
            "served": served,
            "calibration": CALIBRATION_TEXT,
            "min_score": MIN_SCORE,
        }

    def known(self, served: str) -> tuple[HeadId, ...] | None:
        """The heads measured before for what serves ('llamacpp Q8_0', 'torch torch.float16'),
        or None."""
        if served not in self._known:
            key = self._key(served)
            cached = self.store.load_json(key)
            heads = None
            if isinstance(cached, list):
                heads = tuple((int(layer), int(head)) for layer, head in cached)
                source = f"attention, heads {heads}" if heads else "estimate"
                where = self.store.path_for(key)
                log.info("word timing: source %s (measured before: %s)", source, where)
            self._known[served] = heads
        return self._known[served]

    def settle(
        self,
        gpt: SpeakingGPT,
        served: str,
        prompt_for: PromptFor,
        next_embed: Callable[[Tensor], Tensor],
        max_tokens: int,
        dtype: torch.dtype,
    ) -> tuple[HeadId, ...]:
        """`gpt`'s heads (`served` names what runs it): known, or calibrated and stored."""
        if gpt.decode_graphs == "cuda":
            log.info("alignment heads: not calibrated (CUDA graphs replay the decode step)")
            return ()
        found = self.known(served)
        if found is None:
            found = calibrate_alignment_heads(
                gpt, prompt_for, next_embed, AUDIO_TOKENS_PER_S, max_tokens, dtype
            )
            self.store.store_json(self._key(served), [list(h) for h in found])
        return found


def timing_source(heads: tuple[HeadId, ...]) -> str:
    """`ModelInfo.timing_source` with these alignment heads."""
    return ATTENTION if heads else ESTIMATE


def attended_tokens(capture: AttentionWeights) -> list[tuple[int, int]]:
    """(row, text token) of each captured row: the argmax of its heads' weights averaged."""
    rows = [r.row for r in capture.rows]
    weights = torch.stack([capture.row_weights(r).mean(0) for r in rows])
    return list(zip(rows, weights.argmax(dim=1).tolist(), strict=True))


def utterance_alignment(
    tokens: list[int], num_codes: int, text: PromptText | None
) -> TokenAlignment | None:
    """Which text token of `text` each of an audio pass's `num_codes` codes attends to, from
    the text `tokens` of its decode steps (None without any). The decode row fed code j makes
    code j + 1: code 0 (sampled from the prompt) takes the first row's token."""
    if not tokens or text is None or not num_codes:
        return None
    path = [tokens[0], *tokens][:num_codes]
    path += [path[-1]] * (num_codes - len(path))
    return TokenAlignment(tuple(path), text.token_chars)
