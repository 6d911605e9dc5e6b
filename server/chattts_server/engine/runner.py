"""The model runner: owns every tensor (weights, the slot KV cache, per-slot histories) and
executes the scheduler's `StepPlan` on the engine thread.

Per step: prefill chunks (one slot each), one batched decode over all decoding slots, the
heads, per-row sampling, the next input embeddings, and the streaming Decoder+vocoder for the
streams whose next audio chunk is ready.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch

from ..config import EngineConfig, ModelConfig
from ..model.dev_assets import build_dev_assets
from ..model.llama import LlamaDecoder, SlotKVCache
from ..model.loader import ChatTTSModules, load_chattts
from ..model.verify import resolve_model_dir, verify_assets
from ..model.vocoders import HiFiGANVocoder, Vocoder, VocosVocoder
from .prompts import PromptBuilder
from .sampling import SamplingParams
from .scheduler import Sequence, StepPlan
from .slot_sampler import SlotSampler
from .streaming_decode import ChunkingConfig, DecodeStream, StreamingDecoder
from .types import ChunkingOptions, InvalidRequestError, UtteranceRequest, VoiceSpec

log = logging.getLogger(__name__)

REFINE_SAMPLING = SamplingParams(
    temperature=0.7, top_p=0.7, top_k=20, repetition_penalty=1.0, max_new_tokens=384
)
"""ChatTTS's RefineTextParams defaults."""


def build_streaming_decoder(
    modules: ChatTTSModules, config: EngineConfig, device: torch.device
) -> StreamingDecoder:
    """The Decoder + the configured vocoder, chunked as the server's flags say."""
    vocoder: Vocoder
    if config.vocoder == "hifigan":
        assert config.hifigan_checkpoint is not None
        vocoder = HiFiGANVocoder.from_checkpoint(config.hifigan_checkpoint, device=device)
    else:
        vocoder = VocosVocoder(modules.vocos)
    chunking = ChunkingConfig()
    overrides = {}
    if config.first_chunk_tokens:
        overrides["first_chunk_tokens"] = config.first_chunk_tokens
    if config.max_chunk_tokens:
        overrides["max_chunk_tokens"] = config.max_chunk_tokens
    if config.lookahead_tokens >= 0:
        overrides["lookahead_tokens"] = config.lookahead_tokens
    chunking = replace(chunking, **overrides)
    return StreamingDecoder(modules.decoder, vocoder, chunking, device)


def _chunking(default: ChunkingConfig, options: ChunkingOptions) -> ChunkingConfig:
    overrides = {k: v for k, v in vars(options).items() if v is not None}
    return replace(default, **overrides) if overrides else default


def _slot(seq: Sequence) -> int:
    assert seq.slot_id is not None, "a running sequence holds a slot"
    return seq.slot_id


class ModelLoadError(RuntimeError):
    """The model folder is missing, incomplete or fails verification."""


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ModelLoadError("--device cuda, but CUDA is not available")
    return torch.device(name)


def pick_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}[name]


def locate_model(config: ModelConfig) -> str:
    """The model folder to load: verified weights, or the dev model built on first use."""
    if config.model_dir is None:
        log.warning(
            "no --model-dir given: serving the RANDOM-WEIGHT '%s' dev model. Its audio is noise; "
            "point --model-dir at real ChatTTS weights for speech.",
            config.dev_model,
        )
        return str(build_dev_assets(config.dev_model, config.dev_model_cache))
    try:
        root = resolve_model_dir(config.model_dir)
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"--model-dir {config.model_dir}: {exc}") from None
    problems = verify_assets(root)
    if problems:
        listing = "; ".join(problems[:5])
        if not config.allow_unverified:
            raise ModelLoadError(
                f"--model-dir {root} does not match ChatTTS's published sha256 map ({listing}). "
                "Use official weights, or pass --allow-unverified to load them anyway."
            )
        log.warning("loading UNVERIFIED model files from %s: %s", root, listing)
    return str(root)


@dataclass
class StepOutput:
    """What one step produced for one sequence."""

    seq: Sequence
    audio: list[np.ndarray] = field(default_factory=list)
    """PCM chunks (float32, model rate) ready to send, in order."""
    num_new_tokens: int = 0
    finish_reason: str | None = None
    """Set when the utterance is complete: 'eos' or 'max_tokens'."""
    text: str = ""
    num_tokens: int = 0
    restart: tuple[int, int] | None = None
    """(prompt_len, max_new_tokens) of a second pass on the same slot (refine -> codes)."""
    codes: np.ndarray | None = None
    """(num_tokens, num_vq) audio codes of a finished utterance (for parity tests)."""
    error: Exception | None = None
    """This sequence failed on its own (the others in the step are unaffected)."""


@dataclass
class _SlotState:
    request: UtteranceRequest
    mode: str
    """'text' (refine pass, text head) or 'code' (audio codes)."""
    prompt: torch.Tensor
    """(L, D) prompt embeddings in the GPT dtype."""
    text: str
    next_embed: torch.Tensor | None = None
    """(D,) input embedding of the next decode step (the last sampled token)."""
    tokens: list[int] = field(default_factory=list)
    """Refine pass: text token ids sampled so far."""
    stream: DecodeStream | None = None
    """The streaming decoder's state for this utterance."""
    codes: list[list[int]] = field(default_factory=list)
    """Audio codes generated so far (num_vq each)."""


class ModelRunner:
    def __init__(
        self,
        modules: ChatTTSModules,
        config: EngineConfig,
        device: torch.device,
        dtype: torch.dtype,
    ) -> None:
        self.modules = modules
        self.config = config
        self.device = device
        self.dtype = dtype
        shapes = modules.shapes
        self.num_vq = shapes.embed.num_vq
        self.num_audio_tokens = shapes.embed.num_audio_tokens
        self.eos_code = shapes.eos_token_id
        self.speaker_dim = shapes.gpt.hidden_size
        self.sample_rate = shapes.vocos.sample_rate
        self.text_eos = modules.tokenizer.eos_token

        self.llama = LlamaDecoder.from_state_dict(
            modules.gpt_config, modules.gpt_state_dict, device, dtype
        )
        modules.gpt_state_dict.clear()
        self._check_kv_fits(config, device, dtype)
        self.cache = SlotKVCache(
            self.llama.shape, config.max_streams, config.max_tokens, device, dtype
        )
        log.info(
            "KV cache: %d slots x %d tokens, %.1f MiB (%s)",
            config.max_streams,
            config.max_tokens,
            self.cache.nbytes / 2**20,
            dtype,
        )
        with torch.inference_mode():
            embed: Any = modules.embed
            # Effective (weight-normed) head weights, computed once: (num_vq, V, D) and (V_text, D).
            self.head_code = torch.stack([h.weight.detach().float() for h in embed.head_code])
            self.head_text = embed.head_text.weight.detach().float()
            self.emb_code = torch.stack(
                [e.weight.detach().float() for e in embed.emb_code]
            )  # (num_vq, V, D)
            self.emb_text = embed.emb_text.weight.detach().float()  # (V_text, D)
        self.prompts = PromptBuilder(modules, device)
        self.code_sampler = SlotSampler(
            config.max_streams, self.num_vq, self.num_audio_tokens, self.eos_code, device
        )
        self.text_sampler = SlotSampler(
            config.max_streams, 1, self.head_text.shape[0], self.text_eos, device
        )
        self.decoder = build_streaming_decoder(modules, config, device)
        self._states: dict[str, _SlotState] = {}

    def _check_kv_fits(
        self, config: EngineConfig, device: torch.device, dtype: torch.dtype
    ) -> None:
        """On CUDA, size against the memory actually free after the weights are loaded: refuse
        a cache that cannot fit (with the slot count that would) rather than dying mid-serve."""
        if device.type != "cuda":
            return
        per_slot = SlotKVCache.bytes_per_slot(self.llama.shape, config.max_tokens, dtype)
        free_bytes, _ = torch.cuda.mem_get_info(device)
        # Leave a quarter of what is free for activations, the vocoder and the allocator.
        fits = int(0.75 * free_bytes) // per_slot
        log.info(
            "KV cache: %d slots requested, %d would fit in %.1f GiB free",
            config.max_streams,
            fits,
            free_bytes / 2**30,
        )
        if config.max_streams > fits:
            raise ModelLoadError(
                f"--max-streams {config.max_streams} x --max-tokens {config.max_tokens} needs "
                f"{config.max_streams * per_slot / 2**30:.1f} GiB of KV cache; {free_bytes / 2**30:.1f} GiB "
                f"is free, so at most {fits} slots fit"
            )

    @classmethod
    def load(cls, model_config: ModelConfig, engine_config: EngineConfig) -> ModelRunner:
        device = pick_device(model_config.device)
        dtype = pick_dtype(model_config.dtype, device)
        started = time.monotonic()
        model_dir = locate_model(model_config)
        modules = load_chattts(model_dir, device, dtype)
        log.info(
            "loaded ChatTTS from %s on %s/%s in %.1f s",
            model_dir,
            device,
            dtype,
            time.monotonic() - started,
        )
        return cls(modules, engine_config, device, dtype)

    # -- per request -------------------------------------------------------------------------

    def open(self, seq: Sequence, request: UtteranceRequest) -> int:
        """Build the first pass's prompt; returns its length. Raises InvalidRequestError."""
        text = self.prompts.normalize(request.text)
        if request.refine.enabled:
            prompt = self.prompts.refine_prompt(text, request.refine.prompt())
            state = _SlotState(request, "text", prompt.embeds.to(self.dtype), text)
            seq.max_new_tokens = REFINE_SAMPLING.max_new_tokens
        else:
            prompt = self.prompts.code_prompt(text, request.voice, request.speed)
            state = _SlotState(request, "code", prompt.embeds.to(self.dtype), text)
        prompt_len = int(state.prompt.shape[0])
        seq.max_new_tokens = self._fit(
            prompt_len, seq.max_new_tokens, request.sampling.min_new_tokens
        )
        self._states[seq.request_id] = state
        return prompt_len

    def _fit(self, prompt_len: int, max_new_tokens: int, min_new_tokens: int) -> int:
        """Clamp a pass's token budget to what is left of a KV slot after its prompt."""
        room = self.config.max_tokens - prompt_len
        if room < max(1, min_new_tokens):
            raise InvalidRequestError(
                "text",
                f"the prompt takes {prompt_len} of the {self.config.max_tokens} positions of a KV slot "
                f"(--max-tokens), leaving too few for {max(1, min_new_tokens)} audio tokens",
            )
        return min(max_new_tokens, room)

    def release(self, seq: Sequence) -> None:
        self._states.pop(seq.request_id, None)

    def _begin_pass(self, seq: Sequence, state: _SlotState) -> None:
        """Set up sampling (and audio streaming) when a pass's prefill completes."""
        assert seq.slot_id is not None
        r = state.request
        if state.mode == "code":
            s = r.sampling
            self.code_sampler.set_row(
                seq.slot_id,
                SamplingParams(
                    temperature=s.temperature,
                    top_p=s.top_p,
                    top_k=s.top_k,
                    repetition_penalty=s.repetition_penalty,
                    seed=s.seed,
                    min_new_tokens=s.min_new_tokens,
                    max_new_tokens=s.max_new_tokens,
                ),
            )
            state.stream = self.decoder.open(_chunking(self.decoder.default_config, r.chunking))
        else:
            self.text_sampler.set_row(seq.slot_id, replace(REFINE_SAMPLING, seed=r.sampling.seed))

    # -- one engine step ---------------------------------------------------------------------

    @torch.inference_mode()
    def step(self, plan: StepPlan) -> list[StepOutput]:
        rows: list[tuple[Sequence, torch.Tensor]] = []
        for chunk in plan.prefill:
            seq = chunk.seq
            state = self._states[seq.request_id]
            assert seq.slot_id is not None
            hidden = self.llama.prefill(
                seq.slot_id,
                state.prompt[chunk.start : chunk.start + chunk.length],
                chunk.start,
                self.cache,
            )
            seq.num_prefilled += chunk.length
            if chunk.completes_prompt:
                self._begin_pass(seq, state)
                rows.append((seq, hidden[-1]))
        if plan.decode:
            slot_ids = torch.tensor(
                [s.slot_id for s in plan.decode], dtype=torch.long, device=self.device
            )
            positions = torch.tensor(
                [s.input_position for s in plan.decode], dtype=torch.long, device=self.device
            )
            embeds = torch.stack([self._states[s.request_id].next_embed for s in plan.decode])  # type: ignore[misc]
            hidden = self.llama.decode(slot_ids, embeds.to(self.dtype), positions, self.cache)
            rows.extend(zip(plan.decode, hidden, strict=True))

        outputs: dict[str, StepOutput] = {}
        code_rows = [(s, h) for s, h in rows if self._states[s.request_id].mode == "code"]
        text_rows = [(s, h) for s, h in rows if self._states[s.request_id].mode == "text"]
        if code_rows:
            self._code_step(code_rows, outputs)
        if text_rows:
            self._text_step(text_rows, outputs)
        self._decode_audio(outputs)
        return list(outputs.values())

    def _code_step(
        self, rows: list[tuple[Sequence, torch.Tensor]], outputs: dict[str, StepOutput]
    ) -> None:
        seqs = [s for s, _ in rows]
        hidden = torch.stack([h for _, h in rows]).float()  # (B, D)
        logits = torch.einsum("bd,qvd->bqv", hidden, self.head_code)  # (B, num_vq, V)
        slots = [_slot(s) for s in seqs]
        codes = self.code_sampler.sample(slots, logits)  # (B, num_vq)
        # Next input: the sum of the codebooks' embeddings of the sampled codes, (B, D).
        codebooks = torch.arange(self.num_vq, device=self.device)
        next_embeds = self.emb_code[codebooks, codes].sum(1)
        code_rows = codes.tolist()
        kept: list[int] = []
        for i, seq in enumerate(seqs):
            state = self._states[seq.request_id]
            out = outputs.setdefault(seq.request_id, StepOutput(seq))
            seq.num_generated += 1
            if self.eos_code in code_rows[i]:
                self._finish_codes(seq, state, out, "eos")
                continue
            kept.append(i)
            out.num_new_tokens += 1
            state.codes.append(code_rows[i])
            assert state.stream is not None
            state.stream.push(hidden[i : i + 1])
            state.next_embed = next_embeds[i]
            if seq.num_generated >= seq.max_new_tokens:
                self._finish_codes(seq, state, out, "max_tokens")
        if kept:
            self.code_sampler.append([slots[i] for i in kept], codes[kept])

    def _finish_codes(self, seq: Sequence, state: _SlotState, out: StepOutput, reason: str) -> None:
        out.finish_reason = reason
        out.text = state.text
        out.num_tokens = len(state.codes)
        out.codes = np.asarray(state.codes, dtype=np.int64).reshape(-1, self.num_vq)

    def _text_step(
        self, rows: list[tuple[Sequence, torch.Tensor]], outputs: dict[str, StepOutput]
    ) -> None:
        seqs = [s for s, _ in rows]
        hidden = torch.stack([h for _, h in rows]).float()
        logits = (hidden @ self.head_text.T)[:, None, :]  # (B, 1, V_text)
        slots = [_slot(s) for s in seqs]
        tokens = self.text_sampler.sample(slots, logits)[:, 0]
        for i, seq in enumerate(seqs):
            state = self._states[seq.request_id]
            out = outputs.setdefault(seq.request_id, StepOutput(seq))
            seq.num_generated += 1
            token = int(tokens[i])
            if token != self.text_eos:
                state.tokens.append(token)
                self.text_sampler.append([slots[i]], tokens[i : i + 1, None])
                state.next_embed = self.emb_text[token]
            if token == self.text_eos or seq.num_generated >= seq.max_new_tokens:
                try:
                    self._start_code_pass(seq, state, out)
                except InvalidRequestError as exc:
                    out.error = exc

    def _start_code_pass(self, seq: Sequence, state: _SlotState, out: StepOutput) -> None:
        refined = self.prompts.refined_text(state.tokens) or state.text
        r = state.request
        prompt = self.prompts.code_prompt(refined, r.voice, r.speed)
        state.mode, state.text, state.tokens = "code", refined, []
        state.prompt = prompt.embeds.to(self.dtype)
        prompt_len = int(state.prompt.shape[0])
        out.restart = (
            prompt_len,
            self._fit(prompt_len, r.sampling.max_new_tokens, r.sampling.min_new_tokens),
        )

    def _decode_audio(self, outputs: dict[str, StepOutput]) -> None:
        """Run the streaming decoder for every stream that has a chunk ready (batched)."""
        owner: dict[int, str] = {}
        running: list[DecodeStream] = []
        finishing: list[DecodeStream] = []
        for rid, out in outputs.items():
            stream = self._states[rid].stream
            if stream is None:
                continue
            owner[id(stream)] = rid
            (finishing if out.finish_reason else running).append(stream)
        ready = self.decoder.step(running) if running else []
        done = self.decoder.finish(finishing) if finishing else []
        for stream, pcm in ready + done:
            if pcm.size:
                outputs[owner[id(stream)]].audio.append(pcm)

    # -- warm-up -----------------------------------------------------------------------------

    @torch.inference_mode()
    def warmup(self, batch_size: int) -> None:
        """Run every code path once before health reports SERVING: the prompt builder (its
        first call JIT-compiles ChatTTS's numba normalizer), prefill, decode at each batch size
        the scheduler will use (powers of two up to `batch_size`, and `batch_size`), the heads
        and sampling, and the streaming Decoder + vocoder."""
        started = time.monotonic()
        self.prompts.code_prompt(
            self.prompts.normalize("Warm up [uv_break] in 2 minutes, please!"), VoiceSpec(), 5
        )
        d = self.speaker_dim
        sizes = sorted(
            {batch_size} | {2**i for i in range(batch_size.bit_length()) if 2**i <= batch_size}
        )
        self.llama.prefill(
            0, torch.zeros(16, d, device=self.device, dtype=self.dtype), 0, self.cache
        )
        for size in sizes:
            slots = torch.arange(size, device=self.device)
            positions = torch.full((size,), 8, dtype=torch.long, device=self.device)
            hidden = self.llama.decode(
                slots,
                torch.zeros(size, d, device=self.device, dtype=self.dtype),
                positions,
                self.cache,
            )
            torch.einsum("bd,qvd->bqv", hidden.float(), self.head_code)
        stream = self.decoder.open()
        stream.push(torch.zeros(24, d, device=self.device))
        self.decoder.finish([stream])
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        log.info("warm-up (decode batches %s) took %.2f s", sizes, time.monotonic() - started)
