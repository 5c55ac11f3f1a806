"""Trainer overhead: SFT tokens/s through a real trainer job (gRPC service → worker process → recipe loop, with
progress events) against a bare torch loop in this process on the same model, the same samples and the same
micro-batches (the baseline). Prints one JSON object; `ratio` = job / bare steady-state tokens/s (target ≥ 0.9,
i.e. at most 10 % overhead). Also reports the job's wall time from CreateJob to SUCCEEDED (process start, model
load and the final checkpoint included), which the steady-state figure leaves out.

    python bench/trainer_step.py [--model ''] [--samples 8] [--tokens 128] [--steps 4] [--batch 4] [--tiny]

`--model ''` is the embedded SmolLM2-135M; `--tiny` uses a random-init 2-layer model with its tokenizer (fast;
for the smoke test).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "integration"))  # the tiny-model helper and in-process service

from trainer_service_helpers import tiny_model, trainer_service  # noqa: E402

from orchard.trainer.v1 import trainer_pb2 as pb  # noqa: E402


def dataset(path: Path, n: int, tokens: int) -> Path:
    """n chats whose assistant answers make each sample roughly `tokens` tokens long."""
    words = max(8, tokens // 2)
    with path.open("w") as f:
        for i in range(n):
            answer = " ".join(f"step{(i * 7 + j) % 97}" for j in range(words))
            messages = [
                {"role": "user", "content": f"Explain fix number {i}."},
                {"role": "assistant", "content": answer},
            ]
            f.write(json.dumps({"messages": messages}) + "\n")
    return path


def bare_loop(model_dir: Path, data: Path, steps: int, batch: int, micro: int, max_len: int) -> dict[str, float]:
    """The same work as the job's steps with nothing around it: pack, forward, backward, clip, AdamW."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from orchard.trainers.data import TemplateRenderer, openai_sample
    from orchard.trainers.sft import truncate_left
    from orchard.trainers.sft_job import micro_batches, micro_loss

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="sdpa").train()
    renderer = TemplateRenderer(tokenizer)
    samples = [
        truncate_left(openai_sample(renderer, json.loads(line)), max_len) for line in data.read_text().splitlines()
    ]
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, foreach=False)
    rates = []
    for step in range(steps):
        chosen = [samples[(step * batch + k) % len(samples)] for k in range(batch)]
        count = sum(sum(s.loss_mask[1:]) for s in chosen)
        started = time.perf_counter()
        tokens = 0
        for mb in micro_batches(chosen, micro, 1):
            loss, n = micro_loss(model, mb, tokenizer.pad_token_id or 0, count)
            loss.backward()
            tokens += n
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        rates.append(tokens / (time.perf_counter() - started))
    return {"tokens_per_s": statistics.median(rates[1:] or rates), "steps": steps}


async def job_run(
    model_dir: Path, data: Path, steps: int, batch: int, micro: int, max_len: int, jobs: Path
) -> dict[str, float]:
    async with trainer_service(jobs) as stub:
        config = pb.JobConfig(
            kind=pb.JOB_KIND_SFT,
            base_model=str(model_dir),
            dataset=pb.DatasetSource(path=str(data)),
            hyperparameters=pb.Hyperparameters(
                learning_rate=1e-5,
                max_steps=steps,
                epochs=100,
                global_batch_size=batch,
                micro_batch_size=micro,
                max_seq_len=max_len,
                seed=0,
            ),
        )
        started = time.perf_counter()
        job = (await stub.CreateJob(pb.CreateJobRequest(config=config))).job
        rates = []
        async for event in stub.StreamJobEvents(pb.StreamJobEventsRequest(job_id=job.job_id)):
            if event.WhichOneof("event") == "progress":
                rates.append(event.progress.metrics["tokens_per_second"])
            elif event.WhichOneof("event") == "job" and event.job.state == pb.JOB_STATE_FAILED:
                raise SystemExit(f"trainer job failed: {event.job.error}")
        wall = time.perf_counter() - started
    return {"tokens_per_s": statistics.median(rates[1:] or rates), "steps": len(rates), "wall_s": wall}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="", help="a Hugging Face folder; '' is the embedded SmolLM2-135M")
    parser.add_argument("--tiny", action="store_true", help="a random-init 2-layer model (smoke test)")
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=128, help="about this many tokens per sample")
    parser.add_argument("--steps", type=int, default=4, help="optimiser steps per arm (the first is warm-up)")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--micro", type=int, default=4)
    parser.add_argument("--threads", type=int, default=0, help="torch threads of both arms; 0 keeps the default")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory(prefix="orchard-bench-trainer-") as tmp:
        root = Path(tmp)
        if args.tiny:
            model_dir = tiny_model(root / "tiny")
        elif args.model:
            model_dir = Path(args.model)
        else:
            from orchard.model_files import default_cache_dir, resolve_model

            model_dir = resolve_model("", default_cache_dir())[0]
        data = dataset(root / "data.jsonl", args.samples, args.tokens)
        max_len = args.tokens * 2
        job = asyncio.run(job_run(model_dir, data, args.steps, args.batch, args.micro, max_len, root / "jobs"))
        bare = bare_loop(model_dir, data, args.steps, args.batch, args.micro, max_len)
    print(
        json.dumps(
            {
                "model": "tiny" if args.tiny else (args.model or "SmolLM2-135M-Instruct"),
                "samples_per_step": args.batch,
                "tokens_per_sample": args.tokens,
                "job": job,
                "bare_loop": bare,
                "ratio": round(job["tokens_per_s"] / bare["tokens_per_s"], 3),
                "overhead_pct": round(100 * (1 - job["tokens_per_s"] / bare["tokens_per_s"]), 1),
            }
        )
    )


if __name__ == "__main__":
    main()
