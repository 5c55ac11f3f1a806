"""The env service killed with SIGKILL and restarted: its sandboxes are cleaned up with the reason recorded, and
no process, mount, cgroup or network namespace is leaked (counted before and after)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest
from env_helpers import needs_sandboxes
from google.protobuf.duration_pb2 import Duration
from grpc_health.v1 import health_pb2, health_pb2_grpc

from orchard.env.v1 import env_pb2 as pb
from orchard.env.v1 import env_pb2_grpc
from orchard.services.env.backends.cgroups import CGROUP_FS, CONTROLLERS, mounted_hierarchy, parent_name
from orchard.services.env.backends.network import name_prefix

pytestmark = [needs_sandboxes, pytest.mark.timeout(120)]
ORCHARD = str(Path(sys.executable).with_name("orchard"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve(state: Path, port: int) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        [ORCHARD, "serve", "env", "--port", str(port), "--state-dir", str(state), "--log-level", "WARNING"]
    )
    deadline = time.monotonic() + 30
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        while True:
            assert proc.poll() is None, "the env service exited while starting"
            try:
                health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=1)
                if health.status == health_pb2.HealthCheckResponse.SERVING:
                    return proc
            except grpc.RpcError:
                pass
            assert time.monotonic() < deadline, "the env service did not become healthy"
            time.sleep(0.1)


def _leftovers(state: Path) -> dict[str, int]:
    """What the service with this state dir holds on the host: sandbox processes, mounts, cgroups, namespaces."""
    processes = 0
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if str(state).encode() in Path(f"/proc/{entry}/cmdline").read_bytes():
                    processes += 1
            except OSError:
                pass
    mounts = sum(1 for line in open("/proc/mounts") if str(state) in line)
    group = parent_name(state)
    v1 = mounted_hierarchy(Path("/proc/self/mountinfo").read_text()) == "v1"
    roots = [CGROUP_FS / c for c in CONTROLLERS] if v1 else [CGROUP_FS]  # v1: a tree per controller
    cgroups = sum(
        1 + sum(1 for sub in parent.iterdir() if sub.is_dir())  # the service's group and the sandboxes'
        for root in roots
        for parent in root.rglob(group)
    )
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.count(name_prefix(state))
    return {"processes": processes, "mounts": mounts, "cgroups": cgroups, "netns": netns}


def test_sigkill_and_restart_leave_nothing(tmp_path: Path) -> None:
    """After SIGKILL the sandboxes' processes die with the service; the restart removes their mounts, cgroups
    and namespaces, and GetSandbox says they ended with the restart."""
    state = tmp_path / "state"
    port = _free_port()
    services: list[subprocess.Popen[bytes]] = []
    try:
        _crash_and_restart(state, port, services)
    finally:
        for proc in services:  # a failed assertion must not leave a service (and its sandboxes) running
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                proc.wait(timeout=60)


def _crash_and_restart(state: Path, port: int, services: list[subprocess.Popen[bytes]]) -> None:
    proc = _serve(state, port)
    services.append(proc)
    before = _leftovers(state)
    assert before == {"processes": 1, "mounts": 0, "cgroups": before["cgroups"], "netns": 0}  # the service itself
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = env_pb2_grpc.EnvServiceStub(channel)
        plain = stub.CreateSandbox(pb.CreateSandboxRequest(image="host"), timeout=30).sandbox
        limited = stub.CreateSandbox(
            pb.CreateSandboxRequest(
                image="host", resources=pb.Resources(memory_bytes=256 << 20, cpu_millis=500, disk_bytes=64 << 20)
            ),
            timeout=30,
        ).sandbox
        networked = stub.CreateSandbox(
            pb.CreateSandboxRequest(
                image="host", network_policy=pb.NetworkPolicy(allow=[pb.EgressRule(cidr="169.254.0.250/32", port=80)])
            ),
            timeout=30,
        ).sandbox
        stub.StartExec(pb.StartExecRequest(sandbox_id=plain.sandbox_id, shell="sleep 300 &"), timeout=10)
        during = _leftovers(state)
        # On the host: the capped layer (each overlay is mounted in a mount namespace of its sandbox's own).
        assert during["processes"] > 1 and during["mounts"] >= 1 and during["netns"] == 1
        assert during["cgroups"] > before["cgroups"]

    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)
    deadline = time.monotonic() + 10
    while _leftovers(state)["processes"] and time.monotonic() < deadline:  # --die-with-parent
        time.sleep(0.1)
    assert _leftovers(state)["processes"] == 0

    proc = _serve(state, port)
    services.append(proc)
    try:
        assert _leftovers(state) == before
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = env_pb2_grpc.EnvServiceStub(channel)
            for sandbox in (plain, limited, networked):
                with pytest.raises(grpc.RpcError) as info:
                    stub.GetSandbox(pb.GetSandboxRequest(sandbox_id=sandbox.sandbox_id), timeout=5)
                assert info.value.code() is grpc.StatusCode.NOT_FOUND
                assert "restarted" in (info.value.details() or "")
            again = stub.CreateSandbox(pb.CreateSandboxRequest(image="host"), timeout=30).sandbox
            done = stub.StartExec(
                pb.StartExecRequest(sandbox_id=again.sandbox_id, shell="echo fine", wait=Duration(seconds=10)),
                timeout=30,
            ).exec
            assert done.stdout == b"fine\n"
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    assert _leftovers(state) == {"processes": 0, "mounts": 0, "cgroups": 0, "netns": 0}  # a clean stop removes all
