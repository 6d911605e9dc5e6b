"""The model runner: executes the scheduler's `SchedulerOutput` on the engine thread. It owns the
tensors of a step (the GPT behind `GPTModel`, the heads, per-slot sampling and decode state) and
knows requests only as the `PassState` of each slot.

Per step, in the plan's order: drop released slots, flush the utterances that ended, build the
audio-code prompts of refine passes that ended, seat new requests' passes in their slots, one
GPT forward over every prompt chunk and every decoding slot, the heads, per-row sampling, the
next input embeddings, and the streaming Decoder+vocoder for the slots whose next audio chunk
is ready. It reports what it did (`ModelOutput`); it never decides that a request stops.
`ModelRunner.load` loads the assets, has `engine/gpt_build.py` build the GPT that serves and
makes the runner from it; `warmup` (`engine/warmup.py`) runs every path once.
"""

from __future__ import annotations

import logging
import time
from typing import NamedTuple, cast

import numpy as np
import torch

from ..audio_constants import FRAMES_PER_TOKEN
from ..config import EngineConfig
from ..config_model import ModelConfig
from ..devmodel import dev_model_dir
from ..errors import EngineError, InvalidRequestError
from ..model import hub
from ..model.hifigan import HiFiGANVocoder
from ..model.llama import DecodeBatch, PromptRun
from ..model.loader import (
    ChatTTSModules,
    load_chattts,
    pick_device,
    pick_dtype,
    verified_model_dir,
)
from ..model.vocoders import Vocoder
from ..model.vocos import VocosVocoder
from ..text.spans import Traced
from ..timing.alignment import attended_tokens, timing_source, utterance_alignment
from ..timing.types import CaptureRequest, CaptureRow, HeadId
from .chunking import ChunkSchedule
from .gpt import GPTModel
from .gpt_build import GPTSettings, build_gpt
from .heads import Heads
from .llamacpp_gpt import LlamaCppGPT
from .passes import PassState, Phase, pass_sampling
from .prompts import PromptBuilder
from .protocol import ModelInfo
from .slot_sampler import SlotSampler
from .step_io import FinishedAudio, ModelOutput, PreparedPrompt, Sampled, SchedulerOutput
from .streaming_decode import StreamingDecoder
from .utterance import UtteranceRequest
from .warmup import warm_up

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
    return StreamingDecoder(modules.decoder, vocoder, ChunkSchedule.from_config(config), device)


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
        gpt: GPTModel,
        device: torch.device,
        dtype: torch.dtype,
        prompts: PromptBuilder | None = None,
        heads: Heads | None = None,
    ) -> None:
        """`gpt`: the GPT finished (`engine/gpt_build.build_gpt`, or a `TorchGPT` a test
        builds); `dtype` its input embeddings' dtype. `prompts` and `heads` are made from
        `modules` unless given (`load` made them for the GPT's probes)."""
        self.modules = modules
        self.config = config
        self.device = device
        self.dtype = dtype
        self.num_vq = modules.shapes.embed.num_vq
        self.eos_code = modules.shapes.eos_token_id
        self.text_eos = modules.tokenizer.eos_token
        self.gpt = gpt
        self.heads = heads or Heads.from_embed(modules.embed)
        self.prompts = prompts or PromptBuilder(modules, device)
        num_codes = modules.shapes.embed.num_audio_tokens
        self.code_sampler = SlotSampler(
            config.max_streams, self.num_vq, num_codes, self.eos_code, device
        )
        self.text_sampler = SlotSampler(
            config.max_streams, 1, self.heads.text.shape[0], self.text_eos, device
        )
        self.audio = build_streaming_decoder(modules, config, device)
        """Hidden states to PCM: the ChatTTS Decoder and the vocoder, chunked per stream."""
        self._slots: dict[int, PassState] = {}
        """The pass in each occupied slot, by slot id."""

    @property
    def alignment_heads(self) -> tuple[HeadId, ...]:
        """The heads whose attention times words; (): the estimate."""
        return self.gpt.alignment_heads

    @property
    def info(self) -> ModelInfo:
        """What the loaded model is. The audio figures are the vocoder's in use (a HiFi-GAN
        checkpoint has its own rate and hop)."""
        vocoder = self.audio.vocoder
        return ModelInfo(
            sample_rate=vocoder.sample_rate,
            samples_per_token=FRAMES_PER_TOKEN * vocoder.hop_length,
            speaker_dim=self.modules.shapes.gpt.hidden_size,
            num_vq=self.num_vq,
            num_audio_codes=self.modules.shapes.embed.num_audio_tokens,
            max_new_tokens=self.config.max_new_tokens,
            max_tokens=self.config.max_tokens,
            device=str(self.device),
            dtype=str(self.dtype).removeprefix("torch."),
            chunking=self.audio.default_config.options(),
            backend=self.gpt.name,
            decode_graphs=self.gpt.decode_graphs,
            decode_graphs_error=self.gpt.graphs_error,
            timing_source=timing_source(self.alignment_heads),
        )

    @classmethod
    def load(cls, model_config: ModelConfig, engine_config: EngineConfig) -> ModelRunner:
        device = pick_device(model_config.device)
        dtype = pick_dtype(model_config.dtype, device)
        started = time.monotonic()
        if model_config.model is not None:  # main fetches it first; a config built in code not
            model_config = hub.resolved(model_config)
        dev = model_config.model_dir is None
        model_dir = dev_model_dir(model_config) if dev else verified_model_dir(model_config)
        modules = load_chattts(model_dir, device, dtype)
        elapsed_s = time.monotonic() - started
        log.info("loaded ChatTTS from %s on %s/%s in %.1f s", model_dir, device, dtype, elapsed_s)
        prompts, heads = PromptBuilder(modules, device), Heads.from_embed(modules.embed)
        settings = GPTSettings.from_config(model_config, engine_config)
        gpt = build_gpt(modules, engine_config, settings, device, dtype, prompts, heads)
        # The heads serve from `heads` (weight-normed once); ChatTTS's own copies (72 MiB at
        # the official shapes, the text head's weight_v and weight_g) would only sit in memory.
        modules.embed.head_text = modules.embed.head_code = None
        return cls(modules, engine_config, gpt, device, dtype, prompts, heads)

    def set_gpt_threads(self, threads: int) -> None:
        """The thread governor's count, for a backend with a pool of its own (llama.cpp)."""
        if isinstance(self.gpt, LlamaCppGPT):
            self.gpt.set_threads(threads)

    def warmup(self, batch_size: int) -> None:
        """Every code path once (`engine/warmup.py`)."""
        warm_up(self, batch_size)

    # -- per request -------------------------------------------------------------------------

    def prepare(self, request_id: str, params: UtteranceRequest) -> PreparedPrompt:
        """Build the first pass (its prompt) for the scheduler to hold until the request gets a
        slot; `NewSlot.state` brings it back. Raises InvalidRequestError (e.g. a malformed
        speaker embedding) or ValueError."""
        source = params.source if params.source is not None else Traced.source(params.text)
        spoken = self.prompts.normalize_traced(source)
        text = spoken.text
        if params.refine.enabled:
            prompt = self.prompts.refine_prompt(text, params.refine.prompt())
            phase = Phase.REFINE
        else:
            prompt = self.prompts.code_prompt(text, params.voice, params.speed)
            phase = Phase.CODES
        state = PassState(
            params, phase, prompt.embeds.to(self.dtype), spoken, pass_sampling(params, phase)
        )
        state.prompt_text = prompt.text_tokens
        return state.prepared()

    # -- one engine step ---------------------------------------------------------------------

    @torch.inference_mode()
    def execute(self, plan: SchedulerOutput) -> ModelOutput:
        """Do the whole plan (`SchedulerOutput`, in its field order)."""
        for slot_id in plan.released:
            self._end(slot_id)
        output = ModelOutput(flushed=self._flush(plan.slots_to_flush))
        for slot_id in plan.next_pass:
            self._start_code_pass(slot_id, output)
        for new in plan.new_slots:
            self._seat(new.slot_id, cast(PassState, new.state))

        rows = self._finite_rows(self._forward(plan), output)
        code_rows = [r for r in rows if self._slots[r.slot_id].phase is Phase.CODES]
        text_rows = [r for r in rows if self._slots[r.slot_id].phase is Phase.REFINE]
        if code_rows:
            self._code_step(code_rows, output)
        if text_rows:
            self._text_step(text_rows, output)
        self._decode_audio([r.slot_id for r in code_rows], output)
        return output

    def _end(self, slot_id: int) -> PassState | None:
        """The slot's pass is over (flushed, cancelled or failed): drop its state."""
        self.gpt.free_slot(slot_id)
        return self._slots.pop(slot_id, None)

    def _flush(self, slot_ids: list[int]) -> dict[int, FinishedAudio]:
        """End the utterances in `slot_ids`: flush their decoders (batched), drop their state."""
        if not slot_ids:
            return {}
        states = {slot_id: cast(PassState, self._end(slot_id)) for slot_id in slot_ids}
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
                alignment=utterance_alignment(state.alignment, len(state.codes), state.prompt_text),
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
        state.sampling = pass_sampling(p, Phase.CODES)
        self._seat(slot_id, state)
        output.prepared[slot_id] = state.prepared()

    def _seat(self, slot_id: int, state: PassState) -> None:
        """A pass takes its slot: the slot's sampler row, and for the audio pass the stream
        that turns its hidden states into audio."""
        self._slots[slot_id] = state
        self.gpt.free_slot(slot_id)  # the pass's prompt starts at position 0
        if state.phase is Phase.CODES:
            self.code_sampler.set_row(slot_id, state.sampling)
            state.stream = self.audio.open(
                self.audio.default_config.with_options(state.params.chunking)
            )
        else:
            self.text_sampler.set_row(slot_id, state.sampling)

    def _forward(self, plan: SchedulerOutput) -> list[_Row]:
        """The step's GPT work in one forward. Returns the rows that sample: prompts completed
        this step (their pass's first token), then the decode rows."""
        if not (plan.prefill or plan.decode):
            return []
        prompts = [
            PromptRun(
                c.slot_id, self._slots[c.slot_id].prompt[c.start : c.start + c.length], c.start
            )
            for c in plan.prefill
        ]
        decode = self._decode_batch(plan) if plan.decode else None
        prompt_last, decode_hidden, capture = self.gpt.forward(
            prompts, decode, self._alignment_rows(plan)
        )
        if capture is not None:
            for row, token in attended_tokens(capture):
                self._slots[plan.decode[row].slot_id].alignment.append(token)
        rows = [
            _Row(chunk.slot_id, 0, last)
            for chunk, last in zip(plan.prefill, prompt_last, strict=True)
            if chunk.completes_prompt
        ]
        if decode_hidden is not None:
            rows += [
                _Row(r.slot_id, r.num_generated, h)
                for r, h in zip(plan.decode, decode_hidden, strict=True)
            ]
        return rows

    def _alignment_rows(self, plan: SchedulerOutput) -> CaptureRequest | None:
        """With alignment heads, the decode rows of audio passes whose stream wants word timing,
        over their text; else None (the forward computes nothing extra)."""
        if not self.alignment_heads:
            return None
        rows = []
        for i, r in enumerate(plan.decode):
            state = self._slots[r.slot_id]
            wanted = state.params.word_timing and state.phase is Phase.CODES
            if wanted and state.prompt_text is not None:
                rows.append(CaptureRow(i, r.slot_id, *state.prompt_text.positions))
        return (self.alignment_heads, rows) if rows else None

    def _decode_batch(self, plan: SchedulerOutput) -> DecodeBatch:
        embeds = []
        for row in plan.decode:
            embed = self._slots[row.slot_id].next_embed
            assert embed is not None, "a decoding slot has sampled a token"
            embeds.append(embed)
        positions = [r.position for r in plan.decode]
        return DecodeBatch(
            torch.tensor([r.slot_id for r in plan.decode], dtype=torch.long, device=self.device),
            torch.stack(embeds).to(self.dtype),
            torch.tensor(positions, dtype=torch.long, device=self.device),
            max_position=max(positions),
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
        codes = self.code_sampler.sample(slots, self.heads.code_logits(hidden), counts)
        next_embeds = self.heads.code_embeds(codes)  # (B, D)
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
        logits = (hidden @ self.heads.text.T)[:, None, :]  # (B, 1, V_text)
        tokens = self.text_sampler.sample(slots, logits, counts)[:, 0]
        for i, slot_id in enumerate(slots):
            token = int(tokens[i])
            is_end = token == self.text_eos
            output.sampled.append(Sampled(slot_id, is_end))
            if not is_end:
                state = self._slots[slot_id]
                state.text_tokens.append(token)
                self.text_sampler.append([slot_id], tokens[i : i + 1, None], [counts[i]])
                state.next_embed = self.heads.emb_text[token]

    def _decode_audio(self, slot_ids: list[int], output: ModelOutput) -> None:
        """Run the streaming decoder for every stream that has a chunk ready (batched)."""
        streams = {s: stream for s in slot_ids if (stream := self._slots[s].stream) is not None}
        for slot_id, pcm in self.audio.step(streams).items():
            if pcm.size:
                output.audio.setdefault(slot_id, []).append(pcm)
