"""Orchard Env against what users would pick instead, alternated in blocks within one run (so load drifts hit every
contender alike): exec of `true` through the sync SDK (a string, run as `bash -c` in the sandbox, and an argv, run with no shell) against a bare `subprocess.run(["true"])`, `bash -c true`,
bubblewrap per command (the namespaces a sandbox has), `podman exec` into a running container and SWE-ReX (its
remote `execute`, and a bash session); create → first exec → delete against `podman run --rm` and bwrap. Starts
its own env service and `swerex-remote`; the podman image is python:3.11-slim's rootfs, imported once. Prints one
JSON object with p50s, ratios (Orchard / peer) and the load average at start and end.

    python bench/env_peers.py [--rounds 6] [--block 40] [--create-block 4]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import shutil
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from env_service import env_service  # noqa: E402

from orchard import SandboxClient  # noqa: E402
from orchard.services.env.images import default_images_dir  # noqa: E402

IMAGE = "python:3.11-slim"
PODMAN_IMAGE = "localhost/orchard-peer-py311:latest"
# runc with cgroupfs and small ulimits: what podman needs on a cgroup v1 host as root (crun refuses hybrid cgroups;
# root cannot raise nofile to podman's default), as tests/integration/podman_engine.py configures it.
PODMAN = ["podman", "--runtime", "runc", "--cgroup-manager", "cgroupfs"]
PODMAN_RUN = [*PODMAN, "run", "--network", "none", "--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024"]
BWRAP = ["bwrap", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--unshare-all", "--die-with-parent"]


def podman_image() -> bool:
    """The image podman runs: python:3.11-slim's rootfs as the install built it, imported once."""
    if shutil.which("podman") is None:
        return False
    if subprocess.run(["podman", "image", "exists", PODMAN_IMAGE], check=False).returncode == 0:
        return True
    rootfs = default_images_dir() / IMAGE.replace(":", "_") / "rootfs"
    if not rootfs.is_dir():
        return False
    tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
    done = subprocess.run(["podman", "import", "-", PODMAN_IMAGE], stdin=tar.stdout, capture_output=True, check=False)
    tar.wait()
    return done.returncode == 0


def median_ms(values: list[float]) -> float:
    return round(statistics.median(values) * 1e3, 3)


class SweRex:
    """SWE-ReX's remote runtime (a `swerex-remote` server on loopback), driven from one event loop of its own."""

    def __init__(self) -> None:
        from swerex.runtime.remote import RemoteRuntime

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        token = secrets.token_hex(8)
        self.proc = subprocess.Popen(
            [str(Path(sys.executable).with_name("swerex-remote")), "--port", str(self.port), "--auth-token", token],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.loop = asyncio.new_event_loop()
        self.runtime = RemoteRuntime(host="http://127.0.0.1", port=self.port, auth_token=token)
        deadline = time.monotonic() + 60
        while not self.loop.run_until_complete(self.runtime.is_alive()):
            if time.monotonic() > deadline:
                raise SystemExit("swerex-remote did not start within 60 s")
            time.sleep(0.2)
        from swerex.runtime.abstract import CreateBashSessionRequest

        self.loop.run_until_complete(self.runtime.create_session(CreateBashSessionRequest()))

    def execute(self) -> None:
        from swerex.runtime.abstract import Command

        result = self.loop.run_until_complete(self.runtime.execute(Command(command=["true"])))
        assert result.exit_code == 0, result

    def session(self) -> None:
        from swerex.runtime.abstract import BashAction

        result = self.loop.run_until_complete(self.runtime.run_in_session(BashAction(command="true")))
        assert result.exit_code == 0, result

    def close(self) -> None:
        self.loop.run_until_complete(self.runtime.close())
        self.loop.close()
        self.proc.terminate()
        self.proc.wait(timeout=30)


def alternate(contenders: dict[str, Callable[[], object]], rounds: int, block: int) -> dict[str, list[float]]:
    """Each contender `block` calls at a time, the order rotating every round; per-call seconds by name."""
    times: dict[str, list[float]] = {name: [] for name in contenders}
    names = list(contenders)
    for name in names:  # one warm-up block each, not counted
        for _ in range(max(2, block // 4)):
            contenders[name]()
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            call = contenders[name]
            for _ in range(block):
                start = time.perf_counter()
                call()
                times[name].append(time.perf_counter() - start)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--block", type=int, default=40, help="exec calls per contender per round")
    parser.add_argument("--create-block", type=int, default=4, help="creates per contender per round")
    args = parser.parse_args()
    load_start = os.getloadavg()
    has_podman = podman_image()
    swerex = SweRex()
    container = ""
    try:
        if has_podman:
            container = subprocess.run(
                [*PODMAN_RUN, "-d", PODMAN_IMAGE, "sleep", "infinity"],
                capture_output=True, text=True, check=True,
            ).stdout.strip()  # fmt: skip
        with env_service() as (address, _), SandboxClient.connect(target=address) as client:
            with client.create_sandbox(IMAGE) as sandbox:

                def orchard_exec() -> None:
                    assert sandbox.exec("true").exit_code == 0

                def orchard_argv() -> None:  # argv: the agent starts the program itself, as subprocess.run does
                    assert sandbox.exec(["true"]).exit_code == 0

                execs: dict[str, Callable[[], object]] = {
                    "orchard_sdk_exec": orchard_exec,
                    "orchard_sdk_exec_argv": orchard_argv,
                    "subprocess_run": lambda: subprocess.run(["true"], check=True),
                    "bash_c": lambda: subprocess.run(["bash", "-c", "true"], check=True),
                    "bwrap_per_command": lambda: subprocess.run([*BWRAP, "true"], check=True),
                    "swerex_execute": swerex.execute,
                    "swerex_session": swerex.session,
                }
                if container:
                    execs["podman_exec"] = lambda: subprocess.run([*PODMAN, "exec", container, "true"], check=True)
                exec_times = alternate(execs, args.rounds, args.block)

            def orchard_create() -> None:
                with client.create_sandbox(IMAGE) as fresh:
                    assert fresh.exec("true").exit_code == 0

            creates: dict[str, Callable[[], object]] = {
                "orchard_create_exec_delete": orchard_create,
                "bwrap_per_command": lambda: subprocess.run([*BWRAP, "true"], check=True),
            }
            if has_podman:
                creates["podman_run_rm"] = lambda: subprocess.run(
                    [*PODMAN_RUN, "--rm", PODMAN_IMAGE, "true"], check=True
                )
            create_times = alternate(creates, args.rounds, args.create_block)
    finally:
        swerex.close()
        if container:
            subprocess.run([*PODMAN, "rm", "-f", "-t", "0", container], capture_output=True, check=False)
    exec_p50 = {name: median_ms(v) for name, v in exec_times.items()}
    create_p50 = {name: median_ms(v) for name, v in create_times.items()}
    ours, ours_create = exec_p50["orchard_sdk_exec"], create_p50["orchard_create_exec_delete"]
    ours_argv = exec_p50["orchard_sdk_exec_argv"]
    print(
        json.dumps(
            {
                "bench": "env_peers",
                "image": IMAGE,
                "cores": os.cpu_count(),
                "rounds": args.rounds,
                "exec_true_p50_ms": exec_p50,
                "exec_ratio_orchard_over": {
                    k: round(ours / v, 2) for k, v in exec_p50.items() if k != "orchard_sdk_exec"
                },
                "exec_argv_ratio_orchard_over": {
                    k: round(ours_argv / v, 2) for k, v in exec_p50.items() if not k.startswith("orchard_")
                },
                "exec_calls_each": len(exec_times["orchard_sdk_exec"]),
                "create_first_exec_p50_ms": create_p50,
                "create_ratio_orchard_over": {
                    k: round(ours_create / v, 2) for k, v in create_p50.items() if k != "orchard_create_exec_delete"
                },
                "create_calls_each": len(create_times["orchard_create_exec_delete"]),
                "target_exec_ratio_to_subprocess": 3.0,
                "loadavg_start": [round(x, 2) for x in load_start],
                "loadavg_end": [round(x, 2) for x in os.getloadavg()],
            }
        )
    )


if __name__ == "__main__":
    main()
