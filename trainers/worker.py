"""The process a trainer job runs in: `python -m orchard.trainers.worker <job dir>` (one per rank under torchrun).

It runs the job's recipe from its latest checkpoint and reports through the job directory (see `job.py`); its
exit code is 0 when the job ended (succeeded, failed with a reported error, or cancelled). Any other exit — a
crash, a kill, out of memory — leaves the job to the service, which resumes it from its latest checkpoint.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path

from orchard.errors import OrchardError
from orchard.trainer.v1 import trainer_pb2 as pb
from orchard.trainers import distributed
from orchard.trainers.job import JobCancelled, JobContext

RECIPES: dict[int, str] = {
    pb.JOB_KIND_SFT: "orchard.trainers.sft_job:run",
    pb.JOB_KIND_CREDIT_ASSIGNMENT_SFT: "orchard.trainers.sft_job:run",
    pb.JOB_KIND_RL: "orchard.trainers.rl_job:run",
    pb.JOB_KIND_VALUE: "orchard.trainers.value_job:run",
}
"""Job kind -> "module:function" of its recipe run, imported lazily (torch and transformers load slowly)."""


def recipe(kind: int) -> Callable[[JobContext], None]:
    module, _, name = RECIPES[kind].partition(":")
    return getattr(importlib.import_module(module), name)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="orchard-trainer-worker", description=__doc__.splitlines()[0])
    parser.add_argument("job_dir", type=Path)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    import torch

    dist = distributed.init()
    torch.set_num_threads(max(1, torch.get_num_threads() // dist.world_size))  # ranks share one machine's cores
    ctx = JobContext.load(args.job_dir, dist)
    try:
        latest = ctx.latest_checkpoint()
        if latest is None or not latest.is_final:  # a final checkpoint means only the report was lost
            recipe(ctx.config.kind)(ctx)
        ctx.emit("succeeded")
    except JobCancelled:
        ctx.emit("cancelled")
    except OrchardError as err:
        ctx.emit("failed", error=str(err), code=type(err).__name__)
    except Exception as err:  # a recipe bug or a library error: reported with its type; the traceback is logged
        traceback.print_exc()
        ctx.emit("failed", error=f"{type(err).__name__}: {err}", code="Internal")
    finally:
        distributed.shutdown(dist)
    return 0


if __name__ == "__main__":
    sys.exit(main())
