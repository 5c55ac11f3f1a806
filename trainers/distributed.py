"""Multi-process training for the trainer jobs: a job started by torchrun shards the model with FSDP2 and splits
each global batch over the ranks, and gets the same loss and update as a one-process run of that batch.

Recipe for one optimizer step (the loss is a token mean over the whole global batch):

    mine = rank_slice(micro_batches, dist)
    n_tokens = global_sum(sum(int(mb.loss_mask.sum()) for mb in mine), dist)
    for mb in mine:
        loss = -(token_logprobs(model(...).logits, mb.input_ids) * mb.loss_mask).sum() / n_tokens
        loss.backward()                 # `shard` makes FSDP sum the gradients over ranks
    opt.step(); opt.zero_grad()
    step_loss = global_sum(sum of the local loss.item()s, dist)

Choices [I]:
- FSDP2 averages gradients over ranks by default. Every rank already divides by the global token count, so the
  ranks' gradients must be summed: `shard` sets the divide factor to 1 with sum-only collectives (gloo rejects
  the PREMUL_SUM op a factor alone would use).
- Every rank must run the same number of forward/backward passes (each is a collective), so `rank_slice`
  refuses a micro-batch count that does not split evenly instead of letting the ranks hang.
- One process (no WORLD_SIZE, or 1) initialises nothing and every helper here is then a no-op or an identity.
"""

from __future__ import annotations

import os
import sys
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import torch
import torch.distributed as torch_dist

T = TypeVar("T")


@dataclass(frozen=True)
class Dist:
    """Where this process stands in the job: rank `rank` of `world_size` processes."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        """The rank that writes files and logs."""
        return self.rank == 0

    @property
    def device(self) -> torch.device:
        """This rank's device: its own GPU when CUDA is available, else the CPU."""
        return torch.device("cuda", self.local_rank) if torch.cuda.is_available() else torch.device("cpu")


def init() -> Dist:
    """This process's place from torchrun's environment; joins the process group when there are several ranks."""
    # torchrun's variables are the launch contract itself, not settings, so they are read here.
    dist = Dist(
        int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1")), int(os.environ.get("LOCAL_RANK", "0"))
    )
    if dist.world_size > 1:
        if torch.cuda.is_available():
            torch.cuda.set_device(dist.device)
            torch_dist.init_process_group("nccl", device_id=dist.device)
        else:
            torch_dist.init_process_group("gloo")
    return dist


# The last barrier's Work, kept until the interpreter itself goes (see `shutdown`).
_last_barrier: list[Any] = []


def shutdown(dist: Dist) -> None:
    """Leaves the process group (after a last barrier so no rank exits while others still talk)."""
    if dist.world_size > 1:
        # Gloo's worker thread drops its reference to the barrier's Work just after the wait returns; when that is
        # the last one, the Work's destructor frees the earlier collectives' tensors from that thread, which needs
        # the GIL, and if the interpreter is finalizing by then the thread is torn down mid-destructor and the
        # process aborts ("terminate called without an active exception", about 1 exit in 10 on 2 CPU ranks).
        # Holding the Work here makes the main thread the last owner.
        work = torch_dist.barrier(async_op=True)
        work.wait()
        _last_barrier.append(work)
        torch_dist.destroy_process_group()


def shard(model: Any, dist: Dist) -> None:
    """FSDP2-shards every decoder layer of a Hugging Face causal LM, then the root; gradients are summed."""
    if dist.world_size == 1:
        return
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(dist.device.type, (dist.world_size,))
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    # Each module keeps its own reduce settings, so set them on every sharded one.
    for module in [*model.model.layers, model]:
        module.set_gradient_divide_factor(1.0)
        module.set_force_sum_reduction_for_comms(True)


def rank_slice(items: Sequence[T], dist: Dist) -> list[T]:
    """This rank's share of the global micro-batches: every `world_size`-th one, starting at `rank`."""
    if len(items) % dist.world_size:
        raise ValueError(
            f"{len(items)} micro-batches do not split evenly over {dist.world_size} ranks (each rank "
            f"must run as many passes); make the global batch a multiple of micro_batch * ranks"
        )
    return list(items[dist.rank :: dist.world_size])


def global_sum(x: float, dist: Dist) -> float:
    """The sum of `x` over all ranks (exact for counts below 2**53)."""
    if dist.world_size == 1:
        return float(x)
    t = torch.tensor([float(x)], dtype=torch.float64, device=dist.device)
    torch_dist.all_reduce(t, op=torch_dist.ReduceOp.SUM)
    return t.item()


def all_reduce_mean(x: float, dist: Dist) -> float:
    """The mean of `x` over all ranks, for logging per-rank figures."""
    return global_sum(x, dist) / dist.world_size


def barrier(dist: Dist) -> None:
    """Waits until every rank gets here."""
    if dist.world_size > 1:
        torch_dist.barrier()


def full_state_dict(model: Any, dist: Dist) -> dict[str, torch.Tensor] | None:
    """The whole model's weights on the CPU of the main rank, None on the others; every rank must call it."""
    if dist.world_size == 1:
        state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    else:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if not dist.is_main:
            return None
    # Copying to the CPU gives tied parameters (lm_head = embed_tokens) separate tensors; share them again so
    # the saved file stores them once, as the model's own save_pretrained does.
    names: dict[int, list[str]] = defaultdict(list)
    for name, param in model.named_parameters(remove_duplicate=False):
        names[id(param)].append(name)
    for first, *aliases in names.values():
        for alias in aliases:
            state[alias] = state[first]
    return state


def save_pretrained(model: Any, tokenizer: Any | None, path: Path, dist: Dist) -> None:
    """Writes a Hugging Face folder (config.json, model.safetensors, tokenizer files) from the main rank; every
    rank must call it, as the weights are gathered from all of them."""
    state = full_state_dict(model, dist)
    if state is None:
        return
    path.mkdir(parents=True, exist_ok=True)
    # HF drops tied duplicates (lm_head = embed_tokens) from the given state dict itself.
    model.save_pretrained(path, state_dict=state)
    if tokenizer is not None:
        tokenizer.save_pretrained(path)


def torchrun_command(nproc: int, module: str, args: list[str]) -> list[str]:
    """The argv that runs `python -m module *args` as `nproc` ranks on this machine."""
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={nproc}",
        "-m",
        module,
        *args,
    ]


def torchrun_env() -> dict[str, str]:
    """The variables to add to the parent's environment for `torchrun_command`: rendezvous over loopback, and
    one OpenMP thread per rank so the ranks don't oversubscribe the CPUs."""
    return {"MASTER_ADDR": "127.0.0.1", "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}
