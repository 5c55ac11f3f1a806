"""Gathers sharded tensors the way `distributed.save_pretrained` does (only rank 0 keeps them), then leaves through
`distributed.shutdown` and exits at once (`python -m gloo_exit_script` under torchrun)."""

from __future__ import annotations

import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor

from orchard.trainers import distributed


def main() -> None:
    dist = distributed.init()
    mesh = init_device_mesh("cpu", (dist.world_size,))
    gathered = [distribute_tensor(torch.full((64, 64), float(i)), mesh, [Shard(0)]).full_tensor() for i in range(30)]
    if not dist.is_main:
        gathered.clear()  # the collectives' Work objects now hold the last references to these tensors
    distributed.shutdown(dist)


if __name__ == "__main__":
    main()
