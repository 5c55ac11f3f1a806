"""A Hugging Face Llama checkpoint folder (what the trainer writes with `save_pretrained`) as a GGUF file that
llama.cpp loads, written in process with the `gguf` package: the tensors map one to one (q/k rows permuted to
GGML's rotary layout, as llama.cpp's own converter does), in F16 or F32; the vocabulary comes from the tokenizer."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Literal

import numpy as np

from orchard.errors import InvalidArgument

WeightsType = Literal["f16", "f32"]

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
_TOKEN_CONTROL = 3  # llama.cpp's LLAMA_TOKEN_TYPE_CONTROL; 1 is NORMAL


def _permute(weight: np.ndarray, heads: int) -> np.ndarray:
    """Rows of q/k from Hugging Face's rotate-half layout to GGML's interleaved RoPE pairs."""
    return (
        weight.reshape(heads, 2, weight.shape[0] // heads // 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)
    )


def _tensors(folder: Path) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise InvalidArgument(f"checkpoint {folder} holds no *.safetensors weights", field="checkpoint_path")
    tensors: dict[str, np.ndarray] = {}
    for file in files:
        tensors.update(load_file(str(file)))
    return tensors


def write_gguf(folder: Path, tokenizer: Any, out: Path, weights_type: WeightsType = "f16") -> float:
    """Write the Llama checkpoint in folder as the GGUF file out; returns the seconds it took."""
    import gguf

    started = time.monotonic()
    config = json.loads((folder / "config.json").read_text())
    if config.get("model_type") != "llama":
        raise InvalidArgument(
            f"the llama_cpp engine converts Llama checkpoints only; {folder} is a {config.get('model_type')!r} model",
            field="checkpoint_path",
        )
    heads, kv_heads = int(config["num_attention_heads"]), int(config.get("num_key_value_heads") or 0)
    kv_heads = kv_heads or heads
    hidden, layers = int(config["hidden_size"]), int(config["num_hidden_layers"])
    head_dim = int(config.get("head_dim") or hidden // heads)
    rope = config.get("rope_parameters") or {}
    theta = float(rope.get("rope_theta", config.get("rope_theta", 10000.0)))
    if rope.get("rope_type", "default") != "default":
        raise InvalidArgument(f"rope type {rope['rope_type']!r} of {folder} is not supported", field="checkpoint_path")

    writer = gguf.GGUFWriter(str(out), "llama")
    writer.add_name(folder.name)
    writer.add_context_length(int(config["max_position_embeddings"]))
    writer.add_embedding_length(hidden)
    writer.add_block_count(layers)
    writer.add_feed_forward_length(int(config["intermediate_size"]))
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(theta)
    writer.add_layer_norm_rms_eps(float(config["rms_norm_eps"]))
    writer.add_vocab_size(int(config["vocab_size"]))
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16 if weights_type == "f16" else gguf.LlamaFileType.ALL_F32)
    _add_vocabulary(writer, tokenizer, int(config["vocab_size"]))

    dtype = np.float16 if weights_type == "f16" else np.float32
    tensors = _tensors(folder)
    names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight"}
    if "lm_head.weight" in tensors and not config.get("tie_word_embeddings", False):
        names["lm_head.weight"] = "output.weight"
    for i in range(layers):
        names.update({f"model.layers.{i}.{hf}": f"blk.{i}.{gg}" for hf, gg in _LAYER_TENSORS.items()})
    missing = sorted(set(names) - set(tensors))
    if missing:
        raise InvalidArgument(f"checkpoint {folder} lacks tensors {missing[:3]}", field="checkpoint_path")
    for hf, gg in names.items():
        data = tensors[hf].astype(np.float32)
        if hf.endswith("q_proj.weight"):
            data = _permute(data, heads)
        elif hf.endswith("k_proj.weight"):
            data = _permute(data, kv_heads)
        # Norms stay F32 (GGML adds and multiplies them in F32); matrices take the chosen type.
        writer.add_tensor(gg, data if data.ndim == 1 else data.astype(dtype))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return time.monotonic() - started


def _add_vocabulary(writer: Any, tokenizer: Any, vocab_size: int) -> None:
    """The tokenizer's byte-level BPE vocabulary and merges. llama.cpp needs them to load a model; Orchard itself
    tokenizes with the Hugging Face tokenizer, so llama.cpp's own tokenizer is never asked."""
    spec = json.loads(tokenizer.backend_tokenizer.to_str())
    if spec["model"]["type"] != "BPE":
        raise InvalidArgument(f"the llama_cpp engine needs a BPE tokenizer, not {spec['model']['type']}")
    by_id = {i: t for t, i in tokenizer.get_vocab().items()}
    special = {t["id"] for t in spec.get("added_tokens", []) if t.get("special")}
    tokens = [by_id.get(i, f"[PAD{i}]") for i in range(vocab_size)]
    merges = [m if isinstance(m, str) else " ".join(m) for m in spec["model"]["merges"]]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types([_TOKEN_CONTROL if i in special else 1 for i in range(vocab_size)])
    writer.add_token_merges(merges)
    for name, token_id in (("bos", tokenizer.bos_token_id), ("eos", tokenizer.eos_token_id)):
        if token_id is not None:
            getattr(writer, f"add_{name}_token_id")(int(token_id))
    if tokenizer.pad_token_id is not None:
        writer.add_pad_token_id(int(tokenizer.pad_token_id))
    writer.add_add_bos_token(False)
