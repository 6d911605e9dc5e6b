"""ChatTTS's GPT as a GGUF file, for the llama.cpp decode backend (`engine/llamacpp_gpt.py`).

The GPT is a plain Llama (20 layers, hidden 768, 12 heads at the official shapes); llama.cpp runs
its layers and nothing else: the input embeddings come from our Embed (text, or the sum of the
four code embeddings) and the final, normed hidden states go back to our heads. So the file holds
the layers, the final norm and a one-row dummy token embedding (llama.cpp's `no_vocab`
tokenizer), no vocabulary.

Q and K are permuted as llama.cpp's own converter does (`convert_hf_to_gguf.py`): transformers
rotates the two halves of each head (`rotate_half`), ggml's NORM rope rotates adjacent pairs.

F32, F16, Q8_0 and Q8_0-mixedN (Q8_0 after N layers in F16) are written here (the `gguf`
package quantizes Q8_0 in numpy); the k-quants (Q6_K, Q5_K, Q4_K) are made from the F16 file by
llama.cpp's own `llama_model_quantize`.
Files are cached by the weights' digest and the format (`GGUFCache`): a restart loads them.
"""

from __future__ import annotations

import logging
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..defaults import GGUF_FORMATS
from .llama_layers import LlamaShape

log = logging.getLogger(__name__)

FORMATS = GGUF_FORMATS
WRITTEN_HERE = ("F32", "F16", "Q8_0", "Q8_0-mixed1", "Q8_0-mixed2", "Q8_0-mixed4")
"""Formats the `gguf` package writes; the rest are quantized from F16 by llama.cpp."""
K_QUANT_FTYPES = {"Q6_K": 18, "Q5_K": 17, "Q4_K": 15}
"""llama.cpp's `llama_ftype` of each k-quant (LLAMA_FTYPE_MOSTLY_Q6_K, _Q5_K_M, _Q4_K_M)."""
_FORMAT_VERSION = 1
"""Bumped when what a file holds changes: old cache entries then miss."""

_LAYER_TENSORS = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}


def _permute(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """transformers' half-split rope layout -> ggml's adjacent pairs, per head (as
    `convert_hf_to_gguf.py`'s `LlamaModel.permute`)."""
    rows = weight.shape[0]
    return (
        weight.reshape(num_heads, 2, rows // num_heads // 2, *weight.shape[1:])
        .swapaxes(1, 2)
        .reshape(weight.shape)
    )


def write_gguf(
    path: Path,
    state_dict: Mapping[str, torch.Tensor],
    shape: LlamaShape,
    rope_theta: float,
    weight_format: str,
) -> None:
    """`state_dict` (transformers LlamaModel keys: `layers.N...`, `norm.weight`) as a GGUF file
    in `weight_format` (one of WRITTEN_HERE); norms stay F32, as llama.cpp keeps them."""
    import gguf

    if weight_format not in WRITTEN_HERE:
        raise ValueError(f"write_gguf writes {WRITTEN_HERE}, not {weight_format}")
    writer = gguf.GGUFWriter(str(path), "llama")
    _write_header(writer, shape, rope_theta, weight_format)
    writer.add_tensor("token_embd.weight", np.zeros((1, shape.hidden_size), dtype=np.float32))
    writer.add_tensor("output_norm.weight", _f32(state_dict["norm.weight"]))
    base, _, mixed = weight_format.partition("-mixed")
    exact_layers = int(mixed or 0)
    for i in range(shape.num_layers):
        for ours, theirs in _LAYER_TENSORS.items():
            tensor = _f32(state_dict[f"layers.{i}.{ours}"])
            if ours == "self_attn.q_proj.weight":
                tensor = _permute(tensor, shape.num_heads)
            elif ours == "self_attn.k_proj.weight":
                tensor = _permute(tensor, shape.num_kv_heads)
            name = f"blk.{i}.{theirs}"
            if tensor.ndim == 1 or weight_format == "F32":
                writer.add_tensor(name, tensor)
            else:
                layer_type = getattr(gguf.GGMLQuantizationType, "F16" if i < exact_layers else base)
                writer.add_tensor(
                    name, gguf.quants.quantize(tensor, layer_type), raw_dtype=layer_type
                )
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _write_header(writer: Any, shape: LlamaShape, rope_theta: float, weight_format: str) -> None:
    """The Llama architecture's keys, and a tokenizer of one dummy token (no vocabulary)."""
    import gguf

    writer.add_block_count(shape.num_layers)
    writer.add_context_length(shape.max_positions)
    writer.add_embedding_length(shape.hidden_size)
    writer.add_feed_forward_length(shape.intermediate_size)
    writer.add_head_count(shape.num_heads)
    writer.add_head_count_kv(shape.num_kv_heads)
    writer.add_key_length(shape.head_dim)
    writer.add_value_length(shape.head_dim)
    writer.add_rope_dimension_count(shape.head_dim)
    writer.add_rope_freq_base(rope_theta)
    writer.add_layer_norm_rms_eps(shape.rms_norm_eps)
    base = weight_format.partition("-mixed")[0]
    file_type = (
        gguf.LlamaFileType.ALL_F32 if base == "F32" else gguf.LlamaFileType[f"MOSTLY_{base}"]
    )
    writer.add_file_type(file_type)
    writer.add_tokenizer_model("no_vocab")
    writer.add_vocab_size(1)


def _f32(tensor: torch.Tensor) -> np.ndarray:
    return tensor.detach().float().cpu().numpy()


def quantize_gguf(source: Path, path: Path, weight_format: str, threads: int) -> None:
    """`source` (an F16 file) quantized to a k-quant by llama.cpp's `llama_model_quantize`."""
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = K_QUANT_FTYPES[weight_format]
    params.nthread = threads
    status = llama_cpp.llama_model_quantize(
        str(source).encode(), str(path).encode(), llama_cpp.byref(params)
    )
    if status != 0:
        raise RuntimeError(f"llama_model_quantize to {weight_format} failed ({status})")


class GGUFCache:
    """GGUF files of the loaded GPT, one per format, named by the weights' digest: written once,
    renamed into place (replicas sharing the folder never read half a file)."""

    def __init__(self, folder: Path, digest: str) -> None:
        self.folder = folder
        self.digest = digest

    def path(self, weight_format: str) -> Path:
        return self.folder / f"gpt-{self.digest[:24]}-v{_FORMAT_VERSION}-{weight_format}.gguf"

    def get(
        self,
        weight_format: str,
        state_dict: Mapping[str, torch.Tensor] | None,
        shape: LlamaShape,
        rope_theta: float,
        threads: int,
    ) -> Path:
        """The file of `weight_format`, made now if it is not there yet (from `state_dict`;
        a k-quant from the F16 file, made first if need be)."""
        path = self.path(weight_format)
        if path.exists():
            return path
        if weight_format not in WRITTEN_HERE and weight_format not in K_QUANT_FTYPES:
            raise ValueError(f"unknown GGUF format {weight_format!r} (have {FORMATS})")
        self.folder.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(dir=self.folder, suffix=".gguf.tmp")
        os.close(fd)
        tmp = Path(tmp_name)
        try:
            if weight_format in WRITTEN_HERE:
                if state_dict is None:
                    raise ValueError(f"{weight_format} is not cached and no weights were given")
                write_gguf(tmp, state_dict, shape, rope_theta, weight_format)
            else:
                source = self.get("F16", state_dict, shape, rope_theta, threads)
                quantize_gguf(source, tmp, weight_format, threads)
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
        log.info(
            "GGUF %s of the GPT written to %s (%.0f MiB)",
            weight_format,
            path,
            path.stat().st_size / 2**20,
        )
        return path
