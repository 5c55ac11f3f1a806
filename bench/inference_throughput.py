"""Inference throughput: aggregate generated tokens/s of N concurrent chat requests through the inference service
(gRPC, its dynamic batching) against the same N requests run one after another with plain transformers
`generate` in this process (the baseline, same weights, same torch threads), plus time to first token.
Starts its own `orchard serve inference` on a free port with the embedded model; prints one JSON object.

    python bench/inference_throughput.py [--requests 8] [--max-tokens 48] [--threads 1]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import grpc

from orchard.inference.v1 import inference_pb2 as pb
from orchard.inference.v1 import inference_pb2_grpc
from orchard.types.v1 import types_pb2

ORCHARD = str(Path(sys.executable).with_name("orchard"))
# Open-ended prompts, so each answer runs to --max-tokens as throughput benchmarks fix output length (a batch
# whose short answers end early measures the tail, not the batching). Both arms get the same prompts.
PROMPTS = [
    "Write a short story about a robot who learns to paint.",
    "Explain in detail how a bicycle works.",
    "Describe a walk through a busy city market.",
    "Write a letter to a friend about your summer holiday.",
    "Explain how plants grow, step by step.",
    "Describe the history of the printing press.",
    "Write a poem about the ocean at night.",
    "Explain how a computer runs a program.",
    "Describe your ideal house and its garden.",
    "Write a story about a dragon who is afraid of the dark.",
    "Explain why exercise is good for health.",
    "Describe how bread is made, from wheat to loaf.",
    "Write a diary entry of a sailor on a long voyage.",
    "Explain how rain forms and falls.",
    "Describe a day in the life of a honeybee.",
    "Write a speech for the opening of a new library.",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def chat_request(prompt: str, max_tokens: int) -> pb.ChatRequest:
    return pb.ChatRequest(
        messages=[types_pb2.Message(role=types_pb2.ROLE_USER, content=prompt)],
        sampling=pb.SamplingParams(temperature=0.0, max_tokens=max_tokens),
    )


def baseline(prompts: list[str], max_tokens: int, threads: int) -> dict[str, float]:
    """The prompts one after another through plain transformers generate (greedy), in this process."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from orchard.model_files import (
        default_cache_dir,
        resolve_model,
    )

    torch.set_num_threads(threads)
    folder, _ = resolve_model("", default_cache_dir())  # the service's own converted copy of the embedded GGUF
    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    tokens = 0
    ttfts = []
    started = time.perf_counter()
    with torch.inference_mode():
        for prompt in prompts:
            text = tok.apply_chat_template(
                [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=False
            )
            enc = tok(text, return_tensors="pt", add_special_tokens=False)
            t0 = time.perf_counter()
            model.generate(**enc, max_new_tokens=1, do_sample=False)
            ttfts.append(time.perf_counter() - t0)
            out = model.generate(**enc, max_new_tokens=max_tokens, do_sample=False)
            tokens += int(out.shape[1] - enc["input_ids"].shape[1])
    # The first-token probes are not part of the generation time.
    seconds = time.perf_counter() - started - sum(ttfts)
    return {
        "tokens": tokens,
        "seconds": round(seconds, 3),
        "tokens_per_s": round(tokens / seconds, 2),
        "ttft_p50_ms": round(statistics.median(ttfts) * 1e3, 1),
    }


async def service_run(address: str, prompts: list[str], max_tokens: int) -> dict[str, float]:
    """The prompts at once through Chat, then the same again streamed for time to first token."""
    async with grpc.aio.insecure_channel(address) as channel:
        stub = inference_pb2_grpc.InferenceServiceStub(channel)
        await stub.Chat(chat_request("Say hi.", 4), timeout=300)  # warm-up
        started = time.perf_counter()
        replies = await asyncio.gather(*(stub.Chat(chat_request(p, max_tokens), timeout=600) for p in prompts))
        seconds = time.perf_counter() - started
        tokens = sum(r.usage.completion_tokens for r in replies)

        async def first_token(prompt: str) -> float:
            t0 = time.perf_counter()
            request = pb.StreamChatRequest(
                messages=[types_pb2.Message(role=types_pb2.ROLE_USER, content=prompt)],
                sampling=pb.SamplingParams(temperature=0.0, max_tokens=max_tokens),
            )
            async for event in stub.StreamChat(request, timeout=600):
                if event.HasField("delta") and event.delta.token_ids:
                    return time.perf_counter() - t0
            return time.perf_counter() - t0

        alone = await first_token(prompts[0])
        loaded = await asyncio.gather(*(first_token(p) for p in prompts))
    return {
        "tokens": tokens,
        "seconds": round(seconds, 3),
        "tokens_per_s": round(tokens / seconds, 2),
        "ttft_alone_ms": round(alone * 1e3, 1),
        "ttft_p50_concurrent_ms": round(statistics.median(loaded) * 1e3, 1),
        "tokens_per_request": [r.usage.completion_tokens for r in replies],
        "sample": replies[0].choices[0].text[:80],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--threads", type=int, default=1, help="torch threads, for the service and the baseline")
    args = parser.parse_args()
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(args.requests)]

    port = free_port()
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen(
        [
            ORCHARD,
            "serve",
            "inference",
            "--port",
            str(port),
            "--log-level",
            "WARNING",
            "--torch-threads",
            str(args.threads),
        ],
        env=env,
        stdout=subprocess.DEVNULL,
    )
    try:
        address = f"127.0.0.1:{port}"
        load_started = time.perf_counter()
        with grpc.insecure_channel(address) as channel:
            grpc.channel_ready_future(channel).result(timeout=300)
        load_s = time.perf_counter() - load_started
        served = asyncio.run(service_run(address, prompts, args.max_tokens))
        base = baseline(prompts, args.max_tokens, args.threads)
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    print(
        json.dumps(
            {
                "bench": "inference_throughput",
                "requests": args.requests,
                "max_tokens": args.max_tokens,
                "torch_threads": args.threads,
                "service_start_s": round(load_s, 2),
                "service": served,
                "sequential_generate": base,
                "ratio": round(served["tokens_per_s"] / base["tokens_per_s"], 2),
                "target_ratio": 3.0,
            }
        )
    )


if __name__ == "__main__":
    main()
