"""The vllm engine on a GPU machine, in one go: correctness checks, then throughput against a baseline.

Checks (through the engine interface the service uses): a greedy chat answers "Paris"; sampled log-probs equal
ScoreTokens' (max abs difference); a seed reproduces n samples; a stop string ends the text; cancelling a stream
frees the request. Throughput: tokens/s for 1 request and for N concurrent requests, with the `transformers`
engine on the same device as the baseline, same prompts and lengths.

    python bench/vllm_engine.py                      # the embedded SmolLM2 (converted once from the wheel's GGUF)
    python bench/vllm_engine.py --model /path/to/hf-folder --concurrency 64 --max-tokens 128

Prints one JSON object. Needs `pip install 'orchard[vllm]'` and a CUDA GPU.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import time
from typing import Any

from orchard.chat import templates as chat
from orchard.model_files import default_cache_dir, resolve_model
from orchard.services.inference.engines import load_engine
from orchard.services.inference.engines.base import Engine, SamplingParams
from orchard.services.inference.generation import collect
from orchard.services.inference.settings import InferenceSettings

FRANCE = [{"role": "user", "content": "What is the capital of France?"}]
STORIES = [
    f"Write a short story about a {animal} who learns to {skill}."
    for animal, skill in [
        ("fox", "swim"),
        ("cat", "fly"),
        ("dog", "paint"),
        ("owl", "sing"),
        ("bear", "dance"),
        ("crab", "cook"),
    ]
]


async def checks(engine: Engine) -> dict[str, Any]:
    prompt = engine.tokenize(chat.render(engine, FRANCE, None))
    greedy = (await collect(engine, prompt, SamplingParams(max_tokens=24, temperature=0, logprobs=True)))[0]
    scored = await engine.score(prompt, greedy.token_ids)
    sampled = (await collect(engine, prompt, SamplingParams(max_tokens=24, temperature=1.0, seed=3, logprobs=True)))[0]
    scored_sampled = await engine.score(prompt, sampled.token_ids)
    seeded = SamplingParams(max_tokens=16, temperature=1.0, seed=11, n=4)
    first, second = await collect(engine, prompt, seeded), await collect(engine, prompt, seeded)
    word = greedy.text.split()[1] if len(greedy.text.split()) > 1 else "Paris"
    stopped = (await collect(engine, prompt, SamplingParams(max_tokens=24, temperature=0, stop=(word,))))[0]
    cancelled = False
    async with contextlib.aclosing(engine.generate(prompt, SamplingParams(max_tokens=2000, temperature=1.0))) as s:
        async for _ in s:
            cancelled = True
            break
    return {
        "chat_text": greedy.text,
        "chat_says_paris": "Paris" in greedy.text,
        "greedy_logprobs_vs_score_max_abs_diff": max(
            abs(a - b) for a, b in zip(greedy.logprobs, scored.logprobs, strict=True)
        ),
        "sampled_logprobs_vs_score_max_abs_diff": max(
            abs(a - b) for a, b in zip(sampled.logprobs, scored_sampled.logprobs, strict=True)
        ),
        "seed_reproducible": [c.token_ids for c in first] == [c.token_ids for c in second],
        "n_samples_distinct": len({tuple(c.token_ids) for c in first}),
        "stop_string_ok": stopped.stop_sequence == word and word not in stopped.text,
        "cancel_ok": cancelled,
    }


async def throughput(engine: Engine, concurrency: int, max_tokens: int) -> dict[str, float]:
    prompts = [
        engine.tokenize(chat.render(engine, [{"role": "user", "content": STORIES[i % len(STORIES)]}], None))
        for i in range(concurrency)
    ]
    params = SamplingParams(max_tokens=max_tokens, temperature=1.0, seed=0, logprobs=True)
    await collect(engine, prompts[0], SamplingParams(max_tokens=4))  # warm up
    started = time.perf_counter()
    single = await collect(engine, prompts[0], params)
    single_s = time.perf_counter() - started
    started = time.perf_counter()
    results = await asyncio.gather(*[collect(engine, p, params) for p in prompts])
    batch_s = time.perf_counter() - started
    tokens = sum(len(r[0].token_ids) for r in results)
    return {
        "single_tok_s": round(len(single[0].token_ids) / single_s, 1),
        "batched_tok_s": round(tokens / batch_s, 1),
        "batched_tokens": tokens,
        "batched_wall_s": round(batch_s, 2),
    }


async def run(engine_name: str, model: str, device: str, concurrency: int, max_tokens: int) -> dict[str, Any]:
    settings = InferenceSettings(
        engine=engine_name, model=model, device=device, torch_threads=0, max_batch_size=max(concurrency, 8), port=0
    )
    engine = load_engine(settings)
    started = time.perf_counter()
    await engine.start()
    out: dict[str, Any] = {"load_s": round(time.perf_counter() - started, 1)}
    try:
        out["checks"] = await checks(engine)
        out["throughput"] = await throughput(engine, concurrency, max_tokens)
    finally:
        await engine.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="", help="HF folder or hub id; default: the embedded SmolLM2, converted")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--no-baseline", action="store_true", help="skip the transformers-engine baseline")
    args = parser.parse_args()
    model = args.model or str(resolve_model("", default_cache_dir())[0])
    result: dict[str, Any] = {"model": model, "concurrency": args.concurrency, "max_tokens": args.max_tokens}
    try:
        result["vllm"] = asyncio.run(run("vllm", model, "cuda", args.concurrency, args.max_tokens))
    except Exception as err:  # report, then still measure the baseline
        result["vllm"] = {"error": f"{type(err).__name__}: {err}"}
    if not args.no_baseline:
        try:
            import torch

            device = "cuda" if torch.cuda.is_available() else "cpu"
            result["baseline_transformers"] = {
                "device": device,
                **asyncio.run(run("transformers", model, device, args.concurrency, args.max_tokens)),
            }
        except Exception as err:
            result["baseline_transformers"] = {"error": f"{type(err).__name__}: {err}"}
    vllm, base = result["vllm"].get("throughput"), result.get("baseline_transformers", {}).get("throughput")
    if vllm and base:
        result["batched_speedup_vs_baseline"] = round(vllm["batched_tok_s"] / base["batched_tok_s"], 1)
    print(json.dumps(result, indent=1))
    sys.exit(0 if "error" not in result["vllm"] else 1)


if __name__ == "__main__":
    main()
