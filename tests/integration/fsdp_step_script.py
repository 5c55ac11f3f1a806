"""Three AdamW steps of the SFT loss on a tiny random Llama, as one process or as torchrun ranks
(`python -m fsdp_step_script OUT_DIR`); writes OUT_DIR/result.json (per-step losses) and OUT_DIR/model/."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from orchard.trainers import distributed
from orchard.trainers.sft import token_logprobs

STEPS = 3
MICRO_BATCHES = 4  # the global batch; split over the ranks
ROWS, SEQ_LEN, VOCAB = 2, 16, 128
MAX_GRAD_NORM = 0.5


def tiny_llama() -> LlamaForCausalLM:
    """Seeded, so every rank builds the same weights; tied embeddings like SmolLM2."""
    torch.manual_seed(0)
    config = LlamaConfig(  # type: ignore[call-arg]  # transformers' typed __init__ omits the kwargs it takes
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=True,
        attn_implementation="sdpa",
    )
    return LlamaForCausalLM(config)


def global_batch() -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(input_ids, loss_mask) micro-batches; each row trains 1 to SEQ_LEN-1 tokens, so the ranks' counts differ."""
    gen = torch.Generator().manual_seed(1)
    batches = []
    for _ in range(MICRO_BATCHES):
        ids = torch.randint(0, VOCAB, (ROWS, SEQ_LEN), generator=gen)
        trained = torch.randint(1, SEQ_LEN, (ROWS, 1), generator=gen)
        mask = (torch.arange(SEQ_LEN)[None, :] >= SEQ_LEN - trained).float()
        batches.append((ids, mask))
    return batches


def main(out: Path) -> None:
    torch.set_num_threads(1)
    dist = distributed.init()
    model = tiny_llama()
    model.train()
    distributed.shard(model, dist)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    mine = distributed.rank_slice(global_batch(), dist)
    n_tokens = distributed.global_sum(sum(float(mask.sum()) for _, mask in mine), dist)
    losses, grad_norms = [], []
    for _ in range(STEPS):
        local = 0.0
        for ids, mask in mine:
            loss = -(token_logprobs(model(input_ids=ids).logits, ids) * mask).sum() / n_tokens
            loss.backward()
            local += loss.item()
        # Adam barely notices a gradient scaled by 1/world_size; the norm and the clipping do.
        grad_norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_GRAD_NORM)))
        opt.step()
        opt.zero_grad()
        losses.append(distributed.global_sum(local, dist))
    distributed.save_pretrained(model, None, out / "model", dist)
    if dist.is_main:
        (out / "result.json").write_text(
            json.dumps(
                {"world_size": dist.world_size, "losses": losses, "grad_norms": grad_norms, "n_tokens": n_tokens}
            )
        )
    distributed.shutdown(dist)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
