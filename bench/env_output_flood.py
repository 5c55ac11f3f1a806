"""The env service's memory under an output flood: N commands that each print M MiB, their results read back
whole through the SDK (WaitExec, then ReadExecOutput for what does not fit in one message). Prints the
service's RSS after a warm-up and at the end (it must stay flat: output beyond a small head spools to files),
the throughput, and a bare `head -c` into /dev/null in the same run as the peer. One JSON object.

    python bench/env_output_flood.py [--execs 1000] [--mib 32] [--image host]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import time
from pathlib import Path

from env_service import env_service

from orchard import AsyncSandboxClient


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


async def flood(address: str, pid: int, image: str, execs: int, mib: int, warmup: int) -> dict[str, object]:
    size = mib << 20
    rss: list[tuple[int, float]] = [(0, rss_mib(pid))]
    async with AsyncSandboxClient(target=address) as client:
        sandbox = await client.create_sandbox(image)
        try:
            started = time.monotonic()
            for i in range(1, execs + 1):
                result = await sandbox.exec(f"head -c {size} /dev/zero", timeout=120, max_output=size)
                assert result.exit_code == 0 and len(result.stdout) == size, (result.exit_code, len(result.stdout))
                if i == warmup or i % max(1, execs // 10) == 0:
                    rss.append((i, rss_mib(pid)))
            elapsed = time.monotonic() - started
        finally:
            await sandbox.delete()
    rss.append((execs, rss_mib(pid)))
    after_warmup = next(r for i, r in rss if i >= warmup)
    return {
        "execs": execs,
        "mib_each": mib,
        "seconds": round(elapsed, 1),
        "mib_per_s": round(execs * mib / elapsed, 1),
        "rss_mib_start": round(rss[0][1], 1),
        "rss_mib_after_warmup": round(after_warmup, 1),
        "rss_mib_end": round(rss[-1][1], 1),
        "rss_growth_after_warmup_mib": round(rss[-1][1] - after_warmup, 1),
        "rss_samples": [[i, round(r, 1)] for i, r in rss],
    }


def bare_mib_per_s(mib: int, n: int = 20) -> float:
    started = time.monotonic()
    for _ in range(n):
        subprocess.run(["head", "-c", str(mib << 20), "/dev/zero"], stdout=subprocess.PIPE, check=True)
    return round(n * mib / (time.monotonic() - started), 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--execs", type=int, default=1000)
    parser.add_argument("--mib", type=int, default=32)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--image", default="host")
    args = parser.parse_args()
    load_start = os.getloadavg()[0]
    # Retention small enough that the spool files of this run come and go, as they would over an hour of rollouts.
    with env_service("--max-retained-output-bytes", str(512 << 20)) as (address, proc):
        figures = asyncio.run(flood(address, proc.pid, args.image, args.execs, args.mib, args.warmup))
    figures["bare_subprocess_pipe_mib_per_s"] = bare_mib_per_s(args.mib)
    figures["ratio_to_bare"] = round(figures["mib_per_s"] / figures["bare_subprocess_pipe_mib_per_s"], 3)  # type: ignore[operator]
    figures["loadavg_start_end"] = [round(load_start, 2), round(os.getloadavg()[0], 2)]
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
