"""Orchard Env at scale: create N sandboxes that are all alive at once, run a command in each, delete them.

Starts its own env service (`orchard serve env`) on a free port and drives it with the async SDK, with at most
--concurrency calls in flight. Prints one JSON object: success counts, end-to-end time, p50/p90/p99 of create,
exec and delete, the service's peak memory, and memory per idle sandbox (the machine's used memory with all
sandboxes alive and idle, minus before, divided by N) and the PSS of the sandboxes' own processes (bwrap and the
in-sandbox agent) per sandbox. The baseline is the same machine before the run.

    python bench/env_stress.py [--sandboxes 1000] [--concurrency 64] [--image python:3.11-slim]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from collections.abc import Awaitable
from typing import TypeVar

from env_service import env_service

from orchard import AsyncSandboxClient


def percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    ordered = sorted(values)

    def at(q: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1e3, 1)

    return {"p50_ms": at(0.50), "p90_ms": at(0.90), "p99_ms": at(0.99), "max_ms": round(ordered[-1] * 1e3, 1)}


def used_memory_bytes() -> int:
    """MemTotal - MemAvailable: what the machine as a whole is using."""
    info = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in open("/proc/meminfo")}
    return info["MemTotal"] - info["MemAvailable"]


def descendants(root: int) -> list[int]:
    """The pids of a process's descendants (every sandbox process, for the service)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                ppid = int(open(f"/proc/{entry}/stat").read().rsplit(")", 1)[1].split()[1])
            except OSError:
                continue
            children.setdefault(ppid, []).append(int(entry))
    found, stack = [], list(children.get(root, []))
    while stack:
        pid = stack.pop()
        found.append(pid)
        stack += children.get(pid, [])
    return found


def memory_bytes(pid: int, key: str, table: str) -> int:
    """One figure (e.g. VmRSS of status, Pss of smaps_rollup) of a process, 0 once it is gone."""
    try:
        for line in open(f"/proc/{pid}/{table}"):
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def tree_rss_bytes(root: int) -> int:
    """RSS of a process and all its descendants (the service and every sandbox process)."""
    return sum(memory_bytes(pid, "VmRSS", "status") for pid in [root, *descendants(root)])


def sandboxes_pss_bytes(root: int) -> int:
    """PSS of the service's descendants: every sandbox's processes (bwrap and the in-sandbox agent), each shared
    page counted once over all of them."""
    return sum(memory_bytes(pid, "Pss", "smaps_rollup") for pid in descendants(root))


async def sample_peak(pid: int, peak: dict[str, int], stop: asyncio.Event) -> None:
    while not stop.is_set():
        peak["machine"] = max(peak["machine"], used_memory_bytes())
        peak["service_tree_rss"] = max(peak["service_tree_rss"], await asyncio.to_thread(tree_rss_bytes, pid))
        try:
            await asyncio.wait_for(stop.wait(), 0.5)
        except TimeoutError:
            pass


T = TypeVar("T")


async def timed(coro: Awaitable[T], bucket: list[float]) -> T:
    start = time.perf_counter()
    result = await coro
    bucket.append(time.perf_counter() - start)
    return result


async def run(args: argparse.Namespace, address: str, service_pid: int) -> dict[str, object]:
    creates: list[float] = []
    execs: list[float] = []
    deletes: list[float] = []
    errors: dict[str, int] = {}
    gate = asyncio.Semaphore(args.concurrency)

    def failed(stage: str, err: BaseException) -> None:
        key = f"{stage}: {type(err).__name__}: {str(err)[:120]}"
        errors[key] = errors.get(key, 0) + 1

    baseline = used_memory_bytes()
    peak = {"machine": baseline, "service_tree_rss": 0}
    stop = asyncio.Event()
    sampler = asyncio.create_task(sample_peak(service_pid, peak, stop))
    async with AsyncSandboxClient(target=address, auto_cleanup=True, timeout=120) as client:
        begin = time.perf_counter()

        async def create_one(i: int):  # type: ignore[no-untyped-def]
            async with gate:
                try:
                    return await timed(client.create_sandbox(args.image, labels={"bench": "stress"}), creates)
                except Exception as err:
                    failed("create", err)
                    return None

        sandboxes = [s for s in await asyncio.gather(*(create_one(i) for i in range(args.sandboxes))) if s]
        all_alive = time.perf_counter()
        await asyncio.sleep(2)  # let the sandboxes settle, then measure them idle
        idle_used = used_memory_bytes()
        idle_tree = await asyncio.to_thread(tree_rss_bytes, service_pid)
        idle_pss = await asyncio.to_thread(sandboxes_pss_bytes, service_pid)

        async def exec_one(sandbox) -> bool:  # type: ignore[no-untyped-def]
            async with gate:
                try:
                    result = await timed(sandbox.exec(f"echo ok-{sandbox.sandbox_id}"), execs)
                except Exception as err:
                    failed("exec", err)
                    return False
                if result.stdout == f"ok-{sandbox.sandbox_id}\n":
                    return True
                mismatches.append(  # what a wrong answer was: the first few, whole enough to read
                    {"exit_code": result.exit_code, "stdout": result.stdout[:200], "stderr": result.stderr[:200]}
                )
                return False

        mismatches: list[dict[str, object]] = []
        exec_ok = sum(await asyncio.gather(*(exec_one(s) for s in sandboxes)))

        async def delete_one(sandbox) -> bool:  # type: ignore[no-untyped-def]
            async with gate:
                try:
                    await timed(sandbox.delete(), deletes)
                except Exception as err:
                    failed("delete", err)
                    return False
                return True

        delete_ok = sum(await asyncio.gather(*(delete_one(s) for s in sandboxes)))
        end = time.perf_counter()
    stop.set()
    await sampler
    n = args.sandboxes
    return {
        "benchmark": "env_stress",
        "image": args.image,
        "cpus": os.cpu_count(),
        "sandboxes": n,
        "concurrency": args.concurrency,
        "created": len(sandboxes),
        "exec_ok": exec_ok,
        "exec_mismatches": mismatches[:5],
        "deleted": delete_ok,
        "success_rate": round(min(len(sandboxes), exec_ok, delete_ok) / n, 4),
        "all_alive_after_s": round(all_alive - begin, 2),
        "end_to_end_s": round(end - begin, 2),
        "create": percentiles(creates),
        "exec": percentiles(execs),
        "delete": percentiles(deletes),
        "baseline_machine_used_mib": round(baseline / 2**20),
        "peak_machine_used_mib": round(peak["machine"] / 2**20),
        "peak_service_tree_rss_mib": round(peak["service_tree_rss"] / 2**20),
        "idle_mib_per_sandbox": round((idle_used - baseline) / max(1, len(sandboxes)) / 2**20, 2),
        "idle_service_tree_rss_mib_per_sandbox": round(idle_tree / max(1, len(sandboxes)) / 2**20, 2),
        "idle_sandbox_pss_mib_per_sandbox": round(idle_pss / max(1, len(sandboxes)) / 2**20, 2),
        "errors": errors,
        "targets": {"success_rate": 1.0, "end_to_end_s": 60, "idle_mib_per_sandbox": 10},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sandboxes", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--image", default="python:3.11-slim")
    args = parser.parse_args()
    with env_service("--max-sandboxes", str(max(2000, args.sandboxes))) as (address, service):
        report = asyncio.run(run(args, address, service.pid))
    print(json.dumps(report))


if __name__ == "__main__":
    main()
