"""Snapshots and forks on the `kubernetes` backend, held to the same contract as the other backends
(test_env_snapshots.py's tests, run here), against a FAKE Kubernetes API server (k8s_fake_api.py): no cluster can
run on this machine. The fake gives each pod a root filesystem of its own (bubblewrap over an overlay of the
built python:3.11-slim image, as a runtime gives a container its writable layer), so what is saved and restored
is a real pod-shaped root filesystem, through the real `kubernetes` client, the real pod watch and the real native
agent on each pod's loopback "Pod IP". The sandbox image name is "host" (what the contract uses); the fake runs
every pod on that one root filesystem."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import test_env_snapshots as contract
from env_helpers import EnvServer, StartEnv, needs_image, needs_sandboxes, run
from k8s_fake_api import FakeKubernetes
from test_k8s_backend import NS, SERVICE, agent_bin, sandbox_pod

from orchard.env.v1 import env_pb2 as pb
from orchard.services.env.backends.kubernetes import KubernetesBackend
from orchard.services.env.images import ImageStore, default_images_dir

pytest.importorskip("kubernetes", reason="pip install 'orchard[kubernetes]'")
PYTHON = "python:3.11-slim"
pytestmark = [needs_sandboxes, needs_image(PYTHON), pytest.mark.timeout(120)]
__all__ = ["agent_bin"]  # the module fixture, shared


@pytest.fixture
def rooted_fake(agent_bin: Path, tmp_path: Path) -> Iterator[FakeKubernetes]:
    (tmp_path / "pod-logs").mkdir()
    api = FakeKubernetes(
        agent_bin, tmp_path / "pod-logs", rootfs=ImageStore(default_images_dir()).resolve(PYTHON).rootfs
    )
    api.start()
    yield api
    api.stop()


@pytest.fixture
def start_env(rooted_fake: FakeKubernetes, start_env: StartEnv, tmp_path: Path) -> StartEnv:
    """The conftest's start_env, on the kubernetes backend against the rooted fake (set up first, so it stops
    after the services)."""

    async def start(**overrides: Any) -> EnvServer:
        state = overrides.get("state_dir") or tmp_path / f"k8s-state-{len(list(tmp_path.glob('k8s-state-*')))}"
        (state / "sandboxes").mkdir(parents=True, exist_ok=True)  # the fixture checks it is empty at the end
        return await start_env(
            **{
                "backend": "kubernetes",
                "k8s_kubeconfig": rooted_fake.kubeconfig(tmp_path / "kubeconfig", NS),
                "k8s_namespace": NS,
                "k8s_service_id": SERVICE,
                **overrides,
                "state_dir": state,
            }
        )

    return start


async def test_forks_start_from_the_snapshot_and_diverge(start_env: StartEnv) -> None:
    await contract.test_forks_start_from_the_snapshot_and_diverge(start_env, "host")


async def test_a_snapshot_of_a_fork_builds_on_its_parent(start_env: StartEnv) -> None:
    await contract.test_a_snapshot_of_a_fork_builds_on_its_parent(start_env, "host")


async def test_deleting_a_snapshot_keeps_its_files_for_its_forks(start_env: StartEnv) -> None:
    await contract.test_deleting_a_snapshot_keeps_its_files_for_its_forks(start_env, "host")


async def test_a_snapshot_waits_for_earlier_commands_only(start_env: StartEnv) -> None:
    await contract.test_a_snapshot_waits_for_earlier_commands_only(start_env)


async def test_snapshot_errors(start_env: StartEnv, tmp_path: Path) -> None:
    await contract.test_snapshot_errors(start_env, tmp_path)


async def test_the_sdk_snapshots_and_forks(start_env: StartEnv) -> None:
    await contract.test_the_sdk_snapshots_and_forks(start_env)


async def test_a_fork_is_a_pod_of_its_own(start_env: StartEnv, rooted_fake: FakeKubernetes) -> None:
    """The fork is a new pod, restored before CreateSandbox returns; the pod's files outside its root filesystem
    (the agent's /.orchard, /proc) are not part of the snapshot."""
    env = await start_env()
    stub = env.stub
    source = await contract.create(stub, image="host")
    await contract.sh(stub, source.sandbox_id, "echo kept > /opt/kept && mkdir -p /root/.cache/x")
    snap = await contract.snapshot(stub, source.sandbox_id)
    forked = await contract.fork(stub, snap.snapshot_id)
    pods = {sandbox_pod(rooted_fake, sb.sandbox_id)["metadata"]["name"] for sb in (source, forked)}
    assert len(pods) == 2
    tar = env.settings.state_dir / "snapshots" / snap.snapshot_id / "changed.tar"
    names = (await run(stub, forked.sandbox_id, ["tar", "-tf", "-"], stdin=tar.read_bytes())).stdout.decode().split()
    assert "./opt/kept" in names and not [n for n in names if n.startswith(("./.orchard", "./proc", "./dev"))], names
    got = await run(stub, forked.sandbox_id, "cat /opt/kept; test -d /root/.cache/x && echo dir")
    assert (got.state, got.stdout) == (pb.EXEC_STATE_SUCCEEDED, b"kept\ndir\n")


async def test_a_fork_from_the_warm_pool(start_env: StartEnv, rooted_fake: FakeKubernetes) -> None:
    """A fork that fits a warm pool takes a started pod and has the snapshot restored into it before it is ready."""
    env = await start_env(k8s_warm_pools={"host": 1})
    stub = env.stub
    source = await contract.create(stub, image="host")
    await contract.sh(stub, source.sandbox_id, "echo one > one && rm /etc/debian_version")
    snap = await contract.snapshot(stub, source.sandbox_id)
    backend = env.manager.backend
    assert isinstance(backend, KubernetesBackend)
    waiting = backend.warm_pods("host")
    deadline = time.monotonic() + 10
    while not [p for p in rooted_fake.pods(NS) if p["metadata"]["name"] in waiting and p["status"].get("podIP")]:
        assert time.monotonic() < deadline, "the pool did not refill"
        await asyncio.sleep(0.02)
    forked = await contract.fork(stub, snap.snapshot_id)
    assert sandbox_pod(rooted_fake, forked.sandbox_id)["metadata"]["name"] in waiting
    assert (
        await contract.sh(stub, forked.sandbox_id, "cat one; test -e /etc/debian_version || echo gone") == "one\ngone\n"
    )


async def test_a_snapshot_past_its_size_limit(start_env: StartEnv) -> None:
    """What the pod sends is bounded: past k8s_snapshot_max_bytes (a real tar, or a `tar` the sandbox replaced that
    prints forever) the snapshot is RESOURCE_EXHAUSTED at once, nothing of it is kept, and the sandbox carries on."""
    env = await start_env(k8s_snapshot_max_bytes=200_000)
    stub = env.stub
    sid = (await contract.create(stub, image="host")).sandbox_id
    await contract.sh(stub, sid, "head -c 300000 /dev/urandom > blob")
    err = await contract.rpc_error(contract.snapshot(stub, sid))
    assert err.code() is grpc.StatusCode.RESOURCE_EXHAUSTED and "200000 bytes" in (err.details() or ""), err
    await contract.sh(
        stub, sid, "rm blob && printf '#!/bin/sh\\nexec yes\\n' > /usr/local/bin/tar && chmod +x /usr/local/bin/tar"
    )
    began = time.monotonic()
    err = await contract.rpc_error(contract.snapshot(stub, sid))
    assert err.code() is grpc.StatusCode.RESOURCE_EXHAUSTED and time.monotonic() - began < 10, err
    assert contract.layers_on_disk(env) == [] and not (await stub.ListSnapshots(pb.ListSnapshotsRequest())).snapshots
    assert await contract.sh(stub, sid, "echo alive") == "alive\n"
