"""Helpers of the trainer tests: hand-built trajectories and a random-init tiny causal LM (no download)."""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from orchard.types.v1 import types_pb2 as tpb


def make_trajectory(prompt: list[int], steps: list[tuple[list[int], list[int]]]) -> tpb.Trajectory:
    """A trajectory whose step i holds model tokens steps[i][0] (mask 1), then context tokens steps[i][1]."""
    traj = tpb.Trajectory(prompt_tokens=tpb.TokenSpan(token_ids=prompt, mask=[0] * len(prompt)))
    for i, (model, context) in enumerate(steps):
        traj.steps.add(
            index=i, tokens=tpb.TokenSpan(token_ids=model + context, mask=[1] * len(model) + [0] * len(context))
        )
    return traj


def tiny_lm(vocab: int = 32, seed: int = 0, hidden: int = 32, layers: int = 2) -> LlamaForCausalLM:
    """A small random-init Llama with sdpa attention (which honours 4-D packing masks)."""
    torch.manual_seed(seed)
    config = LlamaConfig(  # type: ignore[call-arg]  # transformers' typed __init__ omits the kwargs it takes
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=128,
        attn_implementation="sdpa",
    )
    return LlamaForCausalLM(config)
