"""Value-model backbones compared on the same real rollouts: the embedded all-MiniLM-L6-v2 encoder (22M parameters,
mean-pooled) against the policy model with a value head (SmolLM2-135M-Instruct, the embedded GGUF converted,
pooled at its last token). Each is trained by the value recipe's own plan, optimiser and step
(trainers/value_job.py) for the same steps on the same batches, cross-validated by task (the held-out tasks'
history is left out), then scores the held-out tasks' fresh candidates. Figures per backbone: held-out AUC,
best@8 against random@8, seconds per training step and candidates scored per second; the ratios compare the policy
head against MiniLM in the same run.

The rollouts come from `bench/value_real_run.py` (its `runs/` folder: `hist-<seed>-q<Q>` history runs and an
`eval-<seed>` run of 8 candidates per task), read from their trajectories.jsonl files:

    python bench/value_backbones.py --runs <value_real_run out>/runs [--seed 0] [--folds 2] [--steps 20]
                                    [--batch 8] [--max-context-tokens 512] [--backbones minilm,policy]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path
from typing import Any

import torch
from google.protobuf import json_format

from orchard.trainer.v1 import trainer_pb2 as pb
from orchard.trainers import optim, value_data, value_job
from orchard.types.v1 import types_pb2 as tpb
from orchard.value import metrics as vm
from orchard.value.model import ValueModel, resolve_backbone


def read_run(folder: Path) -> list[tpb.Trajectory]:
    lines = (folder / "trajectories.jsonl").read_text().splitlines()
    return [json_format.Parse(line, tpb.Trajectory()) for line in lines if line.strip()]


def backbone_path(name: str) -> tuple[Path, str]:
    if name == "minilm":
        return resolve_backbone("")
    from orchard.model_files import default_cache_dir, resolve_model

    return resolve_model("", default_cache_dir())[0], "SmolLM2-135M-Instruct"


def fold_figures(
    name: str, history: list[tpb.Trajectory], candidates: list[tpb.Trajectory], held: set[str], args: argparse.Namespace
) -> dict[str, Any]:
    """Train `name` on the history without `held`, score the held-out candidates."""
    torch.manual_seed(args.seed)
    vd = value_data.build([t for t in history if t.task_id not in held], eval_fraction=0, seed=args.seed)
    o = optim.resolve(pb.Hyperparameters(seed=args.seed, global_batch_size=args.batch), pb.JOB_KIND_VALUE)
    plan, _ = value_job.training_plan(vd, o, epochs_given=False)
    plan = plan[: args.steps]
    path, label = backbone_path(name)
    model = ValueModel.load(path, base_model=label, max_context_tokens=args.max_context_tokens)
    model.lexical = None  # the encoders compared alone: the lexical part would be the same for both
    opt = value_job.make_optimizer(model, o)
    model.train(True)
    started = time.perf_counter()
    for step, batch in enumerate(plan):
        value_job.train_step(model, opt, batch, optim.lr_at(o, step, len(plan)), o.max_grad_norm, 1.0)
        print(f"  {name} step {step + 1}/{len(plan)}", file=sys.stderr, end="\r")
    train_s = time.perf_counter() - started
    pool = [t for t in candidates if t.task_id in held]
    texts = [value_data.render_candidate(t) for t in pool]
    started = time.perf_counter()
    logits = model.score(texts)
    score_s = time.perf_counter() - started
    scored = [
        vm.Candidate(
            t.task_id, vm.sigmoid(x), value_data.resolved(t), t.final_patch, excluded=not t.final_patch.strip()
        )
        for t, x in zip(pool, logits, strict=True)
    ]
    return {
        "candidates": scored,
        "train_s": train_s,
        "steps": len(plan),
        "train_candidates": sum(len(b) for b in plan),
        "score_s": score_s,
        "scored": len(texts),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=Path, required=True, help="bench/value_real_run.py's runs/ folder")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--folds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--max-context-tokens", type=int, default=512)
    parser.add_argument("--backbones", default="minilm,policy")
    args = parser.parse_args()
    torch.set_num_threads(max(1, torch.get_num_threads()))
    history = [t for d in sorted(args.runs.glob(f"hist-{args.seed}-*")) for t in read_run(d)]
    candidates = read_run(args.runs / f"eval-{args.seed}")
    if not history or not candidates:
        raise SystemExit(f"no hist-{args.seed}-* or eval-{args.seed} run under {args.runs}")
    tasks = sorted({t.task_id for t in candidates})
    random.Random(args.seed).shuffle(tasks)
    folds = [set(tasks[i :: args.folds]) for i in range(args.folds)]
    out: dict[str, Any] = {
        "seed": args.seed,
        "folds": args.folds,
        "steps": args.steps,
        "batch": args.batch,
        "max_context_tokens": args.max_context_tokens,
        "history": len(history),
        "eval_candidates": len(candidates),
        "backbones": {},
    }
    for name in args.backbones.split(","):
        merged: list[vm.Candidate] = []
        train_s = score_s = 0.0
        steps = trained = scored = 0
        for held in folds:
            f = fold_figures(name, history, candidates, held, args)
            merged += f["candidates"]
            train_s, score_s = train_s + f["train_s"], score_s + f["score_s"]
            steps, trained, scored = steps + f["steps"], trained + f["train_candidates"], scored + f["scored"]
        kept = [c for c in merged if not c.excluded]
        report = vm.best_of_n_report(merged, (1, 2, 4, 8))
        out["backbones"][name] = {
            "auc": vm.auc([c.score for c in kept], [c.resolved for c in kept]),
            "best@8": vm.best_at_n(merged, 8),
            "random@8": vm.random_at_n(merged, 8),
            "pass@8": vm.pass_at_n(merged, 8),
            "curve": report["curve"],
            "seconds_per_step": train_s / max(steps, 1),
            "train_candidates_per_second": trained / max(train_s, 1e-9),
            "scored_candidates_per_second": scored / max(score_s, 1e-9),
        }
        print(f"{name}: {json.dumps(out['backbones'][name])}", file=sys.stderr)
    b = out["backbones"]
    if "minilm" in b and "policy" in b:
        out["policy_vs_minilm"] = {
            "seconds_per_step_ratio": b["policy"]["seconds_per_step"] / b["minilm"]["seconds_per_step"],
            "auc_difference": (b["policy"]["auc"] or 0) - (b["minilm"]["auc"] or 0),
            "best@8_difference": b["policy"]["best@8"] - b["minilm"]["best@8"],
        }
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
