"""The `docker` backend against a real Docker-compatible engine: a private `podman system service` (runc,
cgroupfs, its own config and storage under tmp), the python:3.11-slim rootfs imported as
localhost/orchard-python:3.11-slim, and the native agent (agent-rs/) bound into each container."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from conftest import StartEnv, run
from orchard.env.v1 import env_pb2 as pb
from orchard.services.env.images import default_images_dir
from test_env_service import REPO_SETUP, download, upload

pytestmark = [pytest.mark.timeout(90)]

ROOT = Path(__file__).resolve().parents[2]
IMAGE = "python:3.11-slim"
REF = f"localhost/orchard-{IMAGE}"

CONTAINERS_CONF = """\
[containers]
default_ulimits = ["nofile=1024:1024", "nproc=1024:1024"]
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
exit_command_delay = 5
tmp_dir = "{w}/tmp"
[engine.runtimes]
runc = ["{runc}"]
"""

STORAGE_CONF = """\
[storage]
driver = "overlay"
runroot = "{w}/runroot"
graphroot = "{w}/root"
"""


@pytest.fixture(scope="module")
def podman(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A private podman API service with the python:3.11-slim image; yields its DOCKER_HOST address."""
    if os.geteuid() != 0:
        pytest.skip("the docker backend tests run podman as root")
    runc = shutil.which("runc")
    if shutil.which("podman") is None or runc is None:
        pytest.skip("podman and runc are not installed: apt-get install podman runc")
    pytest.importorskip("docker", reason="pip install 'docker==7.*' (the docker extra)")
    rootfs = default_images_dir() / IMAGE.replace(":", "_") / "rootfs"
    if not (rootfs / "usr" / "bin" / "python3").exists():
        pytest.skip(f"the {IMAGE} rootfs is not built ({rootfs}): orchard image build {IMAGE}")
    built = subprocess.run([str(ROOT / "scripts" / "build_agent.sh")], capture_output=True, text=True, check=False)
    if built.returncode != 0:
        pytest.skip(f"cannot build the native agent (needs cargo): {built.stderr.strip()[-500:]}")

    # A short folder: the service's unix socket path must fit in sockaddr_un.
    w = Path(subprocess.run(["mktemp", "-d", "/tmp/orchard-podman.XXXXXX"], capture_output=True, text=True,
                            check=True).stdout.strip())
    (w / "tmp").mkdir()
    (w / "containers.conf").write_text(CONTAINERS_CONF.format(w=w, runc=runc))
    (w / "storage.conf").write_text(STORAGE_CONF.format(w=w))
    env = {**os.environ, "CONTAINERS_CONF": str(w / "containers.conf"),
           "CONTAINERS_STORAGE_CONF": str(w / "storage.conf")}
    sock = w / "podman.sock"
    service = subprocess.Popen(["podman", "system", "service", "--time=0", f"unix://{sock}"], env=env,
                               stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 10
        while not sock.exists():
            assert service.poll() is None, f"podman system service failed: {service.stderr.read()!r}"  # type: ignore[union-attr]
            assert time.monotonic() < deadline, "podman system service did not listen within 10 s"
            time.sleep(0.02)
        tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
        imported = subprocess.run(["podman", "import", "-", REF], stdin=tar.stdout, env=env, capture_output=True,
                                  text=True, check=False)
        assert tar.stdout is not None
        tar.stdout.close()
        assert tar.wait() == 0 and imported.returncode == 0, imported.stderr
        yield f"unix://{sock}"
    finally:
        service.terminate()
        try:
            service.wait(10)
        except subprocess.TimeoutExpired:
            service.kill()
            service.wait()
        # Containers left (there should be none) and the storage's overlay mounts go with the storage.
        subprocess.run(["podman", "rm", "-af", "-t", "0"], env=env, capture_output=True, check=False)
        subprocess.run(["podman", "system", "reset", "-f"], env=env, capture_output=True, check=False)
        subprocess.run(["umount", "-R", str(w / "root" / "overlay")], capture_output=True, check=False)
        shutil.rmtree(w, ignore_errors=True)


def _containers(host: str, sandbox_id: str) -> list[object]:
    import docker

    client = docker.DockerClient(base_url=host, timeout=30)
    try:
        return client.containers.list(all=True, filters={"label": f"orchard.sandbox_id={sandbox_id}"})
    finally:
        client.close()


async def test_sandbox_in_a_container(podman: str, start_env: StartEnv) -> None:
    """Create, exec, files, a patch with git, a memory limit, no network but lo, and delete removes the container."""
    env = await start_env(backend="docker", docker_host=podman)
    (env.settings.state_dir / "sandboxes").mkdir(exist_ok=True)  # the start_env fixture checks it is empty
    stub = env.stub
    created = await stub.CreateSandbox(pb.CreateSandboxRequest(
        image=IMAGE, resources=pb.Resources(memory_bytes=256 << 20, cpu_millis=1000)), timeout=30)
    sid = created.sandbox.sandbox_id
    assert len(_containers(podman, sid)) == 1

    printed = await run(stub, sid, ["python3", "-c", "print(1)"])
    assert printed.state == pb.EXEC_STATE_SUCCEEDED and printed.stdout == b"1\n", printed.stderr

    await upload(stub, sid, "data/in.txt", b"hello from the host\n")
    copied = await run(stub, sid, "cp data/in.txt data/out.txt && echo more >> data/out.txt")
    assert copied.state == pb.EXEC_STATE_SUCCEEDED, copied.stderr
    assert b"".join((await download(stub, sid, "data/out.txt"))[1]) == b"hello from the host\nmore\n"

    made = await run(stub, sid, "git config --global user.email t@t && git config --global user.name t && "
                     + REPO_SETUP)
    assert made.state == pb.EXEC_STATE_SUCCEEDED, made.stderr
    applied = await stub.ApplyPatch(pb.ApplyPatchRequest(sandbox_id=sid, patch=made.stdout.decode(), cwd="repo"),
                                    timeout=30)
    assert sorted(applied.files) == ["a.txt", "c.txt", "pkg/b.py"]
    assert b"".join((await download(stub, sid, "repo/a.txt"))[1]) == b"one\nTWO\nthree\n"

    limit = await run(stub, sid, "cat /sys/fs/cgroup/memory/memory.limit_in_bytes 2>/dev/null"
                                 " || cat /sys/fs/cgroup/memory.max")
    assert limit.state == pb.EXEC_STATE_SUCCEEDED, limit.stderr
    assert int(limit.stdout) == 256 << 20

    links = await run(stub, sid, "ls /sys/class/net")
    assert links.stdout.split() == [b"lo"], links.stdout

    await stub.DeleteSandbox(pb.DeleteSandboxRequest(sandbox_id=sid), timeout=30)
    assert _containers(podman, sid) == []
    assert not (env.settings.state_dir / "docker" / sid).exists()


async def test_missing_image_says_how_to_import(podman: str, start_env: StartEnv) -> None:
    env = await start_env(backend="docker", docker_host=podman)
    (env.settings.state_dir / "sandboxes").mkdir(exist_ok=True)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await env.stub.CreateSandbox(pb.CreateSandboxRequest(image="nosuch:1"), timeout=30)
    assert err.value.code() is grpc.StatusCode.FAILED_PRECONDITION
    assert "podman import" in (err.value.details() or "")
