"""Orchard Env latency: exec round trip (`true`) through the SDK against a bare subprocess in this process,
and sandbox create → ready, with the service's default limits and with every limit set (cpu, memory, pids
and a disk cap). Starts its own env service (`orchard serve env`) on a free port; prints one JSON.

    python bench/env_latency.py [--execs 300] [--creates 20] [--image host]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import time

import grpc
from env_service import env_service

from orchard import AsyncSandboxClient, SandboxClient
from orchard.env.v1 import env_pb2 as pb
from orchard.env.v1 import env_pb2_grpc
from orchard.sdk import AsyncSandbox

ALL_LIMITS = pb.Resources(cpu_millis=1000, memory_bytes=512 << 20, pids=256, disk_bytes=1 << 30)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


def summary_ms(values: list[float]) -> dict[str, float]:
    return {
        "p50_ms": round(percentile(values, 50) * 1e3, 3),
        "p99_ms": round(percentile(values, 99) * 1e3, 3),
        "mean_ms": round(statistics.fmean(values) * 1e3, 3),
        "n": len(values),
    }


def timed(fn: object, n: int) -> list[float]:
    out = []
    for _ in range(n):
        start = time.perf_counter()
        fn()  # type: ignore[operator]
        out.append(time.perf_counter() - start)
    return out


async def concurrent_execs(address: str, image: str, clients: int, rounds: int) -> tuple[list[float], float]:
    """`clients` clients at once, each with its own sandbox, each running `true` `rounds` times back to back."""
    async with AsyncSandboxClient(target=address) as client:
        sandboxes = await asyncio.gather(*(client.create_sandbox(image) for _ in range(clients)))
        latencies: list[float] = []

        async def one_client(sandbox: AsyncSandbox) -> None:
            for _ in range(rounds):
                start = time.perf_counter()
                result = await sandbox.exec("true")
                latencies.append(time.perf_counter() - start)
                assert result.exit_code == 0, result

        start = time.perf_counter()
        await asyncio.gather(*(one_client(sb) for sb in sandboxes))
        wall = time.perf_counter() - start
        await asyncio.gather(*(sb.delete() for sb in sandboxes))
    return latencies, wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--execs", type=int, default=300)
    parser.add_argument("--creates", type=int, default=20)
    parser.add_argument("--image", default="host")
    parser.add_argument("--deletes", type=int, default=10, help="deletes of sandboxes holding 20,000 files")
    parser.add_argument("--clients", type=int, default=100, help="concurrent clients for the loaded figure")
    parser.add_argument("--rounds", type=int, default=20, help="execs per concurrent client")
    args = parser.parse_args()

    with env_service() as (address, _):
        with SandboxClient.connect(target=address) as client:
            creates: list[float] = []
            for _ in range(args.creates):
                start = time.perf_counter()
                sandbox = client.create_sandbox(args.image)
                creates.append(time.perf_counter() - start)
                sandbox.delete()
            limited: list[float] = []
            with grpc.insecure_channel(address) as channel:
                stub = env_pb2_grpc.EnvServiceStub(channel)
                for _ in range(args.creates):
                    start = time.perf_counter()
                    created = stub.CreateSandbox(
                        pb.CreateSandboxRequest(image=args.image, resources=ALL_LIMITS), timeout=30
                    ).sandbox
                    limited.append(time.perf_counter() - start)
                    stub.DeleteSandbox(pb.DeleteSandboxRequest(sandbox_id=created.sandbox_id), timeout=30)
            with client.create_sandbox(args.image) as sandbox:
                timed(lambda: sandbox.exec("true"), 20)  # warm-up
                sdk = timed(lambda: sandbox.exec("true"), args.execs)
            deletes = []  # of sandboxes whose writable layer holds a venv-sized tree (20,000 files)
            for _ in range(args.deletes):
                sandbox = client.create_sandbox(args.image)
                sandbox.exec(
                    'mkdir -p /tmp/tree && cd /tmp/tree && python3 -c "import os\n'
                    "for d in range(200):\n os.mkdir(str(d))\n for f in range(100): "
                    "open(f'{d}/{f}', 'w').write('x' * 200)\""
                )
                start = time.perf_counter()
                sandbox.delete()
                deletes.append(time.perf_counter() - start)
        concurrent, wall = asyncio.run(concurrent_execs(address, args.image, args.clients, args.rounds))

    timed(lambda: subprocess.run(["true"]), 20)
    bare = timed(lambda: subprocess.run(["true"]), args.execs)
    sdk_s, bare_s, create_s, limited_s = summary_ms(sdk), summary_ms(bare), summary_ms(creates), summary_ms(limited)
    ratio = round(sdk_s["p50_ms"] / bare_s["p50_ms"], 2)
    print(
        json.dumps(
            {
                "benchmark": "env_latency",
                "image": args.image,
                "cpus": os.cpu_count(),
                "exec_true_sdk": sdk_s,
                "baseline_subprocess_true": bare_s,
                "exec_p50_ratio_to_subprocess": ratio,
                "create_ready": create_s,
                "create_ready_all_limits": limited_s,
                "delete_with_20k_files": summary_ms(deletes),
                "exec_true_concurrent": {
                    **summary_ms(concurrent),
                    "clients": args.clients,
                    "execs_per_s": round(len(concurrent) / wall, 1),
                },
                "targets": {"exec_p50_ms": 5.0, "exec_p50_ratio": 3.0, "create_p50_ms": 100.0, "delete_p50_ms": 50.0},
                "meets_targets": (
                    sdk_s["p50_ms"] <= 5.0
                    and ratio <= 3.0
                    and max(create_s["p50_ms"], limited_s["p50_ms"]) <= 100.0
                    and summary_ms(deletes)["p50_ms"] <= 50.0
                ),
            }
        )
    )


if __name__ == "__main__":
    main()
