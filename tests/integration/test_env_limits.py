"""Resource limits of the local backend, enforced for real: memory (OOM), CPU quota, process count, disk cap. They
run on this machine's cgroup v1 controllers, and on a pure cgroup v2 hierarchy in the VM of test_env_cgroup_v2_vm.py."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
import time
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

import grpc
import pytest
from env_helpers import EnvServer, StartEnv, create, delete_quietly, needs_sandboxes, run

from orchard.env.v1 import env_pb2 as pb
from orchard.env.v1 import env_pb2_grpc
from orchard.errors import FailedPrecondition
from orchard.services.env.backends.cgroups import CGROUP_FS, CONTROLLERS, SERVICE_LEAF, mounted_hierarchy, parent_name

HIERARCHY = mounted_hierarchy(Path("/proc/self/mountinfo").read_text())
pytestmark = [
    needs_sandboxes,
    pytest.mark.skipif(
        HIERARCHY is None, reason="resource limits need cgroup v2 or the cgroup v1 controllers memory, cpu and pids"
    ),
    pytest.mark.timeout(60),
]

MiB = 1 << 20
# Where a service's groups are: v1 has a tree per controller, v2 one tree (here its root is delegated to the tests).
CGROUP_ROOTS = [CGROUP_FS / c for c in CONTROLLERS] if HIERARCHY == "v1" else [CGROUP_FS]
BUSY_ONE_CPU_SECOND = """
import time
wall, cpu = time.monotonic(), time.process_time()
while time.process_time() - cpu < 1.0:
    pass
print(time.monotonic() - wall)
"""
EVERY_LIMIT = pb.Resources(cpu_millis=500, memory_bytes=64 * MiB, pids=32, disk_bytes=8 * MiB)
FORK_BOMB = ":(){ :|:& };:; sleep 10"  # the sleep keeps the command running while the bomb goes off


async def rpc_error(call: Awaitable[Any]) -> grpc.aio.AioRpcError:
    """The error `call` fails with; fails the test when it succeeds."""
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call
    return info.value


def cgroups_of(state_dir: Path) -> list[str]:
    """The cgroups of the service on state_dir: its parent group in each controller and the sandboxes' groups."""
    name = parent_name(state_dir)
    return sorted(top for root in CGROUP_ROOTS for top, _, _ in os.walk(root) if name in Path(top).parts)


def mounts_under(state_dir: Path) -> list[str]:
    """Mount points under state_dir, and loop devices backed by files under it."""
    mounts = [
        line.split()[1]
        for line in Path("/proc/mounts").read_text().splitlines()
        if line.split()[1].startswith(str(state_dir))
    ]
    loops = [
        f.parent.parent.name
        for f in Path("/sys/block").glob("loop*/loop/backing_file")
        if f.read_text().startswith(str(state_dir))
    ]
    return mounts + loops


async def test_memory_hog_is_oom_killed_and_reported(env: EnvServer) -> None:
    """A command past the memory limit is OOM-killed and reported as such; its sandbox and others carry on."""
    limited = await create(env.stub, resources=pb.Resources(memory_bytes=128 * MiB))
    other = await create(env.stub)
    assert limited.resources.memory_bytes == 128 * MiB
    small = await run(env.stub, limited.sandbox_id, ["python3", "-c", "x = b'x' * (60 << 20)"])
    assert (small.state, small.oom_killed) == (pb.EXEC_STATE_SUCCEEDED, False)

    hog = await run(env.stub, limited.sandbox_id, ["python3", "-c", "x = b'x' * (500 << 20)"])
    assert (hog.state, hog.exit_code, hog.oom_killed) == (pb.EXEC_STATE_FAILED, 137, True)
    assert "out of memory" in hog.error and "128 MiB" in hog.error

    got = await env.stub.GetSandbox(pb.GetSandboxRequest(sandbox_id=limited.sandbox_id), timeout=5)
    assert got.sandbox.state == pb.SANDBOX_STATE_READY
    after = await run(env.stub, limited.sandbox_id, "echo still here")
    assert (after.state, after.stdout, after.oom_killed) == (pb.EXEC_STATE_SUCCEEDED, b"still here\n", False)
    big = await run(env.stub, other.sandbox_id, ["python3", "-c", "x = b'x' * (500 << 20); print(len(x) >> 20)"])
    assert (big.state, big.stdout) == (pb.EXEC_STATE_SUCCEEDED, b"500\n")


async def test_fork_bomb_is_contained(env: EnvServer) -> None:
    """A fork bomb under pids=64 hits the limit; the service, its sandbox and another sandbox carry on."""
    bombed = await create(env.stub, resources=pb.Resources(pids=64, cpu_millis=500))
    other = await create(env.stub)
    bomb = await run(env.stub, bombed.sandbox_id, FORK_BOMB, timeout=3)
    # The shell may not even get to fork its sleep; either way the command ends, its tree killed.
    assert bomb.state in (pb.EXEC_STATE_TIMED_OUT, pb.EXEC_STATE_FAILED)
    assert b"fork: retry: Resource temporarily unavailable" in bomb.stderr

    for sandbox in (bombed, other):
        after = await run(env.stub, sandbox.sandbox_id, "echo fine; ls /proc | grep -c '^[0-9]'")
        assert after.state == pb.EXEC_STATE_SUCCEEDED and after.stdout.startswith(b"fine\n")
        assert int(after.stdout.split()[1]) < 10  # the bomb's processes are gone


async def test_cpu_quota_slows_a_busy_loop(env: EnvServer) -> None:
    """At 500 millis, one CPU-second of busy loop takes about two seconds of wall time."""
    sandbox = await create(env.stub, resources=pb.Resources(cpu_millis=500))
    busy = await run(env.stub, sandbox.sandbox_id, ["python3", "-c", BUSY_ONE_CPU_SECOND])
    assert busy.state == pb.EXEC_STATE_SUCCEEDED
    assert float(busy.stdout) >= 1.8


async def test_disk_cap_gives_enospc(env: EnvServer) -> None:
    """A writer past a 20 MiB disk cap gets ENOSPC; df shows the cap; other sandboxes write on."""
    capped = await create(env.stub, resources=pb.Resources(disk_bytes=20 * MiB))
    other = await create(env.stub)
    df = await run(env.stub, capped.sandbox_id, "df -B1 --output=size / /tmp | tail -n +2")
    root_size, tmp_size = map(int, df.stdout.split())
    assert 16 * MiB <= root_size <= 20 * MiB and tmp_size == 20 * MiB

    write = await run(env.stub, capped.sandbox_id, "head -c 50M /dev/zero > big")
    assert write.state == pb.EXEC_STATE_FAILED and b"No space left on device" in write.stderr
    again = await run(env.stub, capped.sandbox_id, "rm big && echo ok > small && cat small")
    assert (again.state, again.stdout) == (pb.EXEC_STATE_SUCCEEDED, b"ok\n")
    elsewhere = await run(env.stub, other.sandbox_id, "head -c 50M /dev/zero > big && stat -c %s big")
    assert (elsewhere.state, elsewhere.stdout) == (pb.EXEC_STATE_SUCCEEDED, b"52428800\n")


async def test_delete_removes_cgroups_and_mounts(env: EnvServer) -> None:
    """Deleting limited sandboxes removes their cgroups, their capped layers' mounts and loop devices."""
    state = env.settings.state_dir
    before = (cgroups_of(state), mounts_under(state))
    assert (len(before[0]), before[1]) == (len(CGROUP_ROOTS), [])  # the service's parent groups only
    sandboxes = await asyncio.gather(*(create(env.stub, resources=EVERY_LIMIT) for _ in range(3)))
    assert len(cgroups_of(state)) == len(CGROUP_ROOTS) * (1 + 3)
    # Per sandbox: the capped layer and its loop device; its overlay is mounted in a mount namespace of its own.
    assert len(mounts_under(state)) == 3 * 2
    for sandbox in sandboxes:
        await delete_quietly(env.stub, sandbox.sandbox_id)
    assert cgroups_of(state) == before[0]
    # The layers are unmounted and removed after DeleteSandbox answered (it does not wait for the sync).
    deadline = time.monotonic() + 60
    while mounts_under(state) != before[1] and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    assert mounts_under(state) == before[1]


async def test_restart_removes_what_a_crashed_service_left(start_env: StartEnv, tmp_path: Path) -> None:
    """A service killed with SIGKILL leaves cgroups and mounts behind; the next start on its state dir removes them."""
    state = tmp_path / "crashed"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    service = await asyncio.create_subprocess_exec(
        str(Path(sys.executable).with_name("orchard")),
        "serve",
        "env",
        "--port",
        str(port),
        "--state-dir",
        str(state),
        "--log-level",
        "WARNING",
        stdout=asyncio.subprocess.DEVNULL,
    )
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            await asyncio.wait_for(channel.channel_ready(), 30)
            stub = env_pb2_grpc.EnvServiceStub(channel)
            await create(stub, resources=EVERY_LIMIT)
    finally:
        service.send_signal(signal.SIGKILL)
        await service.wait()
    # Left on the host: the capped layer and its loop device (the overlay died with the sandbox's mount namespace).
    assert len(cgroups_of(state)) == len(CGROUP_ROOTS) * 2 and len(mounts_under(state)) == 2

    restarted = await start_env(state_dir=state)
    assert (len(cgroups_of(state)), mounts_under(state)) == (len(CGROUP_ROOTS), [])  # the new service's parents only
    sandbox = await create(restarted.stub)
    assert (await run(restarted.stub, sandbox.sandbox_id, "echo ok")).stdout == b"ok\n"


async def test_defaults_apply_and_show(start_env: StartEnv) -> None:
    """Service defaults fill the limits a create leaves at 0, and GetSandbox reports the limits in force."""
    env = await start_env(default_memory_bytes=256 * MiB, default_cpu_millis=1000)
    sandbox = await create(env.stub, resources=pb.Resources(pids=100))
    assert (
        sandbox.resources.memory_bytes,
        sandbox.resources.cpu_millis,
        sandbox.resources.pids,
        sandbox.resources.disk_bytes,
    ) == (256 * MiB, 1000, 100, 0)
    plain = await create((await start_env()).stub)
    assert plain.resources.pids == 4096  # the default process limit: a fork bomb stays in its sandbox


@pytest.mark.parametrize(
    ("resources", "words"),
    [
        pytest.param(pb.Resources(memory_bytes=1 << 50), ["memory_bytes", "machine's memory"], id="memory-beyond-ram"),
        pytest.param(pb.Resources(memory_bytes=1 * MiB), ["memory_bytes", "32 MiB"], id="memory-too-small"),
        pytest.param(
            pb.Resources(cpu_millis=1000 * (len(os.sched_getaffinity(0)) + 1)),
            ["cpu_millis", "CPUs"],
            id="cpu-beyond-cpus",
        ),
        pytest.param(pb.Resources(cpu_millis=5), ["cpu_millis", "between 10"], id="cpu-too-small"),
        pytest.param(pb.Resources(pids=5_000_000), ["pids", "pid_max"], id="pids-beyond-pid-max"),
        pytest.param(pb.Resources(pids=3), ["pids", "between 16"], id="pids-too-small"),
        pytest.param(pb.Resources(disk_bytes=1 << 60), ["disk_bytes", "free space"], id="disk-beyond-free-space"),
        pytest.param(pb.Resources(disk_bytes=1000), ["disk_bytes", "1 MiB"], id="disk-too-small"),
    ],
)
async def test_limits_beyond_the_machine_are_invalid(env: EnvServer, resources: pb.Resources, words: list[str]) -> None:
    """Limits this machine cannot give, or too small to start a sandbox, get INVALID_ARGUMENT and leave nothing."""
    before = (cgroups_of(env.settings.state_dir), mounts_under(env.settings.state_dir))
    err = await rpc_error(create(env.stub, resources=resources))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert all(word in err.details() for word in words), err.details()
    assert (cgroups_of(env.settings.state_dir), mounts_under(env.settings.state_dir)) == before


@pytest.mark.timeout(60)
def test_host_without_cgroups(tmp_path: Path) -> None:
    """On a host without cgroups (here: a mount namespace with an empty /sys/fs/cgroup) the service starts without
    its built-in pids default and says so; defaults the operator set explicitly stop it instead."""
    import socket
    import subprocess
    import sys
    import time

    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    orchard = str(Path(sys.executable).with_name("orchard"))

    def serve(*flags: str) -> tuple[subprocess.Popen[str], int]:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        script = 'mount -t tmpfs none /sys/fs/cgroup && exec "$@"'
        proc = subprocess.Popen(
            [
                "unshare",
                "-m",
                "sh",
                "-c",
                script,
                "sh",
                orchard,
                "serve",
                "env",
                "--port",
                str(port),
                "--state-dir",
                str(tmp_path / "state"),
                "--log-format",
                "text",
                *flags,
            ],
            stderr=subprocess.PIPE,
            text=True,
        )
        return proc, port

    proc, port = serve()
    try:
        deadline = time.monotonic() + 30
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            while True:
                assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
                try:
                    health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=1)
                    if health.status == health_pb2.HealthCheckResponse.SERVING:
                        break
                except grpc.RpcError:
                    pass
                assert time.monotonic() < deadline
                time.sleep(0.1)
    finally:
        proc.terminate()
        _, log = proc.communicate(timeout=30)
    assert "no default pids limit" in log
    refused, port = serve("--default-pids", "4096")
    _, log = refused.communicate(timeout=30)
    assert refused.returncode != 0 and "neither cgroup v2 mounted at /sys/fs/cgroup nor the v1 controllers" in log


async def test_limits_are_written_to_the_sandbox_group(env: EnvServer) -> None:
    """A sandbox's group holds its limits in the hierarchy's own files, and its processes."""
    sandbox = await create(env.stub, resources=pb.Resources(cpu_millis=500, memory_bytes=64 * MiB, pids=32))
    name = parent_name(env.settings.state_dir)
    found = {
        f"{Path(top).relative_to(root)}/{f}": (Path(top) / f).read_text().strip()
        for root in CGROUP_ROOTS
        for top, _, files in os.walk(root)
        if Path(top).name == sandbox.sandbox_id and Path(top).parent.name == name
        for f in files
        if f in {"memory.limit_in_bytes", "cpu.cfs_quota_us", "cpu.max", "memory.max", "memory.swap.max", "pids.max"}
    }
    if HIERARCHY == "v1":
        assert {k.split("/")[-1]: v for k, v in found.items()} == {
            "memory.limit_in_bytes": str(64 * MiB),
            "cpu.cfs_quota_us": "50000",
            "pids.max": "32",
        }
        return
    assert {k.split("/")[-1]: v for k, v in found.items()} == {
        "memory.max": str(64 * MiB),
        "memory.swap.max": "0",
        "cpu.max": "50000 100000",
        "pids.max": "32",
    }
    group = CGROUP_FS / next(iter(found)).rsplit("/", 1)[0]
    assert len((group / "cgroup.procs").read_text().split()) >= 2  # bwrap, its init and the agent
    own = Path("/proc/self/cgroup").read_text().strip().rsplit(":", 1)[1]
    assert Path(own).name == SERVICE_LEAF and group.parent.parent == CGROUP_FS / Path(own).parent.relative_to("/")


async def test_undelegated_cgroup_v2_subtree_is_refused(start_env: StartEnv) -> None:
    """Given a cgroup v2 subtree without the controllers, the service starts without its pids default, refuses
    limits naming what is missing and how to delegate them, and refuses explicit defaults at start-up."""
    v2_root = CGROUP_FS if HIERARCHY == "v2" else CGROUP_FS / "unified"  # a hybrid host's v2 mount
    if not (v2_root / "cgroup.controllers").exists():
        # Runs here (this hybrid host's empty v2 mount) and in the cgroup v2 VM (test_env_cgroup_v2_vm.py).
        pytest.skip(f"this host mounts no cgroup v2 hierarchy at {v2_root}, neither unified nor hybrid")
    outer = v2_root / f"orchard-test-{os.getpid()}"
    subtree = outer / "undelegated"  # outer hands nothing down: subtree's cgroup.controllers is empty
    subtree.mkdir(parents=True)
    try:
        env = await start_env(cgroup_root=subtree)
        assert env.settings.default_pids == 0
        err = await rpc_error(create(env.stub, resources=pb.Resources(memory_bytes=64 * MiB)))
        assert err.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert (
            f"needs the cgroup v2 controllers memory, cpu, pids, which are not delegated to {subtree}: "
            "run the service under systemd with Delegate=yes"
        ) in err.details(), err.details()
        assert (await create(env.stub)).state == pb.SANDBOX_STATE_READY
        with pytest.raises(FailedPrecondition, match="cgroup v2 controllers memory, cpu, pids"):
            await start_env(cgroup_root=subtree, default_pids=4096)
        assert [p for p in subtree.iterdir() if p.is_dir()] == []  # no groups made in it
    finally:
        subtree.rmdir()
        outer.rmdir()
