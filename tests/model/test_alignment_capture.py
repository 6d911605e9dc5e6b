"""Attention captured from our Llama forward (timing/capture.py): equal to
transformers' own attention weights, and, on a model whose one head is steered to attend along a
given path, that head alone chosen by calibration and the words it times within one token of
the path."""

from __future__ import annotations

import numpy as np
import torch
from transformers import LlamaConfig, LlamaModel

from chattts_server.engine.gpt import TorchGPT
from chattts_server.model.kv_cache import SlotKVCache
from chattts_server.model.llama import DecodeBatch, LlamaDecoder, LlamaShape, PromptRun
from chattts_server.model.llama_layers import apply_rope
from chattts_server.text.spans import Traced
from chattts_server.text.words import spoken_words
from chattts_server.timing.attention import alignment_path, attention_timing
from chattts_server.timing.calibration import (
    CALIBRATION_SLOT,
    choose_heads,
    head_weights,
    score_heads,
)
from chattts_server.timing.capture import AlignmentCapture
from chattts_server.timing.types import CaptureRow, TokenAlignment

HIDDEN, HEADS, HEAD_DIM = 128, 4, 32


def _config(num_kv_heads: int = 2) -> LlamaConfig:
    return LlamaConfig(
        hidden_size=HIDDEN,
        intermediate_size=256,
        num_attention_heads=HEADS,
        num_key_value_heads=num_kv_heads,
        num_hidden_layers=2,
        max_position_embeddings=256,
        vocab_size=8,
        attn_implementation="eager",
    )


def _reference() -> LlamaModel:
    torch.manual_seed(0)
    ref = LlamaModel(_config()).eval()
    with torch.no_grad():
        for name, p in ref.named_parameters():
            p.copy_(1 + 0.1 * torch.randn_like(p) if "norm" in name else 0.1 * torch.randn_like(p))
    return ref


@torch.inference_mode()
def test_captured_weights_are_transformers_attention_over_the_text() -> None:
    ref = _reference()
    ours = LlamaDecoder.from_state_dict(_config(), ref.state_dict(), "cpu", torch.float32)
    shape = LlamaShape.from_config(_config())
    cache = SlotKVCache(shape, num_slots=4, max_tokens=64, device="cpu", dtype=torch.float32)
    prompts = {1: torch.randn(12, HIDDEN), 3: torch.randn(9, HIDDEN)}
    for slot, prompt in prompts.items():
        ours.prefill(slot, prompt, 0, cache)
    text = {1: (2, 10), 3: (1, 7)}
    steps = torch.randn(2, HIDDEN)
    heads = [(0, 1), (1, 3), (1, 0)]
    capture = AlignmentCapture(
        heads, [CaptureRow(0, 1, *text[1]), CaptureRow(1, 3, *text[3])], cache, shape
    )
    # In one packed forward behind a prompt chunk, as the runner's step runs it.
    ours.forward_batch(
        [PromptRun(0, torch.randn(5, HIDDEN), 0)],
        DecodeBatch(torch.tensor([1, 3]), steps, torch.tensor([12, 9])),
        cache,
        capture=capture,
    )
    for row, slot in enumerate((1, 3)):
        seq = torch.cat([prompts[slot], steps[row : row + 1]])
        attentions = ref(inputs_embeds=seq[None], output_attentions=True).attentions
        a, b = text[slot]
        found = capture.row_weights(row)
        assert capture.order == [(0, 1), (1, 3), (1, 0)]
        for i, (layer, head) in enumerate(capture.order):
            expected = attentions[layer][0, head, -1, a:b]
            torch.testing.assert_close(found[i], expected / expected.sum(), atol=1e-5, rtol=1e-4)


def _steered(head: int, gain: float) -> LlamaDecoder:
    """Layer 0's query for `head` reads the first HEAD_DIM inputs (after an RMSNorm of weight 1)
    scaled by `gain`: a decode input chooses that head's query."""
    ref = _reference()
    state = {k: v.clone() for k, v in ref.state_dict().items()}
    state["layers.0.input_layernorm.weight"] = torch.ones(HIDDEN)
    q = state["layers.0.self_attn.q_proj.weight"]
    q[head * HEAD_DIM : (head + 1) * HEAD_DIM] = 0
    q[head * HEAD_DIM : (head + 1) * HEAD_DIM, :HEAD_DIM] = gain * torch.eye(HEAD_DIM)
    return LlamaDecoder.from_state_dict(_config(), state, "cpu", torch.float32)


@torch.inference_mode()
def test_a_head_steered_along_a_path_is_chosen_and_times_the_words() -> None:
    head, text_start = 2, 3
    words = spoken_words(Traced.source("turn left in two hundred meters"))
    token_chars = [(a, min(a + 3, w.end)) for w in words for a in range(w.start, w.end, 3)]
    num_tokens = len(token_chars)
    assert num_tokens <= HEAD_DIM
    rng = np.random.default_rng(3)
    durations = [int(n) for n in rng.integers(2, 6, size=num_tokens)]
    path = [t for t, n in enumerate(durations) for _ in range(n)]

    model = _steered(head, gain=3.0)
    shape = model.shape
    cache = SlotKVCache(shape, num_slots=2, max_tokens=128, device="cpu", dtype=torch.float32)
    prompt = torch.randn(text_start + num_tokens + 2, HIDDEN)
    kv_head = head // (HEADS // shape.num_kv_heads)
    generator = torch.Generator().manual_seed(4)
    step = iter(range(len(path)))

    def next_embed(_hidden: torch.Tensor) -> torch.Tensor:
        """A query along token path[i]'s unit vector at step i's position, unroped; noise in
        the inputs the steered head does not read (the other heads see it)."""
        i = next(step)
        if i == 0:
            # The prompt is in: the head's keys at the text positions become token j's j-th
            # unit vector (its kv head is shared by its group; the capture reads the cache as
            # the attention does).
            keys = cache.kv[0, 0, CALIBRATION_SLOT, kv_head]
            keys[text_start : text_start + num_tokens] = 4.0 * torch.eye(num_tokens, HEAD_DIM)
        pos = prompt.shape[0] + i
        unit = torch.zeros(1, 1, HEAD_DIM)
        unit[0, 0, path[i]] = 1.0
        # Rope is a rotation: the query that ropes to `unit` is `unit` roped backwards.
        unroped = apply_rope(unit, model.rope_cos[pos], -model.rope_sin[pos])[0, 0]
        x = torch.randn(HIDDEN, generator=generator)
        x[:HEAD_DIM] = unroped * HEAD_DIM**0.5
        return x

    gpt = TorchGPT(model, cache, None)
    text = (text_start, text_start + num_tokens)
    weights = head_weights(gpt, prompt, text, next_embed, len(path))
    assert set(weights) == {(layer, h) for layer in range(2) for h in range(HEADS)}
    chosen = choose_heads(score_heads(weights))
    assert chosen == ((0, head),)
    found = alignment_path([weights[h] for h in chosen])
    samples_per_token = 512
    timing = attention_timing(
        words,
        TokenAlignment(tuple(int(t) for t in found), tuple(token_chars)),
        len(path) * samples_per_token,
        samples_per_token,
    )
    starts = np.cumsum([0, *durations])
    for word, timed in zip(words, timing.words, strict=True):
        tokens = [t for t, (a, b) in enumerate(token_chars) if a < word.end and b > word.start]
        assert abs(timed.start_sample / samples_per_token - starts[tokens[0]]) <= 1, word
        assert abs(timed.end_sample / samples_per_token - starts[tokens[-1] + 1]) <= 1, word
