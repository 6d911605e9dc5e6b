"""The model runner: owns every tensor (weights, the slot KV cache, per-slot sampling and
decode state) and executes the scheduler's `SchedulerOutput` on the engine thread.

Per step, in the plan's order: drop released slots, flush the utterances that ended, build the
audio-code prompts of refine passes that ended, seat new requests' prompts in their slots, one
GPT forward over every prompt chunk and every decoding slot, the heads, per-row sampling, the
next input embeddings, and the streaming Decoder+vocoder for the slots whose next audio chunk
is ready. It reports what it did (`ModelOutput`); it never decides that a request stops.
"""

from __future__ import annotations

import enum
import logging
import time
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

import numpy as np
import torch

from ..config import EngineConfig, ModelConfig
from ..model.alignment_capture import AlignmentCapture, CaptureRow
from ..model.alignment_heads import MIN_SCORE, HeadId
from ..model.audio_constants import FRAMES_PER_TOKEN
from ..model.autotune_cache import AutotuneCache, tune_or_reuse, weights_digest
from ..model.compiled_decode import set_inductor_cache, tune_compiled
from ..model.cuda_graphs import DecodeGraphs, length_buckets
from ..model.errors import ModelLoadError
from ..model.hifigan import HiFiGANVocoder
from ..model.kv_cache import SlotKVCache
from ..model.llama import DecodeBatch, LlamaDecoder, PromptRun
from ..model.loader import ChatTTSModules, load_chattts, locate_model, pick_device, pick_dtype
from ..model.vocoders import Vocoder
from ..model.vocos import VocosVocoder
from ..text.attention_timing import ATTENTION, TokenAlignment
from ..text.spans import Traced
from ..text.timing import ESTIMATE
from .alignment import CALIBRATION_TEXT, calibrate_alignment_heads
from .chunking import BusyFirstChunk, ChunkingConfig
from .prompts import PromptBuilder, PromptText
from .slot_sampler import SlotSampler
from .step_io import (
    FinishedAudio,
    ModelOutput,
    PreparedPrompt,
    Sampled,
    SchedulerOutput,
)
from .streaming_decode import DecodeStream, StreamingDecoder
from .types import (
    REFINE_SAMPLING,
    ChunkingOptions,
    EngineError,
    InvalidRequestError,
    ModelInfo,
    SamplingParams,
    UtteranceRequest,
    VoiceSpec,
)

log = logging.getLogger(__name__)


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
    chunking = ChunkingConfig().with_options(
        ChunkingOptions(config.first_chunk_tokens, config.max_chunk_tokens, config.lookahead_tokens)
    )
    return StreamingDecoder(modules.decoder, vocoder, chunking, device)


class Phase(enum.Enum):
    REFINE = "refine"
    """ChatTTS's refine-text pass: the text head rewrites the sentence with prosody tags."""
    CODES = "codes"
    """Audio codes: the audio heads, with every hidden state streamed to the Decoder."""


def _pass_sampling(params: UtteranceRequest, phase: Phase) -> SamplingParams:
    """How a pass samples. The audio pass speaks at least one token: never a silent sentence
    (upstream regenerates instead); the refine pass keeps only the request's seed."""
    if phase is Phase.REFINE:
        return replace(REFINE_SAMPLING, seed=params.sampling.seed)
    return replace(params.sampling, min_new_tokens=max(1, params.sampling.min_new_tokens))


@dataclass
class _SlotState:
    """What the request in one slot (or waiting for one) asks and has made: the runner's
    share of a request (the scheduler keeps its slot, counters and budget)."""

    params: UtteranceRequest
    phase: Phase
    prompt: torch.Tensor
    """(L, D) prompt embeddings of the current pass, in the GPT dtype."""
    spoken: Traced
    """The text the pass reads (normalized; after refine, refined), traced to the caller's."""
    sampling: SamplingParams
    """The current pass's sampling (`_pass_sampling`)."""
    next_embed: torch.Tensor | None = None
    """(D,) input embedding of the next decode step (the last sampled token)."""
    text_tokens: list[int] = field(default_factory=list)
    """Refine pass: text token ids sampled so far."""
    stream: DecodeStream | None = None
    """Audio-code pass: the streaming decoder's state."""
    codes: list[list[int]] = field(default_factory=list)
    """Audio codes generated so far (num_vq each)."""
    prompt_text: PromptText | None = None
    """Audio-code pass: where its text lies in the prompt (for the alignment heads)."""
    alignment: list[int] = field(default_factory=list)
    """With alignment heads: per decode step of the audio pass, the text token attended to."""

    def token_alignment(self) -> TokenAlignment | None:
        """Which text token each audio code attends to. The decode row fed code j makes code
        j + 1: code 0 (sampled from the prompt) takes the first row's token."""
        if not self.alignment or self.prompt_text is None or not self.codes:
            return None
        path = [self.alignment[0], *self.alignment][: len(self.codes)]
        path += [path[-1]] * (len(self.codes) - len(path))
        return TokenAlignment(tuple(path), self.prompt_text.token_chars)


class _Row(NamedTuple):
    """One row that samples this step."""

    slot_id: int
    num_generated: int
    """Tokens its pass sampled before this one (the plan's count)."""
    hidden: torch.Tensor
    """(D,) its last hidden state."""


class ModelRunner:
    def __init__(
        self,
        modules: ChatTTSModules,
        config: EngineConfig,
        device: torch.device,
        dtype: torch.dtype,
        quantize: str = "none",
        decode_graphs: str = "off",
        autotune_cache: AutotuneCache | None = None,
        compile_step: str = "off",
        compile_budget_s: float = 300.0,
    ) -> None:
        """`decode_graphs`: 'cuda' captures the decode step as CUDA graphs at warm-up; 'eager'
        runs the same padded static-shape path without graphs (CPU tests); 'off' (the CPU
        default) decodes with dynamic shapes, fastest where no graph can be replayed.
        `autotune_cache`: where warm-up's linear-mode choice is reused from; None measures.
        `compile_step` ('off', 'auto', 'on') and `compile_budget_s`: whether warm-up compiles
        the CPU decode step (`model/compiled_decode.py`) and how long it may spend."""
        self.modules = modules
        self.config = config
        self.device = device
        self.dtype = dtype
        self.quantize = quantize
        self.compile_step, self.compile_budget_s = compile_step, compile_budget_s
        shapes = modules.shapes
        self.num_vq = shapes.embed.num_vq
        self.num_audio_tokens = shapes.embed.num_audio_tokens
        self.eos_code = shapes.eos_token_id
        self.text_eos = modules.tokenizer.eos_token

        self.llama = LlamaDecoder.from_state_dict(
            modules.gpt_config, modules.gpt_state_dict, device, dtype, quantize=quantize
        )
        self.autotune_cache = autotune_cache if len(self.llama.modes) > 1 else None
        self.warmup_cache = autotune_cache
        """Where warm-up answers are kept (autotune's table, the alignment heads); None: off."""
        self.weights_digest = (
            weights_digest(modules.gpt_state_dict) if self.warmup_cache is not None else ""
        )
        """Part of the warm-up cache's keys: which weights the answers were found with."""
        modules.gpt_state_dict.clear()
        self.cache = self._build_cache(config, device, with_scratch_slot=decode_graphs != "off")
        self.graphs = None if decode_graphs == "off" else self._build_graphs(decode_graphs)
        self.graphs_error = ""
        """Why the graphs asked for are not used: what their capture raised at warm-up."""
        self._load_heads(modules.embed)
        self.prompts = PromptBuilder(modules, device)
        self.code_sampler = SlotSampler(
            config.max_streams, self.num_vq, self.num_audio_tokens, self.eos_code, device
        )
        self.text_sampler = SlotSampler(
            config.max_streams, 1, self.head_text.shape[0], self.text_eos, device
        )
        self.audio = build_streaming_decoder(modules, config, device)
        """Hidden states to PCM: the ChatTTS Decoder and the vocoder, chunked per stream."""
        self.busy_first_chunk = BusyFirstChunk(
            config.busy_batch, config.busy_first_chunk_tokens, config.busy_lookahead_tokens
        )
        """A stream that starts while many slots are in use gets a shorter first chunk."""
        self._pending: dict[str, _SlotState] = {}
        """Prepared prompts of requests waiting for a slot, by request id."""
        self._slots: dict[int, _SlotState] = {}
        """State of the request in each occupied slot, by slot id."""
        self.alignment_heads: tuple[HeadId, ...] = ()
        """The heads whose attention times words (chosen at warm-up); (): the estimate."""

    def _build_cache(
        self, config: EngineConfig, device: torch.device, with_scratch_slot: bool
    ) -> SlotKVCache:
        """The preallocated KV cache, one slot per stream; graphs pad batches with rows that
        write to a scratch slot past the requests' slots."""
        self._check_kv_fits(config, device, self.llama.kv_dtype)
        num_slots = config.max_streams + with_scratch_slot
        cache = SlotKVCache(
            self.llama.shape, num_slots, config.max_tokens, device, self.llama.kv_dtype
        )
        log.info(
            "KV cache: %d slots x %d tokens, %.1f MiB (%s)",
            config.max_streams,
            config.max_tokens,
            cache.nbytes / 2**20,
            self.llama.kv_dtype,
        )
        return cache

    def _build_graphs(self, decode_graphs: str) -> DecodeGraphs:
        config = self.config
        return DecodeGraphs(
            lambda slots, embeds, positions, attend_len: self.llama.decode_static(
                slots, embeds, positions, self.cache, attend_len
            ),
            decode_batch_sizes(config.max_streams),
            length_buckets(config.max_tokens),
            self.llama.shape.hidden_size,
            scratch_slot=config.max_streams,
            device=self.device,
            dtype=self.dtype,
            capture=decode_graphs == "cuda",
        )

    @torch.inference_mode()
    def _load_heads(self, embed: Any) -> None:
        """The heads' effective (weight-normed) weights and the input embeddings, computed
        once in fp32: (num_vq, V, D) and (V_text, D)."""
        self.head_code = torch.stack([h.weight.detach().float() for h in embed.head_code])
        self.head_text = embed.head_text.weight.detach().float()
        self.emb_code = torch.stack([e.weight.detach().float() for e in embed.emb_code])
        self.emb_text = embed.emb_text.weight.detach().float()

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

    @property
    def info(self) -> ModelInfo:
        """What the loaded model is; the linear modes are final after `warmup`. The audio
        figures are the vocoder's in use (a HiFi-GAN checkpoint has its own rate and hop)."""
        vocoder = self.audio.vocoder
        config = self.config
        return ModelInfo(
            sample_rate=vocoder.sample_rate,
            samples_per_token=FRAMES_PER_TOKEN * vocoder.hop_length,
            speaker_dim=self.modules.shapes.gpt.hidden_size,
            num_vq=self.num_vq,
            num_audio_codes=self.num_audio_tokens,
            max_new_tokens=config.max_new_tokens,
            max_tokens=config.max_tokens,
            device=str(self.device),
            dtype=str(self.dtype).removeprefix("torch."),
            linear_modes=self.llama.mode_table,
            decode_graphs=(
                "off" if self.graphs is None else "cuda" if self.graphs.capture else "eager"
            ),
            decode_graphs_error=self.graphs_error,
            timing_source=ATTENTION if self.alignment_heads else ESTIMATE,
            chunking=ChunkingOptions(
                config.first_chunk_tokens, config.max_chunk_tokens, config.lookahead_tokens
            ),
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
        graphs = "cuda" if device.type == "cuda" and engine_config.cuda_graphs else "off"
        folder = model_config.autotune_folder()
        if model_config.compile != "off":
            set_inductor_cache(model_config.compile_folder())
        return cls(
            modules,
            engine_config,
            device,
            dtype,
            quantize=model_config.quantize,
            decode_graphs=graphs,
            autotune_cache=AutotuneCache(folder) if folder is not None else None,
            compile_step=model_config.compile,
            compile_budget_s=model_config.compile_budget_s,
        )

    # -- per request -------------------------------------------------------------------------

    def prepare(self, request_id: str, params: UtteranceRequest) -> PreparedPrompt:
        """Build the first pass's prompt and keep it until the request gets a slot.

        Raises InvalidRequestError (e.g. a malformed speaker embedding) or ValueError."""
        source = params.source if params.source is not None else Traced.source(params.text)
        spoken = self.prompts.normalize_traced(source)
        text = spoken.text
        if params.refine.enabled:
            prompt = self.prompts.refine_prompt(text, params.refine.prompt())
            phase = Phase.REFINE
        else:
            prompt = self.prompts.code_prompt(text, params.voice, params.speed)
            phase = Phase.CODES
        state = _SlotState(
            params, phase, prompt.embeds.to(self.dtype), spoken, _pass_sampling(params, phase)
        )
        state.prompt_text = prompt.text_tokens
        self._pending[request_id] = state
        return self._prepared(state)

    @staticmethod
    def _prepared(state: _SlotState) -> PreparedPrompt:
        s = state.sampling
        prompt_len = int(state.prompt.shape[0])
        final = state.phase is Phase.CODES
        return PreparedPrompt(
            prompt_len,
            s.max_new_tokens,
            s.min_new_tokens,
            final=final,
            spoken=state.spoken if final else None,
        )

    # -- one engine step ---------------------------------------------------------------------

    @torch.inference_mode()
    def execute(self, plan: SchedulerOutput) -> ModelOutput:
        """Do the whole plan (`SchedulerOutput`, in its field order)."""
        for slot_id in plan.released:
            self._slots.pop(slot_id, None)
        for request_id in plan.discarded:
            self._pending.pop(request_id, None)
        output = ModelOutput(finished=self._flush(plan.finished))
        for slot_id in plan.next_pass:
            self._start_code_pass(slot_id, output)
        for new in plan.new_slots:
            self._seat(new.slot_id, self._pending.pop(new.request_id))

        rows = self._finite_rows(self._forward(plan), output)
        code_rows = [r for r in rows if self._slots[r.slot_id].phase is Phase.CODES]
        text_rows = [r for r in rows if self._slots[r.slot_id].phase is Phase.REFINE]
        if code_rows:
            self._code_step(code_rows, output)
        if text_rows:
            self._text_step(text_rows, output)
        self._decode_audio([r.slot_id for r in code_rows], output)
        return output

    def _flush(self, slot_ids: list[int]) -> dict[int, FinishedAudio]:
        """End the utterances in `slot_ids`: flush their decoders (batched), drop their state."""
        if not slot_ids:
            return {}
        states = {slot_id: self._slots.pop(slot_id) for slot_id in slot_ids}
        tails = self.audio.finish(
            {slot_id: s.stream for slot_id, s in states.items() if s.stream is not None}
        )
        empty = np.zeros(0, dtype=np.float32)
        return {
            slot_id: FinishedAudio(
                pcm=tails.get(slot_id, empty),
                text=state.spoken.text,
                codes=np.asarray(state.codes, dtype=np.int64).reshape(-1, self.num_vq),
                spoken=state.spoken,
                alignment=state.token_alignment(),
            )
            for slot_id, state in states.items()
        }

    def _start_code_pass(self, slot_id: int, output: ModelOutput) -> None:
        """After the refine pass: the audio-code prompt from the refined text, on the same slot
        (into `output.prepared`), or the request's failure (into `output.failed`)."""
        state = self._slots[slot_id]
        refined = self.prompts.refined_text(state.text_tokens) or state.spoken.text
        p = state.params
        try:
            prompt = self.prompts.code_prompt(refined, p.voice, p.speed)
        except InvalidRequestError as exc:
            output.failed[slot_id] = exc
            return
        except Exception:
            log.exception("slot %d: the audio-code prompt failed", slot_id)
            output.failed[slot_id] = EngineError("could not prepare the audio-code prompt")
            return
        state.phase, state.text_tokens = Phase.CODES, []
        state.spoken = state.spoken.rewrite(refined)
        state.prompt = prompt.embeds.to(self.dtype)
        state.prompt_text = prompt.text_tokens
        state.sampling = _pass_sampling(p, Phase.CODES)
        self._seat(slot_id, state)
        output.prepared[slot_id] = self._prepared(state)

    def _seat(self, slot_id: int, state: _SlotState) -> None:
        """A pass's prompt takes its slot: the slot's sampler row, and for the audio pass the
        stream that turns its hidden states into audio."""
        self._slots[slot_id] = state
        if state.phase is Phase.CODES:
            self.code_sampler.set_row(slot_id, state.sampling)
            state.stream = self.audio.open(
                self.audio.default_config.with_options(state.params.chunking)
            )
        else:
            self.text_sampler.set_row(slot_id, state.sampling)

    def _forward(self, plan: SchedulerOutput) -> list[_Row]:
        """The step's GPT work in one forward: every prompt chunk and the decode batch share
        the weight reads, so new prompts never queue behind each other or behind decoding
        (with CUDA graphs the decode batch replays its graph apart). Returns the rows that
        sample: prompts completed this step (their pass's first token), then the decode rows."""
        if not (plan.prefill or plan.decode):
            return []
        prompts = [
            PromptRun(
                c.slot_id, self._slots[c.slot_id].prompt[c.start : c.start + c.length], c.start
            )
            for c in plan.prefill
        ]
        decode = self._decode_batch(plan) if plan.decode else None
        decode_hidden: torch.Tensor | None
        if self.graphs is not None and decode is not None:
            prompt_hidden, _ = self.llama.forward_batch(prompts, None, self.cache)
            max_position = max(r.position for r in plan.decode)
            decode_hidden = self.graphs(
                decode.slot_ids, decode.embeds, decode.positions, max_position
            )
        else:
            capture = self._alignment_capture(plan)
            prompt_hidden, decode_hidden = self.llama.forward_batch(
                prompts, decode, self.cache, capture=capture
            )
            if capture is not None:
                self._keep_alignment(plan, capture)
        rows = [
            _Row(chunk.slot_id, 0, hidden[-1])
            for chunk, hidden in zip(plan.prefill, prompt_hidden, strict=True)
            if chunk.completes_prompt
        ]
        if decode_hidden is not None:
            rows += [
                _Row(r.slot_id, r.num_generated, h)
                for r, h in zip(plan.decode, decode_hidden, strict=True)
            ]
        return rows

    def _alignment_capture(self, plan: SchedulerOutput) -> AlignmentCapture | None:
        """With alignment heads, the audio pass's decode rows over their text; else None (the
        forward computes nothing extra)."""
        if not self.alignment_heads:
            return None
        rows = []
        for i, r in enumerate(plan.decode):
            state = self._slots[r.slot_id]
            if state.phase is Phase.CODES and state.prompt_text is not None:
                rows.append(CaptureRow(i, r.slot_id, *state.prompt_text.positions))
        if not rows:
            return None
        return AlignmentCapture(self.alignment_heads, rows, self.cache, self.llama.shape)

    def _keep_alignment(self, plan: SchedulerOutput, capture: AlignmentCapture) -> None:
        """Each captured row's text token: the argmax of its heads' weights averaged."""
        rows = [r.row for r in capture.rows]
        weights = torch.stack([capture.row_weights(r).mean(0) for r in rows])
        for r, token in zip(rows, weights.argmax(dim=1).tolist(), strict=True):
            self._slots[plan.decode[r].slot_id].alignment.append(int(token))

    def _decode_batch(self, plan: SchedulerOutput) -> DecodeBatch:
        embeds = []
        for row in plan.decode:
            embed = self._slots[row.slot_id].next_embed
            assert embed is not None, "a decoding slot has sampled a token"
            embeds.append(embed)
        return DecodeBatch(
            torch.tensor([r.slot_id for r in plan.decode], dtype=torch.long, device=self.device),
            torch.stack(embeds).to(self.dtype),
            torch.tensor([r.position for r in plan.decode], dtype=torch.long, device=self.device),
        )

    @staticmethod
    def _finite_rows(rows: list[_Row], output: ModelOutput) -> list[_Row]:
        """Rows whose hidden state is finite; a NaN or inf (a broken prompt or speaker, an
        overflow in half precision) fails that request alone, not the step."""
        if not rows:
            return rows
        finite = torch.isfinite(torch.stack([r.hidden for r in rows])).all(dim=1).tolist()
        for row, ok in zip(rows, finite, strict=True):
            if not ok:
                log.error("slot %d: the model produced a non-finite hidden state", row.slot_id)
                output.failed[row.slot_id] = EngineError(
                    "the model produced a non-finite hidden state"
                )
        return [row for row, ok in zip(rows, finite, strict=True) if ok]

    def _code_step(self, rows: list[_Row], output: ModelOutput) -> None:
        slots, counts = [r.slot_id for r in rows], [r.num_generated for r in rows]
        hidden = torch.stack([r.hidden for r in rows]).float()  # (B, D)
        logits = torch.einsum("bd,qvd->bqv", hidden, self.head_code)  # (B, num_vq, V)
        codes = self.code_sampler.sample(slots, logits, counts)  # (B, num_vq)
        # Next input: the sum of the codebooks' embeddings of the sampled codes, (B, D).
        codebooks = torch.arange(self.num_vq, device=self.device)
        next_embeds = self.emb_code[codebooks, codes].sum(1)
        code_rows = codes.tolist()
        kept: list[int] = []
        for i, slot_id in enumerate(slots):
            is_end = self.eos_code in code_rows[i]
            output.sampled.append(Sampled(slot_id, is_end))
            if is_end:
                continue
            kept.append(i)
            state = self._slots[slot_id]
            state.codes.append(code_rows[i])
            assert state.stream is not None
            state.stream.push(hidden[i : i + 1])
            state.next_embed = next_embeds[i]
        if kept:
            self.code_sampler.append(
                [slots[i] for i in kept], codes[kept], [counts[i] for i in kept]
            )

    def _text_step(self, rows: list[_Row], output: ModelOutput) -> None:
        slots, counts = [r.slot_id for r in rows], [r.num_generated for r in rows]
        hidden = torch.stack([r.hidden for r in rows]).float()
        logits = (hidden @ self.head_text.T)[:, None, :]  # (B, 1, V_text)
        tokens = self.text_sampler.sample(slots, logits, counts)[:, 0]
        for i, slot_id in enumerate(slots):
            token = int(tokens[i])
            is_end = token == self.text_eos
            output.sampled.append(Sampled(slot_id, is_end))
            if not is_end:
                state = self._slots[slot_id]
                state.text_tokens.append(token)
                self.text_sampler.append([slot_id], tokens[i : i + 1, None], [counts[i]])
                state.next_embed = self.emb_text[token]

    def _decode_audio(self, slot_ids: list[int], output: ModelOutput) -> None:
        """Run the streaming decoder for every stream that has a chunk ready (batched)."""
        self._shorten_first_chunks(slot_ids)
        streams = {s: stream for s in slot_ids if (stream := self._slots[s].stream) is not None}
        for slot_id, pcm in self.audio.step(streams).items():
            if pcm.size:
                output.audio.setdefault(slot_id, []).append(pcm)

    def _shorten_first_chunks(self, slot_ids: list[int]) -> None:
        """At a large decode batch (`BusyFirstChunk`), streams that have decoded no chunk yet
        take the shorter first chunk: decided per step, on the batch the step ran, so a stream
        that started alone and was joined by a burst before its first chunk shortens too."""
        batch = len(slot_ids)
        if not self.busy_first_chunk.applies(batch):
            return
        for slot_id in slot_ids:
            state = self._slots[slot_id]
            stream = state.stream
            if stream is None or stream.num_chunks:
                continue
            config = self.busy_first_chunk.apply(stream.config, batch, state.params.chunking)
            if config != stream.config:
                state.stream = self.audio.reschedule(stream, config)

    # -- warm-up -----------------------------------------------------------------------------

    @torch.inference_mode()
    def warmup(self, batch_size: int) -> None:
        """Run every code path once before health reports SERVING: the prompt builder (its
        first call JIT-compiles ChatTTS's numba normalizer), prefill, decode at each batch size
        the scheduler will use (powers of two up to `batch_size`, and `batch_size`), the heads
        and sampling, and the streaming Decoder + vocoder."""
        started = time.monotonic()
        probe = self.prompts.code_prompt(
            self.prompts.normalize("Warm up [uv_break] in 2 minutes, please!"), VoiceSpec(), 5
        )
        d = self.llama.shape.hidden_size
        sizes = decode_batch_sizes(batch_size)
        # Which linear mode is fastest for each batch size, timed on this machine (a kernel
        # that wins on one CPU loses on another); lossy modes only within the quality budget.
        # The answer is kept per machine, weights and torch version: a restart reuses it.
        tune_or_reuse(
            self.llama,
            sizes,
            self.cache,
            probe.embeds.to(self.dtype),
            self.autotune_cache,
            self.weights_digest,
        )
        # The decode step as one compiled graph where that measured faster (CPU; bounded).
        tune_compiled(self.llama, sizes, self.cache, self.compile_step, self.compile_budget_s)
        if self.graphs is not None:
            try:
                self.graphs.capture_all()  # after autotune: each graph bakes in its size's mode
            except Exception as exc:  # noqa: BLE001 - graphs only speed decoding up
                self._drop_graphs(exc)
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
        stream = self.audio.open()
        stream.push(torch.zeros(24, d, device=self.device))
        self.audio.finish({0: stream})
        self.alignment_heads = self._calibrate_alignment()
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        log.info("warm-up (decode batches %s) took %.2f s", sizes, time.monotonic() - started)

    def _calibrate_alignment(self) -> tuple[HeadId, ...]:
        """The alignment heads, from one calibration sentence (`engine/alignment.py`); none
        with CUDA graphs (their replayed decode cannot capture attention)."""
        if self.graphs is not None:
            log.info("alignment heads: not calibrated (CUDA graphs replay the decode step)")
            return ()
        store = self.warmup_cache.with_prefix("alignment") if self.warmup_cache else None
        key = {
            "format": 1,
            "gpt": self.weights_digest,
            "embed": weights_digest(self.modules.embed.state_dict()),
            "device": self.device.type,
            "dtype": str(self.dtype),
            "kv_dtype": str(self.llama.kv_dtype),
            "calibration": CALIBRATION_TEXT,
            "min_score": MIN_SCORE,
        }
        cached = store.load_json(key) if store is not None else None
        if store is not None and isinstance(cached, list):
            heads = tuple((int(layer), int(head)) for layer, head in cached)
            source = "attention, heads " + str(heads) if heads else "estimate"
            log.info("word timing: source %s (reused %s)", source, store.path_for(key))
            return heads
        heads = calibrate_alignment_heads(
            self.llama,
            self.cache,
            self.prompts,
            lambda hidden: self._greedy_code_embed(hidden),
            self.info.sample_rate / self.info.samples_per_token,
        )
        if store is not None:
            store.store_json(key, [list(head) for head in heads])
        return heads

    def _greedy_code_embed(self, hidden: torch.Tensor) -> torch.Tensor:
        """(D,) hidden -> (D,) the next input: the embedding of each codebook's likeliest code."""
        logits = torch.einsum("d,qvd->qv", hidden.float(), self.head_code)
        codes = logits.argmax(dim=-1)
        codebooks = torch.arange(self.num_vq, device=self.device)
        return self.emb_code[codebooks, codes].sum(0)

    def _drop_graphs(self, exc: Exception) -> None:
        """A capture failed (driver, memory, an op that cannot be captured): serve with the
        eager decode rather than not at all, and say so (log, ModelInfo, health metadata)."""
        first_line = str(exc).strip().split("\n", 1)[0]
        self.graphs_error = f"{type(exc).__name__}: {first_line}"[:300]
        log.warning(
            "CUDA graph capture failed at warm-up (%s); the decode step runs eagerly",
            self.graphs_error,
            exc_info=True,
        )
        self.graphs = None  # frees the captured graphs, their pool and static buffers
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


def decode_batch_sizes(max_batch: int) -> list[int]:
    """The decode batch sizes warm-up prepares for: powers of two up to `max_batch`, and it."""
    return sorted({max_batch} | {2**i for i in range(max_batch.bit_length()) if 2**i <= max_batch})
