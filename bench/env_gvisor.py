"""gVisor's cost on the docker backend: create -> first exec and exec of `true`, ISOLATION_GVISOR (runsc, ptrace
platform) against ISOLATION_CONTAINER (runc) on the same engine and image, alternated in blocks in one run.
Starts a private podman (tests/integration/podman_engine.py) and `orchard serve env --backend docker`; needs
podman, runsc, the python:3.11-slim image built and the native agent (scripts/build_agent.sh). One JSON object.

    python bench/env_gvisor.py [--creates 10] [--execs 100] [--blocks 4]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "integration"))

from env_service import env_service  # noqa: E402
from podman_engine import PodmanEngine  # noqa: E402

from orchard import AsyncSandboxClient  # noqa: E402
from orchard.services.env.images import default_images_dir  # noqa: E402

IMAGE = "python:3.11-slim"
ISOLATIONS = {"runc": "container", "gvisor": "gvisor"}


def ms(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {
        "p50_ms": round(statistics.median(ordered) * 1e3, 1),
        "p90_ms": round(ordered[int(0.9 * (len(ordered) - 1))] * 1e3, 1),
        "n": len(ordered),
    }


async def measure(address: str, creates: int, execs: int, blocks: int) -> dict[str, object]:
    create_s: dict[str, list[float]] = {k: [] for k in ISOLATIONS}
    exec_s: dict[str, list[float]] = {k: [] for k in ISOLATIONS}
    async with AsyncSandboxClient(target=address) as client:
        for _ in range(blocks):
            for name, isolation in ISOLATIONS.items():  # A then B in every block: the load hits both alike
                for _ in range(creates // blocks or 1):
                    started = time.perf_counter()
                    sandbox = await client.create_sandbox(IMAGE, isolation=isolation)
                    assert (await sandbox.exec("true")).exit_code == 0
                    create_s[name].append(time.perf_counter() - started)
                    for _ in range(execs // blocks or 1):
                        started = time.perf_counter()
                        await sandbox.exec("true")
                        exec_s[name].append(time.perf_counter() - started)
                    await sandbox.delete()
    out: dict[str, object] = {f"create_to_first_exec_{k}": ms(v) for k, v in create_s.items()}
    out |= {f"exec_true_{k}": ms(v) for k, v in exec_s.items()}
    out["create_ratio_gvisor_to_runc"] = round(
        statistics.median(create_s["gvisor"]) / statistics.median(create_s["runc"]), 2
    )
    out["exec_ratio_gvisor_to_runc"] = round(statistics.median(exec_s["gvisor"]) / statistics.median(exec_s["runc"]), 2)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--creates", type=int, default=12)
    parser.add_argument("--execs", type=int, default=120)
    parser.add_argument("--blocks", type=int, default=4)
    args = parser.parse_args()
    runc = shutil.which("runc")
    assert runc and shutil.which("runsc") and shutil.which("podman"), "needs podman, runc and runsc (install.sh)"
    agent = subprocess.run([str(ROOT / "scripts" / "build_agent.sh")], capture_output=True, text=True, check=True)
    load_start = os.getloadavg()[0]
    engine = PodmanEngine(runc)
    try:
        engine.import_rootfs(default_images_dir() / IMAGE.replace(":", "_") / "rootfs", f"localhost/orchard-{IMAGE}")
        flags = (
            "--backend",
            "docker",
            "--docker-host",
            engine.host,
            "--docker-gvisor-host",
            engine.gvisor_host,
            "--agent-path",
            agent.stdout.strip(),
        )
        with env_service(*flags) as (address, _):
            figures = asyncio.run(measure(address, args.creates, args.execs, args.blocks))
    finally:
        engine.close()
    figures["runsc"] = subprocess.run(["runsc", "--version"], capture_output=True, text=True).stdout.split("\n")[0]
    figures["platform"] = "ptrace"
    figures["loadavg_start_end"] = [round(load_start, 2), round(os.getloadavg()[0], 2)]
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
