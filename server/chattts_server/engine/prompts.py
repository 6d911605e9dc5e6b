"""Prompt construction for ChatTTS's two GPT passes, exactly as upstream `Chat._infer` builds them.

Audio codes:  `[Stts][spk_emb]{text with [speed_N]}[Ptts]` (or `[empty_spk]`), speaker embedding
              written over the `[spk_emb]` position.
Refine text:  `[Sbreak]{text}[Pbreak][oral_N][laugh_N][break_N]`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ..errors import InvalidRequestError
from ..model.loader import ChatTTSModules
from ..text.normalize import TextNormalizer
from ..text.spans import Traced
from ..timing.types import PromptText
from .utterance import VoiceKind, VoiceSpec

DEFAULT_VOICE_SEED = 2
"""The speaker used when a request names none, so every sentence of a stream sounds alike."""


@dataclass
class Prompt:
    embeds: torch.Tensor
    """(L, D) float32 prompt embeddings, speaker applied."""
    text: str
    """The text the prompt speaks (normalized)."""
    text_tokens: PromptText | None = None
    """Audio-code prompts: where `text`'s tokens are."""


def prompt_text(tokenizer: Any, decorated: str, text: str) -> PromptText | None:
    """The tokens of `text` in `decorated` (its audio-code prompt: `text` stripped, just before
    `[Ptts]`), by the fast tokenizer's character offsets; None if they cannot be found."""
    stripped = text.strip()
    at = decorated.rfind(stripped + "[Ptts]")
    if not stripped or at < 0:
        return None
    shift = text.index(stripped) - at
    offsets = tokenizer(decorated, add_special_tokens=False, return_offsets_mapping=True)[
        "offset_mapping"
    ]
    inside = [
        (i, (a + shift, b + shift))
        for i, (a, b) in enumerate(offsets)
        if a >= at and b <= at + len(stripped) and b > a
    ]
    if not inside or inside[-1][0] - inside[0][0] + 1 != len(inside):
        return None
    return PromptText(inside[0][0], tuple(chars for _, chars in inside))


class PromptBuilder:
    def __init__(self, modules: ChatTTSModules, device: torch.device) -> None:
        self.m = modules
        self.device = device
        self.num_vq = modules.shapes.embed.num_vq
        # Numbers, units and symbols spelled out before ChatTTS's own normalizer, which would
        # drop every digit (text/normalize.py); loaded now, not on the first request.
        self.spell = TextNormalizer()
        self.spell.warm_up()
        self._transcripts: dict[str, str] = {}
        self._speaker_cache: dict[tuple[str, int, str], torch.Tensor] = {}
        self._reference_cache: dict[str, torch.Tensor] = {}

    def normalize(self, text: str, field_name: str = "text") -> str:
        return self.normalize_traced(Traced.source(text), field_name).text

    def normalize_traced(self, text: Traced, field_name: str = "text") -> Traced:
        """`normalize`, each spoken character traced to the characters of `text` it came from
        (an `Utterance` from text/stream.py: to the stream's text; text/words.py)."""
        normalized = self.spell.spoken(text, self.m.normalizer)
        if not normalized.text.strip():
            raise InvalidRequestError(field_name, "nothing speakable is left after normalization")
        return normalized

    def transcript(self, voice: VoiceSpec) -> str:
        """A reference clip's transcript, normalized like the text it prompts."""
        cached = self._transcripts.get(voice.transcript)
        if cached is None:
            cached = self.normalize(voice.transcript, "config.voice.reference.transcript")
            if len(self._transcripts) > 64:
                self._transcripts.clear()
            self._transcripts[voice.transcript] = cached
        return cached

    def reference_codes(self, voice: VoiceSpec) -> torch.Tensor:
        """(num_vq, T) DVAE codes of a reference clip, as `Chat.sample_audio_speaker` makes them."""
        cached = self._reference_cache.get(voice.reference_id)
        if cached is None:
            wav = torch.frombuffer(bytearray(voice.reference_pcm), dtype=torch.float32)
            dvae: Any = self.m.dvae
            cached = dvae.sample_audio(wav.to(self.device)).to(torch.int32).cpu()
            if len(self._reference_cache) > 64:
                self._reference_cache.clear()
            self._reference_cache[voice.reference_id] = cached
        return cached

    def speaker(self, voice: VoiceSpec) -> torch.Tensor:
        """(D,) float16 speaker embedding, as ChatTTS's Speaker would produce it."""
        kind = voice.kind if voice.kind is not VoiceKind.DEFAULT else VoiceKind.SEED
        seed = voice.seed if voice.kind is VoiceKind.SEED else DEFAULT_VOICE_SEED
        key = (kind.value, seed, voice.embedding)
        cached = self._speaker_cache.get(key)
        if cached is not None:
            return cached
        speaker = self.m.speaker
        if kind is VoiceKind.EMBEDDING:
            values = torch.from_numpy(speaker._decode(voice.embedding))
            if values.numel() != self.m.shapes.gpt.hidden_size:
                raise InvalidRequestError(
                    "config.voice.speaker_embedding", "has the wrong size for this model"
                )
        else:
            # Same draw as `torch.manual_seed(seed); chat.sample_random_speaker()`, without
            # touching the global RNG.
            generator = torch.Generator(device="cpu").manual_seed(seed)
            std, mean = speaker.std.cpu(), speaker.mean.cpu()
            values = (
                torch.randn(std.shape, generator=generator, dtype=std.dtype).mul_(std).add_(mean)
            )
        if len(self._speaker_cache) > 256:
            self._speaker_cache.clear()
        self._speaker_cache[key] = values
        return values

    @torch.inference_mode()
    def code_prompt(self, text: str, voice: VoiceSpec, speed: int) -> Prompt:
        m = self.m
        if voice.kind is VoiceKind.REFERENCE:
            # Upstream's spk_smp/txt_smp path: [Stts][empty_spk]{transcript}[speed_N]{text}[Ptts]
            # followed by the clip's audio codes.
            decorated = m.speaker.decorate_code_prompts(
                [text], f"[speed_{speed}]", self.transcript(voice), None
            )
            input_ids, _, text_mask = m.tokenizer.encode(
                decorated, self.num_vq, prompt=self.reference_codes(voice), device=self.device
            )
            tokens = prompt_text(m.tokenizer._tokenizer, decorated[0], text)
            return Prompt(m.embed(input_ids, text_mask)[0].float(), text, tokens)
        decorated = m.speaker.decorate_code_prompts([text], f"[speed_{speed}]", None, "spk")
        input_ids, _, text_mask = m.tokenizer.encode(decorated, self.num_vq, device=self.device)
        emb = m.embed(input_ids, text_mask)  # (1, L, D)
        m.speaker.apply(emb, self.speaker(voice), input_ids, m.tokenizer.spk_emb_ids, self.device)
        return Prompt(emb[0].float(), text, prompt_text(m.tokenizer._tokenizer, decorated[0], text))

    @torch.inference_mode()
    def refine_prompt(self, text: str, refine_prompt: str) -> Prompt:
        m = self.m
        decorated = m.speaker.decorate_text_prompts([text], refine_prompt)
        input_ids, _, text_mask = m.tokenizer.encode(decorated, self.num_vq, device=self.device)
        emb = m.embed(input_ids, text_mask)
        return Prompt(emb[0].float(), text)

    def refined_text(self, token_ids: list[int]) -> str:
        """Text tokens of the refine pass back to text, dropping ids from [break_0] on, as upstream."""
        tokenizer = self.m.tokenizer
        kept = [t for t in token_ids if t < tokenizer.break_0_ids]
        return str(tokenizer.decode([torch.tensor(kept, dtype=torch.long)])[0])
