"""The GPT's heads and input embeddings, as the runner samples with them: ChatTTS's audio-code
heads (one per codebook) and text head, weight-normed once into plain fp32 matrices."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor


@dataclass(frozen=True)
class Heads:
    code: Tensor
    """(num_vq, V, D) audio-code heads."""
    text: Tensor
    """(V_text, D) text head (the refine pass)."""
    emb_code: Tensor
    """(num_vq, V, D) audio-code input embeddings."""
    emb_text: Tensor
    """(V_text, D) text input embeddings."""

    @classmethod
    @torch.inference_mode()
    def from_embed(cls, embed: Any) -> Heads:
        """From ChatTTS's Embed module: the effective (weight-normed) weights, fp32."""
        return cls(
            code=torch.stack([h.weight.detach().float() for h in embed.head_code]),
            text=embed.head_text.weight.detach().float(),
            emb_code=torch.stack([e.weight.detach().float() for e in embed.emb_code]),
            emb_text=embed.emb_text.weight.detach().float(),
        )

    @property
    def num_vq(self) -> int:
        return int(self.code.shape[0])

    def code_logits(self, hidden: Tensor) -> Tensor:
        """(B, D) hidden states -> (B, num_vq, V) logits."""
        return torch.einsum("bd,qvd->bqv", hidden.float(), self.code)

    def code_embeds(self, codes: Tensor) -> Tensor:
        """(B, num_vq) codes -> (B, D) next inputs: the sum of the codebooks' embeddings."""
        codebooks = torch.arange(self.num_vq, device=codes.device)
        return self.emb_code[codebooks, codes].sum(1)

    def greedy_code_embed(self, hidden: Tensor) -> Tensor:
        """(D,) hidden -> (D,) the next input: the embedding of each codebook's likeliest code."""
        codes = torch.einsum("d,qvd->qv", hidden.float(), self.code).argmax(dim=-1)  # (num_vq,)
        codebooks = torch.arange(self.num_vq, device=codes.device)
        return self.emb_code[codebooks, codes].sum(0)
