"""The `docker` backend against a real Docker-compatible engine: a private `podman system service` (runc,
cgroupfs, its own config and storage under tmp), the python:3.11-slim rootfs imported as
localhost/orchard-python:3.11-slim, and the native agent (agent-rs/) bound into each container."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from env_helpers import EnvServer, StartEnv, duration, needs_image, run
from grpc_health.v1 import health_pb2, health_pb2_grpc
from podman_engine import PodmanEngine, skip_unless_podman
from test_env_pty import open_term
from test_env_service import REPO_SETUP, download, rpc_error, upload

from orchard.env.v1 import env_pb2 as pb
from orchard.env.v1 import env_pb2_grpc
from orchard.services.env.images import ImageStore, default_images_dir
from orchard.services.env.models import sandbox_key  # another tenant's containers carry its internal key

pytestmark = [pytest.mark.timeout(90)]

ROOT = Path(__file__).resolve().parents[2]
IMAGE = "python:3.11-slim"
REF = f"localhost/orchard-{IMAGE}"


@pytest.fixture(scope="module")
def podman(engine: PodmanEngine) -> str:
    """The DOCKER_HOST address of the engine."""
    return engine.host


@pytest.fixture(scope="module")
def engine() -> Iterator[PodmanEngine]:
    """A private podman API service with the python:3.11-slim image."""
    runc = skip_unless_podman()
    pytest.importorskip("docker", reason="pip install 'docker==7.*' (the docker extra)")
    rootfs = default_images_dir() / IMAGE.replace(":", "_") / "rootfs"
    if not (rootfs / "usr" / "bin" / "python3").exists():
        pytest.skip(f"the {IMAGE} rootfs is not built ({rootfs}): orchard image build {IMAGE}")
    built = subprocess.run([str(ROOT / "scripts" / "build_agent.sh")], capture_output=True, text=True, check=False)
    if built.returncode != 0:
        pytest.skip(f"cannot build the native agent (needs cargo): {built.stderr.strip()[-500:]}")
    engine = PodmanEngine(runc)
    try:
        engine.import_rootfs(rootfs, REF)
        yield engine
    finally:
        engine.close()


def _containers(host: str, sandbox_id: str = "") -> list[Any]:
    """The engine's containers of the sandbox (of every sandbox without one)."""
    import docker

    client = docker.DockerClient(base_url=host, timeout=30)
    label = f"orchard.sandbox_id={sandbox_id}" if sandbox_id else "orchard.sandbox_id"
    try:
        return client.containers.list(all=True, filters={"label": label})
    finally:
        client.close()


async def _start_docker(start_env: StartEnv, podman: str, **overrides: Any) -> EnvServer:
    env = await start_env(backend="docker", docker_host=podman, **overrides)
    (env.settings.state_dir / "sandboxes").mkdir(exist_ok=True)  # the start_env fixture checks it is empty
    return env


async def _create(env: EnvServer, **resources: int) -> str:
    created = await env.stub.CreateSandbox(
        pb.CreateSandboxRequest(image=IMAGE, resources=pb.Resources(**resources)), timeout=30
    )
    return created.sandbox.sandbox_id


async def test_sandbox_in_a_container(podman: str, start_env: StartEnv) -> None:
    """Create, exec, files, a patch with git, a memory limit, no network but lo, and delete removes the container."""
    env = await _start_docker(start_env, podman)
    stub = env.stub
    created = await stub.CreateSandbox(
        pb.CreateSandboxRequest(image=IMAGE, resources=pb.Resources(memory_bytes=256 << 20, cpu_millis=1000)),
        timeout=30,
    )
    sid = created.sandbox.sandbox_id
    assert len(_containers(podman, sid)) == 1

    printed = await run(stub, sid, ["python3", "-c", "print(1)"])
    assert printed.state == pb.EXEC_STATE_SUCCEEDED and printed.stdout == b"1\n", printed.stderr

    await upload(stub, sid, "data/in.txt", b"hello from the host\n")
    copied = await run(stub, sid, "cp data/in.txt data/out.txt && echo more >> data/out.txt")
    assert copied.state == pb.EXEC_STATE_SUCCEEDED, copied.stderr
    assert b"".join((await download(stub, sid, "data/out.txt"))[1]) == b"hello from the host\nmore\n"

    made = await run(
        stub, sid, "git config --global user.email t@t && git config --global user.name t && " + REPO_SETUP
    )
    assert made.state == pb.EXEC_STATE_SUCCEEDED, made.stderr
    applied = await stub.ApplyPatch(
        pb.ApplyPatchRequest(sandbox_id=sid, patch=made.stdout.decode(), cwd="repo"), timeout=30
    )
    assert sorted(applied.files) == ["a.txt", "c.txt", "pkg/b.py"]
    assert b"".join((await download(stub, sid, "repo/a.txt"))[1]) == b"one\nTWO\nthree\n"

    limit = await run(
        stub, sid, "cat /sys/fs/cgroup/memory/memory.limit_in_bytes 2>/dev/null || cat /sys/fs/cgroup/memory.max"
    )
    assert limit.state == pb.EXEC_STATE_SUCCEEDED, limit.stderr
    assert int(limit.stdout) == 256 << 20

    links = await run(stub, sid, "ls /sys/class/net")
    assert links.stdout.split() == [b"lo"], links.stdout

    await stub.DeleteSandbox(pb.DeleteSandboxRequest(sandbox_id=sid), timeout=30)
    assert _containers(podman, sid) == []
    assert not (env.settings.state_dir / "docker" / sid).exists()


async def test_missing_image_says_how_to_import(podman: str, start_env: StartEnv) -> None:
    env = await _start_docker(start_env, podman)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await env.stub.CreateSandbox(pb.CreateSandboxRequest(image="nosuch:1"), timeout=30)
    assert err.value.code() is grpc.StatusCode.FAILED_PRECONDITION
    assert "podman import" in (err.value.details() or "")


async def test_oom_kill_is_reported(podman: str, start_env: StartEnv) -> None:
    """A command killed for memory says so (the engine's API does not), another SIGKILL does not, and the sandbox
    lives on."""
    env = await _start_docker(start_env, podman)
    sid = await _create(env, memory_bytes=96 << 20)
    hog = await run(env.stub, sid, ["python3", "-c", "b = b'x' * (300 << 20)"])
    assert (hog.state, hog.exit_code, hog.oom_killed) == (pb.EXEC_STATE_FAILED, 137, True)
    assert "ran out of memory (limit 96 MiB)" in hog.error
    killed = await run(env.stub, sid, "kill -9 $$")
    assert (killed.exit_code, killed.oom_killed) == (137, False)
    alive = await run(env.stub, sid, "echo alive")
    assert alive.stdout == b"alive\n"


FORK_UNTIL_REFUSED = """
import os, signal
kids, refused = [], 0
try:
    while len(kids) < 500:
        pid = os.fork()
        if pid == 0:
            signal.pause()
            os._exit(0)
        kids.append(pid)
except OSError as err:
    refused = err.errno
for pid in kids:
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
print(len(kids), refused)
"""

BUSY_HALF_A_SECOND = """
import time
cpu, wall = time.process_time(), time.monotonic()
while time.process_time() - cpu < 0.5:
    pass
print(time.monotonic() - wall)
"""


async def test_cpu_and_pids_limits_hold(podman: str, start_env: StartEnv) -> None:
    """Half a core: the quota is in the container's cpu group and 0.5 s of CPU takes ~1 s, throttled; 32 pids:
    forking stops inside the limit (EAGAIN) and the sandbox still runs commands."""
    env = await _start_docker(start_env, podman)
    sid = await _create(env, cpu_millis=500, pids=32, memory_bytes=128 << 20)
    cg = "/sys/fs/cgroup"
    limits = await run(
        env.stub,
        sid,
        f"cat {cg}/cpu/cpu.cfs_quota_us {cg}/cpu/cpu.cfs_period_us "
        f"{cg}/pids/pids.max {cg}/memory/memory.limit_in_bytes",
    )
    assert limits.stdout.split() == [b"50000", b"100000", b"32", str(128 << 20).encode()], limits.stderr

    busy = await run(env.stub, sid, ["python3", "-c", BUSY_HALF_A_SECOND])
    assert float(busy.stdout) >= 0.8, busy.stdout  # unthrottled: 0.5 s
    stat = dict(
        line.split() for line in (await run(env.stub, sid, f"cat {cg}/cpu/cpu.stat")).stdout.decode().splitlines()
    )
    assert int(stat["nr_throttled"]) > 0, stat

    forked = await run(env.stub, sid, ["python3", "-c", FORK_UNTIL_REFUSED])
    count, errno_ = (int(word) for word in forked.stdout.split())
    assert 0 < count < 32 and errno_ == 11, forked.stdout  # EAGAIN
    assert (await run(env.stub, sid, "echo alive")).stdout == b"alive\n"


async def test_what_the_backend_refuses(podman: str, start_env: StartEnv) -> None:
    """No network at all: egress rules and disk caps (ext4 storage here) are FAILED_PRECONDITION, each saying what
    to do instead; an empty policy is fine."""
    env = await _start_docker(start_env, podman)
    stub = env.stub
    rule = pb.EgressRule(cidr="169.254.0.250/32", port=80)
    networked = await rpc_error(
        stub.CreateSandbox(
            pb.CreateSandboxRequest(image=IMAGE, network_policy=pb.NetworkPolicy(allow=[rule])), timeout=30
        )
    )
    assert networked.code() is grpc.StatusCode.FAILED_PRECONDITION
    assert "no network at all" in (networked.details() or "")
    capped = await rpc_error(
        stub.CreateSandbox(
            pb.CreateSandboxRequest(image=IMAGE, resources=pb.Resources(disk_bytes=64 << 20)), timeout=30
        )
    )
    assert capped.code() is grpc.StatusCode.FAILED_PRECONDITION
    assert "disk_bytes 0" in (capped.details() or ""), capped.details()

    sid = await _create(env)
    policy = await rpc_error(
        stub.SetNetworkPolicy(
            pb.SetNetworkPolicyRequest(sandbox_id=sid, network_policy=pb.NetworkPolicy(allow=[rule])), timeout=30
        )
    )
    assert policy.code() is grpc.StatusCode.FAILED_PRECONDITION
    await stub.SetNetworkPolicy(
        pb.SetNetworkPolicyRequest(sandbox_id=sid, network_policy=pb.NetworkPolicy()), timeout=30
    )
    assert [c.labels["orchard.sandbox_id"] for c in _containers(podman)] == [sid]  # failed creates left none


ORCHARD = str(Path(sys.executable).with_name("orchard"))
ALICE = "alice-token-0123456789"


async def _serve(state: Path, podman: str, tokens: Path) -> tuple[asyncio.subprocess.Process, int]:
    """`orchard serve env --backend docker` as a process of its own (so it can be killed); returns it and its port."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = await asyncio.create_subprocess_exec(
        ORCHARD,
        "serve",
        "env",
        "--port",
        str(port),
        "--state-dir",
        str(state),
        "--backend",
        "docker",
        "--docker-host",
        podman,
        "--auth-tokens-file",
        str(tokens),
        "--log-level",
        "WARNING",
    )
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        health = health_pb2_grpc.HealthStub(channel)
        deadline = time.monotonic() + 30
        while True:
            assert proc.returncode is None, "the env service exited while starting"
            with contextlib.suppress(grpc.aio.AioRpcError):
                checked = await health.Check(health_pb2.HealthCheckRequest(), timeout=1)
                if checked.status == health_pb2.HealthCheckResponse.SERVING:
                    return proc, port
            assert time.monotonic() < deadline, "the env service did not become healthy"
            await asyncio.sleep(0.1)


async def test_sandboxes_outlive_a_crash(podman: str, tmp_path: Path) -> None:
    """SIGKILL the service: its containers run on. The next run on the same state dir takes back the one within its
    ttl (same id, tenant, labels, files; exec works) and removes the expired one's container. A clean stop
    removes everything."""
    tokens = tmp_path / "tokens"
    tokens.write_text(f"alice:{ALICE}\n")
    state = tmp_path / "state"
    alice = (("authorization", f"Bearer {ALICE}"),)
    procs: list[asyncio.subprocess.Process] = []
    try:
        proc, port = await _serve(state, podman, tokens)
        procs.append(proc)
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = env_pb2_grpc.EnvServiceStub(channel)
            kept = (
                await stub.CreateSandbox(
                    pb.CreateSandboxRequest(image=IMAGE, labels={"task": "t1"}, ttl=duration(600)),
                    metadata=alice,
                    timeout=30,
                )
            ).sandbox
            short = (
                await stub.CreateSandbox(
                    pb.CreateSandboxRequest(image=IMAGE, ttl=duration(3)), metadata=alice, timeout=30
                )
            ).sandbox
            wrote = await stub.StartExec(
                pb.StartExecRequest(sandbox_id=kept.sandbox_id, shell="echo hi > note.txt", wait=duration(10)),
                metadata=alice,
                timeout=30,
            )
            assert wrote.exec.state == pb.EXEC_STATE_SUCCEEDED
        [container] = _containers(podman, sandbox_key("alice", kept.sandbox_id))
        assert container.labels["orchard.tenant"] == "alice"
        assert abs(int(container.labels["orchard.expire_time"]) - (time.time() + 600)) < 30

        proc.send_signal(signal.SIGKILL)
        await proc.wait()
        assert [c.status for c in _containers(podman, sandbox_key("alice", short.sandbox_id))] == ["running"]
        await asyncio.sleep(max(0.0, short.create_time.ToSeconds() + 3.5 - time.time()))

        proc, port = await _serve(state, podman, tokens)
        procs.append(proc)
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = env_pb2_grpc.EnvServiceStub(channel)
            listed = await stub.ListSandboxes(pb.ListSandboxesRequest(), metadata=alice, timeout=10)
            assert [sb.sandbox_id for sb in listed.sandboxes] == [kept.sandbox_id]
            back = listed.sandboxes[0]
            assert (back.tenant, dict(back.labels), back.state) == ("alice", {"task": "t1"}, pb.SANDBOX_STATE_READY)
            assert back.create_time == kept.create_time and back.expire_time == kept.expire_time
            read = await stub.StartExec(
                pb.StartExecRequest(sandbox_id=kept.sandbox_id, shell="cat note.txt", wait=duration(10)),
                metadata=alice,
                timeout=30,
            )
            assert read.exec.stdout == b"hi\n"
            gone = await rpc_error(
                stub.GetSandbox(pb.GetSandboxRequest(sandbox_id=short.sandbox_id), metadata=alice, timeout=10)
            )
            assert gone.code() is grpc.StatusCode.NOT_FOUND and "expired after ttl 3s" in (gone.details() or "")
        assert _containers(podman, sandbox_key("alice", short.sandbox_id)) == []
    finally:
        for proc in procs:
            if proc.returncode is None:
                proc.send_signal(signal.SIGTERM)
                assert await asyncio.wait_for(proc.wait(), 60) == 0
    assert _containers(podman) == []  # the clean stop removed the sandbox it took back


def _snapshot_images(host: str) -> list[str]:
    import docker

    client = docker.DockerClient(base_url=host, timeout=30)
    try:
        return sorted(tag for image in client.images.list() for tag in image.tags if "orchard-snapshot-" in tag)
    finally:
        client.close()


async def test_snapshots_are_committed_images(podman: str, start_env: StartEnv) -> None:
    """A snapshot of a snapshot's sandbox keeps both files; a deleted snapshot's image stays while a later one
    stacks it, and once neither is used every snapshot image is gone."""
    env = await _start_docker(start_env, podman)
    stub = env.stub
    first = await _create(env)
    await run(stub, first, "echo one > one.txt")
    a = (await stub.SnapshotSandbox(pb.SnapshotSandboxRequest(sandbox_id=first, snapshot_id="a"), timeout=30)).snapshot
    assert a.size_bytes > 0
    child = (await stub.CreateSandbox(pb.CreateSandboxRequest(from_snapshot="a"), timeout=30)).sandbox.sandbox_id
    await run(stub, child, "echo two > two.txt")
    await stub.SnapshotSandbox(pb.SnapshotSandboxRequest(sandbox_id=child, snapshot_id="b"), timeout=30)
    await stub.DeleteSnapshot(pb.DeleteSnapshotRequest(snapshot_id="a"), timeout=30)
    await stub.DeleteSandbox(pb.DeleteSandboxRequest(sandbox_id=child), timeout=30)

    grandchild = (await stub.CreateSandbox(pb.CreateSandboxRequest(from_snapshot="b"), timeout=30)).sandbox.sandbox_id
    both = await run(stub, grandchild, "cat one.txt two.txt")
    assert both.stdout == b"one\ntwo\n", both.stderr
    await stub.DeleteSandbox(pb.DeleteSandboxRequest(sandbox_id=grandchild), timeout=30)
    assert [tag.rpartition(":")[2] for tag in _snapshot_images(podman)] == ["a", "b"]  # b stacks deleted a
    await stub.DeleteSnapshot(pb.DeleteSnapshotRequest(snapshot_id="b"), timeout=30)
    assert _snapshot_images(podman) == []


async def test_terminal_in_a_container(podman: str, start_env: StartEnv) -> None:
    """OpenPty on a container: bash on a /dev/pts terminal of the asked size, input, a resize, and its exit code;
    a program that cannot start says why and exits 127."""
    env = await _start_docker(start_env, podman)
    sid = await _create(env)
    term = await open_term(env.stub, sid, rows=30, cols=100)
    await term.send(b"echo hi-$((1+1)); tty; stty size\n")
    await term.until(rb"hi-2")
    await term.until(rb"/dev/pts/\d+")
    await term.until(rb"[\r\n]30 100\r")
    await term.resize(50, 132)
    await term.send(b"stty size; exit 3\n")
    await term.until(rb"[\r\n]50 132\r")
    assert await term.until_end() == 3
    term = await open_term(env.stub, sid, argv=["no-such-program"])
    await term.until(rb"cannot start 'no-such-program'")
    assert await term.until_end() == 127


async def test_gvisor_isolation_runs_on_a_user_space_kernel(engine: PodmanEngine, start_env: StartEnv) -> None:
    """ISOLATION_GVISOR: the sandbox's programs see gVisor's kernel, not the host's; exec and files work as in any
    sandbox; one without it runs on runc. On podman, gVisor sandboxes go to a second engine on the same storage
    (its compat API ignores a per-container runtime: asked for one, the create says so)."""
    if not engine.gvisor:
        pytest.skip("gVisor (runsc) is not installed: apt-get install runsc (scripts/install.sh does)")
    ignored = await _start_docker(start_env, engine.host)
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await ignored.stub.CreateSandbox(
            pb.CreateSandboxRequest(image=IMAGE, isolation=pb.ISOLATION_GVISOR), timeout=60
        )
    assert info.value.code() is grpc.StatusCode.FAILED_PRECONDITION and "ignored" in (info.value.details() or "")
    env = await _start_docker(start_env, engine.host, docker_gvisor_host=engine.gvisor_host)
    created = await env.stub.CreateSandbox(
        pb.CreateSandboxRequest(image=IMAGE, isolation=pb.ISOLATION_GVISOR), timeout=60
    )
    sid = created.sandbox.sandbox_id
    assert created.sandbox.isolation == pb.ISOLATION_GVISOR
    kernel = await run(env.stub, sid, "uname -r; dmesg 2>/dev/null | head -1; python3 -c 'print(6*7)'")
    host = os.uname().release
    assert kernel.exit_code == 0 and host.encode() not in kernel.stdout and b"gVisor" in kernel.stdout, kernel
    assert kernel.stdout.rstrip().endswith(b"42")
    await upload(env.stub, sid, "repo/a.txt", b"one\n")
    assert b"".join((await download(env.stub, sid, "repo/a.txt"))[1]) == b"one\n"
    quick = await run(
        env.stub,
        sid,
        "cd repo && git init -q && git add -A && git -c user.email=a@b -c user.name=a "
        "commit -qm one && echo two > a.txt && git diff --stat",
    )
    assert quick.exit_code == 0 and b"1 file changed" in quick.stdout
    plain = await env.stub.CreateSandbox(pb.CreateSandboxRequest(image=IMAGE), timeout=60)
    assert plain.sandbox.isolation == pb.ISOLATION_CONTAINER
    assert host.encode() in (await run(env.stub, plain.sandbox.sandbox_id, "uname -r")).stdout


async def test_the_local_backend_refuses_gvisor(env: EnvServer) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await env.stub.CreateSandbox(pb.CreateSandboxRequest(image="host", isolation=pb.ISOLATION_GVISOR), timeout=30)
    assert info.value.code() is grpc.StatusCode.FAILED_PRECONDITION and "docker backend" in (info.value.details() or "")


@pytest.mark.timeout(300)
async def test_the_quick_start_runs_on_gvisor(engine: PodmanEngine, start_env: StartEnv) -> None:
    """examples/quickstart.py, unchanged, against a service whose sandboxes default to gVisor: pytest fails, the
    patch applies, pytest passes."""
    if not engine.gvisor:
        pytest.skip("gVisor (runsc) is not installed: apt-get install runsc (scripts/install.sh does)")
    env = await _start_docker(start_env, engine.host, docker_gvisor_host=engine.gvisor_host, default_isolation="gvisor")
    probe = (await env.stub.CreateSandbox(pb.CreateSandboxRequest(image=IMAGE), timeout=60)).sandbox
    assert probe.isolation == pb.ISOLATION_GVISOR  # the service's default
    assert os.uname().release.encode() not in (await run(env.stub, probe.sandbox_id, "uname -r")).stdout
    await env.stub.DeleteSandbox(pb.DeleteSandboxRequest(sandbox_id=probe.sandbox_id), timeout=30)
    quick = await asyncio.create_subprocess_exec(
        sys.executable,
        str(ROOT / "examples" / "quickstart.py"),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env={**os.environ, "ORCHARD_ENV_ADDRESS": f"127.0.0.1:{env.server.port}"},
    )
    out, _ = await asyncio.wait_for(quick.communicate(), 240)
    text = out.decode()
    assert quick.returncode == 0, text
    failing, passing = text.split("test session starts")
    assert "1 failed, 3 passed" in failing and "4 passed" in passing and text.rstrip().endswith(" 0"), text
    listed = await env.stub.ListSandboxes(pb.ListSandboxesRequest(), timeout=10)
    assert not listed.sandboxes  # the quick start deleted its sandbox


DOCKERFILE = """FROM localhost/orchard-python:3.11-slim
RUN mkdir -p /testbed/tests && cd /testbed && git init -q \\
 && printf 'def add(a, b):\\n    return a - b\\n' > calc.py \\
 && printf 'from calc import add\\n\\n\\ndef test_add():\\n    assert add(1, 2) == 3\\n' > tests/test_calc.py \\
 && git add -A && git -c user.email=dev@example.com -c user.name=dev commit -qm base
RUN python3 -m venv --system-site-packages /opt/venv
WORKDIR /testbed
"""
GOLD = (
    "diff --git a/calc.py b/calc.py\n--- a/calc.py\n+++ b/calc.py\n@@ -1,2 +1,2 @@\n def add(a, b):\n"
    "-    return a - b\n+    return a + b\n"
)


@pytest.mark.timeout(600)
async def test_an_image_built_by_podman_becomes_a_sandbox_image(
    engine: PodmanEngine, start_env: StartEnv, tmp_path: Path
) -> None:
    """A SWE-bench-style image (the repository at /testbed, a venv) built by podman from a Dockerfile: saved as a
    docker archive and as an OCI archive, imported, it runs local sandboxes, and its task grades as SWE-bench's
    would (gold resolved, empty not); the docker backend runs the same image with its agent injected."""
    from orchard import AsyncSandboxClient
    from orchard.services.env.images import ImageStore
    from orchard.tasks import TaskInstance, grade

    context = tmp_path / "ctx"
    context.mkdir()
    (context / "Dockerfile").write_text(DOCKERFILE)
    engine.build(context, context / "Dockerfile", "localhost/orchard-swe-calc:latest")
    images = tmp_path / "images"
    store = ImageStore(images)
    for fmt, name in (("docker-archive", "swe-calc"), ("oci-archive", "swe-calc-oci")):
        archive = tmp_path / f"{name}.tar"
        engine.podman("save", "--format", fmt, "-o", str(archive), "localhost/orchard-swe-calc:latest")
        image = await store.import_archive(name, archive)
        assert (image.rootfs / "testbed" / "calc.py").is_file() and (image.rootfs / "opt/venv/bin/python").exists()
    assert {"swe-calc", "swe-calc-oci"} <= {i.name for i in store.list()}
    env = await start_env(images_dir=images)
    async with AsyncSandboxClient(target=f"127.0.0.1:{env.server.port}") as client:
        sandbox = await client.create_sandbox("swe-calc-oci")
        async with sandbox:
            head = (await sandbox.exec("git rev-parse HEAD", cwd="/testbed")).stdout.strip()
            failing = await sandbox.exec("/opt/venv/bin/python -m pytest -q", cwd="/testbed")
        assert failing.exit_code == 1 and "1 failed" in failing.stdout
        task = TaskInstance(
            instance_id="swe-calc-1",
            repo="local/calc",
            base_commit=head,
            problem_statement="add",
            patch=GOLD,
            FAIL_TO_PASS=["tests/test_calc.py::test_add"],
            image="swe-calc",
            test_cmd="/opt/venv/bin/python -m pytest -rA -p no:cacheprovider",
        )
        gold, empty = await grade(client, task, GOLD), await grade(client, task, "")
    assert gold.resolved and not empty.resolved, (gold.log_tail, empty.log_tail)
    docker_env = await _start_docker(start_env, engine.host)
    created = await docker_env.stub.CreateSandbox(
        pb.CreateSandboxRequest(image="swe-calc", workdir="/testbed"), timeout=60
    )
    ran = await run(docker_env.stub, created.sandbox.sandbox_id, "git log --format=%H; ls /opt/venv/bin/python")
    assert ran.exit_code == 0 and head.encode() in ran.stdout


async def test_bad_archives_are_refused(tmp_path: Path) -> None:
    import tarfile

    from orchard.errors import InvalidArgument
    from orchard.services.env.images import ImageStore

    store = ImageStore(tmp_path / "images")
    junk = tmp_path / "junk.tar"
    with tarfile.open(junk, "w") as tar:
        info = tarfile.TarInfo("hello.txt")
        tar.addfile(info)
    with pytest.raises(InvalidArgument, match="neither manifest.json"):
        await store.import_archive("junk", junk)
    (tmp_path / "text.tar").write_text("not a tar")
    with pytest.raises(InvalidArgument, match="not a tar archive"):
        await store.import_archive("text", tmp_path / "text.tar")
    with pytest.raises(Exception, match="built from a recipe"):
        await store.import_archive("python:3.11-slim", junk)


@needs_image("claw")
@pytest.mark.slow
@pytest.mark.timeout(240)
async def test_the_claw_environment_runs_in_a_container(engine: PodmanEngine, start_env: StartEnv) -> None:
    """The Claw environment on the docker backend: the `claw` rootfs imported into the engine, its SMTP, IMAP and
    CalDAV servers started under a terminal session in a container (which has no network but lo), every kind of
    tool through them, and one task's scripted solution passing its grader."""
    from test_assistant_env import FIXTURE, call, first_of_each_template

    from orchard.assistant import AssistantEnv
    from orchard.harness import AgentLoop, Limits, SamplingConfig, run_rollouts
    from orchard.harness.assistant import AssistantHarness, AssistantScriptModel
    from orchard.sdk import AsyncSandboxClient

    store = ImageStore(default_images_dir())
    t0 = time.monotonic()
    await asyncio.to_thread(
        engine.import_over, REF, store.resolve(IMAGE).rootfs, store.resolve("claw").rootfs, "localhost/orchard-claw"
    )
    import_s = time.monotonic() - t0
    env = await _start_docker(start_env, engine.host)
    async with AsyncSandboxClient(f"127.0.0.1:{env.server.port}") as client:
        t0 = time.monotonic()
        world = await AssistantEnv.start(client, FIXTURE)
        start_s = time.monotonic() - t0
        try:
            assert len(_containers(engine.host, world.sandbox.sandbox_id)) == 1
            assert [m["id"] for m in await call(world, "search_mail", query="noodles")] == ["m1"]
            assert await call(world, "send_mail", to=["mei.kim@acme.test"], subject="Agenda", body="At 10") == {
                "id": "m4"
            }
            assert [e["uid"] for e in await call(world, "find_events", query="budget")] == ["e1"]
            assert await call(world, "delete_event", uid="e2") == {"uid": "e2"}
            assert await call(world, "read_file", path="reports/q1.csv") == FIXTURE["files"]["reports/q1.csv"]
            state = await world.state()
        finally:
            await world.close()
        assert [m["subject"] for m in state["mail"] if m["folder"] == "Sent"] == ["Re: Lunch", "Agenda"]
        assert [e["uid"] for e in state["events"]] == ["e1"]

        t0 = time.monotonic()
        task = next(t for t in first_of_each_template() if any(c["tool"] == "send_mail" for c in t.solution))
        loop = AgentLoop(
            AssistantScriptModel([task]),
            Limits(max_steps=20, max_tokens=400_000),
            SamplingConfig(max_step_tokens=4096),
            run_id="claw-docker",
        )
        [result] = await run_rollouts(
            [task], 1, loop=loop, client=client, make_harness=lambda t: AssistantHarness(t, client), concurrency=1
        )
        assert result.grade is not None and result.grade.resolved and result.grade.value == 1.0, result.grade
        print(
            f"claw on docker: image import {import_s:.1f} s, environment start {start_s:.1f} s, "
            f"one task rolled out and graded {time.monotonic() - t0:.1f} s"
        )
        assert [s async for s in client.list_sandboxes()] == []
    assert _containers(engine.host) == []
