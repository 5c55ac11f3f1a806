"""Run inside the cgroup v2 VM (test_env_cgroup_v2_vm.py), whose kernel has no nftables `inet` family: an env service
held to nftables (egress_firewall="nftables", where "auto" takes legacy iptables there) refuses a sandbox with an
egress allowlist, saying what the kernel lacks, and leaves no sandbox, network namespace or veth behind. Prints one
JSON object."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

from orchard.errors import FailedPrecondition
from orchard.sdk import AsyncSandboxClient
from orchard.services.env.server import build
from orchard.services.env.settings import EnvSettings


async def main(state_dir: Path) -> None:
    server, manager = await build(
        EnvSettings(port=0, state_dir=state_dir, log_format="text", egress_firewall="nftables")
    )
    port = await server.start()
    try:
        async with await AsyncSandboxClient.connect(f"127.0.0.1:{port}") as client:
            try:
                await client.create_sandbox("host", block_network=False)
                refused = ""
            except FailedPrecondition as err:
                refused = str(err)
            sandboxes = [sb.sandbox_id async for sb in client.list_sandboxes()]
    finally:
        await server.stop()
    ip = ["ip", "netns", "list"], ["ip", "-o", "link", "show", "type", "veth"]
    left = [line for argv in ip for line in subprocess.run(argv, capture_output=True, text=True).stdout.splitlines()]
    print(json.dumps({"refused": refused, "sandboxes": sandboxes, "left": left}))


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1])))
