"""The env service run as an unprivileged user (`nobody`): the quick start, files, exec, PTY, snapshots and forks,
no network and allowlisted egress, resource limits, and the refusals of what needs root, through the real gRPC API
and SDK.

The test runs as root and drops to the user itself (setpriv). One service for the module, on a state dir of the
user's. Its images dir shows the built python:3.11-slim image as the user's own files (a rootless sandbox can write
only files its user owns; root built the image) through an overlay that copies up only the owners it changes
(metacopy), instead of a 300 MB copy. It starts in a private mount namespace that gives it what a user's machine
would: this checkout's Python lies behind a folder others may not enter here (root's home, 0700), which a tmpfs
holding just that path covers there; and /dev/net/tun, mode 0600 on this machine (Debian's udev makes it 0666), is
replaced there by a node of mode 0666 for pasta. On a cgroup v2 host (the VM of test_env_cgroup_v2_vm.py) the service starts in a group
delegated to the user, as systemd's Delegate=yes gives a user's service: cpu, memory and pids limits are then its
sandboxes' groups in that subtree; elsewhere (this cgroup v1 machine) cpu and memory limits are refused and a pids
limit is each sandbox's RLIMIT_NPROC.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import grpc
import pytest
import test_env_network
from env_helpers import ORCHARD, create, delete_quietly, needs_image, run, served_env
from test_env_limits import BUSY_ONE_CPU_SECOND, FORK_BOMB, MiB
from test_env_network import LinkLocalHost, probe, rule, set_policy

from orchard import AsyncSandboxClient
from orchard.env.v1 import env_pb2 as pb
from orchard.env.v1 import env_pb2_grpc
from orchard.errors import FailedPrecondition
from orchard.services.env.backends.cgroups import CGROUP_FS, SERVICE_LEAF, mounted_hierarchy, parent_name
from orchard.services.env.images import default_images_dir, image_dirname

IMAGE = "python:3.11-slim"
OTHERS = "someone-elses"
"""An image whose files are root's, as the service sees them."""
UID = GID = 65534  # nobody
REPO = Path(__file__).resolve().parents[2]
TUN = "/dev/net/tun"
DELEGATED = mounted_hierarchy(Path("/proc/self/mountinfo").read_text()) == "v2"
"""Whether the test delegates a cgroup v2 subtree to the service's user (it can wherever cgroup v2 is mounted)."""
with_delegation = pytest.mark.skipif(
    not DELEGATED,
    reason="limits of a rootless service need a delegated cgroup v2 subtree, which this test makes only where cgroup "
    "v2 is mounted at /sys/fs/cgroup (test_env_cgroup_v2_vm.py runs these on one)",
)
without_delegation = pytest.mark.skipif(DELEGATED, reason="this host has cgroup v2: the test delegates a subtree")

test_host = test_env_network.test_host  # the fixture: a link-local host in a namespace of its own, with echo servers

pytestmark = [
    pytest.mark.skipif(
        os.geteuid() != 0 or not all(shutil.which(c) for c in ("bwrap", "unshare", "setpriv", "pasta", "nft")),
        reason="drops to an unprivileged user itself: needs root, bubblewrap, unshare and setpriv (util-linux), "
        "pasta (passt) and nft (nftables)",
    ),
    needs_image(IMAGE),
    pytest.mark.slow,
    pytest.mark.timeout(120),
]


def closed_folder(paths: list[Path]) -> Path | None:
    """The first folder on these paths that others may not enter (assumed the same one for all), or None."""
    for path in paths:
        for folder in reversed(path.parents):
            if not folder.stat().st_mode & 0o001:
                return folder
    return None


def as_user(home: Path, cgroup: Path | None = None) -> list[str]:
    """A command prefix that runs the rest as UID/GID with HOME=home in the private mount namespace described at the
    top, made by a script run as root; in `cgroup` (one delegated to the user) when given."""
    q = shlex.quote
    script = ["set -e"]
    if cgroup is not None:
        script.append(f"echo $$ > {q(str(cgroup / 'cgroup.procs'))}")
    if os.stat(TUN).st_mode & 0o006 != 0o006:
        dev = q(str(home / "dev"))
        script += [
            f"mount -t tmpfs -o mode=755 tmpfs {dev}",
            f"mknod -m 666 {dev}/tun c 10 200",
            f"mount --bind {dev}/tun {TUN}",
        ]
    needed = [Path(sys.base_prefix).resolve(), REPO]
    if (hidden := closed_folder(needed)) is not None:
        stage = q(str(home / "stage"))
        script += [f"mount --rbind {q(str(hidden))} {stage}", f"mount -t tmpfs -o mode=755 tmpfs {q(str(hidden))}"]
        for path in (p for p in needed if p.is_relative_to(hidden)):
            inside = q(str(path.relative_to(hidden)))
            script += [
                f"mkdir -p {q(str(hidden))}/{inside}",
                f"mount --rbind {stage}/{inside} {q(str(hidden))}/{inside}",
            ]
        script.append(f"umount -l {stage}")
    script.append('exec "$@"')
    return [
        *("unshare", "--mount", "--propagation", "private", "/bin/sh", "-c", "\n".join(script), "sh"),
        *("setpriv", f"--reuid={UID}", f"--regid={GID}", "--clear-groups", "env", f"HOME={home}"),
    ]


@pytest.fixture(scope="module")
def home() -> Iterator[Path]:
    """A folder of the user's (under /tmp: pytest's own temporary folders are root's, 0700): its state dir and its
    images dir, where IMAGE is the built one made the user's by an overlay and OTHERS an image root owns."""
    folder = Path(tempfile.mkdtemp(prefix="orchard-rootless-", dir="/tmp"))
    image = folder / "images" / image_dirname(IMAGE)
    try:
        for sub in ("state", "images", image, "image-upper", "image-work", "dev", "stage"):
            (folder / sub).mkdir()
        os.chown(folder, UID, GID)
        for path in [p for p in folder.rglob("*") if p.is_dir()]:
            os.chown(path, UID, GID)
        folder.chmod(0o755)
        built, upper, work = default_images_dir() / image.name, folder / "image-upper", folder / "image-work"
        options = f"lowerdir={built},upperdir={upper},workdir={work},metacopy=on"
        subprocess.run(["mount", "-t", "overlay", "overlay", "-o", options, str(image)], check=True, timeout=30)
        subprocess.run(["chown", "-R", f"{UID}:{GID}", str(image)], check=True, timeout=120)
        others = folder / "images" / OTHERS
        (others / "rootfs").mkdir(parents=True)
        meta = {"name": OTHERS, "imported_from": "a test", "size_bytes": 0, "build_time": "2026-01-01T00:00:00+00:00"}
        (others / "image.json").write_text(json.dumps(meta))
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(image)], check=False, capture_output=True)
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module")
def subtree() -> Iterator[Path | None]:
    """On a cgroup v2 host, a group delegated to the user (as Delegate=yes makes one: the group, its cgroup.procs,
    cgroup.subtree_control and cgroup.threads are the user's), removed with what the service left in it; else None."""
    if not DELEGATED:
        yield None
        return
    group = CGROUP_FS / f"orchard-rootless-{os.getpid()}"
    group.mkdir()
    try:
        for path in (group, *(group / f for f in ("cgroup.procs", "cgroup.subtree_control", "cgroup.threads"))):
            os.chown(path, UID, GID)
        yield group
    finally:
        for inner in sorted((Path(top) for top, _, _ in os.walk(group)), key=lambda p: -len(p.parts)):
            inner.rmdir()  # the service removed its sandboxes' groups and its parent; its leaf is empty once it ended


@pytest.fixture(scope="module")
def address(home: Path, subtree: Path | None) -> Iterator[str]:
    """The env service, run as the user, on its own state and images dirs (in the delegated group, if any)."""
    with served_env(home / "state", prefix=as_user(home, subtree), args=["--images-dir", str(home / "images")]) as at:
        yield at


@pytest.fixture
async def client(address: str) -> AsyncIterator[AsyncSandboxClient]:
    """A connected client; its sandboxes are deleted when the test ends."""
    async with await AsyncSandboxClient.connect(address) as client:
        yield client


@pytest.fixture
async def stub(address: str) -> AsyncIterator[env_pb2_grpc.EnvServiceStub]:
    """A raw stub, for request fields the SDK does not have (a disk cap)."""
    async with grpc.aio.insecure_channel(address) as channel:
        yield env_pb2_grpc.EnvServiceStub(channel)


def test_quick_start(address: str) -> None:
    """examples/quickstart.py as the README runs it: the bundled repository's suite fails, the patch fixes it."""
    done = subprocess.run(
        [sys.executable, str(REPO / "examples" / "quickstart.py")],
        env={**os.environ, "ORCHARD_ENV_ADDRESS": address},
        capture_output=True,
        text=True,
        timeout=100,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    before, _, after = done.stdout.partition("failed")
    assert "1 failed" in done.stdout and before and " passed" in after, done.stdout
    assert done.stdout.rstrip().endswith(" 0"), done.stdout  # the fixed suite's exit code


async def test_files_exec_and_pty(client: AsyncSandboxClient, home: Path) -> None:
    """The service's user is root in the sandbox; its files are that user's on the host; exec and a PTY work."""
    sandbox = await client.create_sandbox(IMAGE)
    await sandbox.upload_content(b"print('hi from', __import__('os').getuid())\n", "hi.py", mode=0o640)
    entries = {entry.name: entry for entry in await sandbox.list_files("")}
    assert "hi.py" in entries
    assert await sandbox.download_content("/workspace/hi.py") == b"print('hi from', __import__('os').getuid())\n"
    ran = await sandbox.exec(["python3", "hi.py"])
    assert (ran.stdout, ran.exit_code) == ("hi from 0\n", 0)
    written = await sandbox.exec(
        "echo new > /etc/motd && rm /etc/hostname && stat -c '%u %a' /workspace/hi.py && grep CapEff /proc/self/status"
    )
    assert (written.stdout, written.exit_code) == ("0 640\nCapEff:\t0000000000000000\n", 0), written.stderr
    upper = home / "state" / "sandboxes" / sandbox.sandbox_id / "upper"
    assert (upper / "workspace" / "hi.py").stat().st_uid == UID and (upper / "etc" / "motd").stat().st_uid == UID
    async with sandbox.pty(rows=30, cols=100) as term:
        await term.send("echo pty-$((40+2)); stty size; exit 3\n")
        output = b"".join([chunk async for chunk in term])
    assert b"pty-42" in output and b"30 100" in output and term.exit_code == 3
    await sandbox.delete()
    assert not (home / "state" / "sandboxes" / sandbox.sandbox_id).exists()


async def test_snapshots_and_forks(client: AsyncSandboxClient) -> None:
    """A fork sees its source's files, deletions (whiteouts) and replaced folders (opaque), also two levels deep,
    and a folder of mode 000 does not stop snapshotting or removal."""
    source = await client.create_sandbox(IMAGE)
    made = await source.exec(
        "rm -rf /usr/share/doc && mkdir /usr/share/doc && echo new > /usr/share/doc/f && rm /etc/hostname"
        " && mkdir locked && echo s > locked/s && chmod 000 locked && echo one > one"
    )
    assert made.exit_code == 0, made.stderr
    first = await source.snapshot()
    fork = await client.create_sandbox(from_snapshot=first.snapshot_id)
    seen = await fork.exec("ls /usr/share/doc; test -e /etc/hostname || echo no-hostname; cat one; stat -c %a locked")
    assert seen.stdout == "f\nno-hostname\none\n0\n", seen.stderr
    assert (await fork.exec("echo two > two")).exit_code == 0
    second = await fork.snapshot()
    grandchild = await client.create_sandbox(from_snapshot=second.snapshot_id)
    assert (await grandchild.exec("cat one two; ls /usr/share/doc")).stdout == "one\ntwo\nf\n"
    for sandbox in (grandchild, fork, source):
        await sandbox.delete()
    for snapshot in (second, first):
        assert await client.delete_snapshot(snapshot.snapshot_id)


async def test_no_network(client: AsyncSandboxClient, address: str) -> None:
    """A sandbox has only its own loopback: not this host's (where the service listens), nor any route out."""
    sandbox = await client.create_sandbox(IMAGE)
    port = address.rsplit(":", 1)[1]
    probe = (
        "import errno, socket\n"
        f"for target in [('127.0.0.1', {port}), ('192.0.2.1', 80), ('1.1.1.1', 443)]:\n"
        "    try:\n"
        "        socket.create_connection(target, timeout=3)\n"
        "        print('connected')\n"
        "    except OSError as err:\n"
        "        print(errno.errorcode[err.errno])\n"
    )
    ran = await sandbox.exec(["python3", "-c", probe])
    assert ran.stdout.split() == ["ECONNREFUSED", "ENETUNREACH", "ENETUNREACH"], ran.stderr
    links = await sandbox.exec(["cat", "/proc/net/dev"])
    assert [line.split(":")[0].strip() for line in links.stdout.splitlines()[2:]] == ["lo"]


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        pytest.param({"image": "host"}, "the `host` image needs an env service running as root", id="host-image"),
        pytest.param(
            {"resources": pb.Resources(memory_bytes=64 << 20)},
            "limits need cgroups this env service (uid 65534",
            id="memory",
            marks=without_delegation,
        ),
        pytest.param(
            {"resources": pb.Resources(cpu_millis=500)},
            "delegated cgroup v2 subtree",
            id="cpu",
            marks=without_delegation,
        ),
        pytest.param({"resources": pb.Resources(disk_bytes=64 << 20)}, "resources.disk_bytes needs root", id="disk"),
    ],
)
async def test_what_needs_root_is_refused(
    stub: env_pb2_grpc.EnvServiceStub, fields: dict[str, object], says: str
) -> None:
    """Each thing a rootless service cannot give is FAILED_PRECONDITION naming what is missing and what to do."""
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await create(stub, **{"image": IMAGE, **fields})
    assert caught.value.code() is grpc.StatusCode.FAILED_PRECONDITION
    assert says in (caught.value.details() or "")


# Forks children that close their output and sleep, until a fork fails or `limit` are made; prints how many and why.
FORKS = """
import errno, os, sys, time
made, limit = 0, int(sys.argv[1])
try:
    while made < limit:
        if os.fork() == 0:
            os.closerange(0, 3)
            time.sleep(20)
            os._exit(0)
        made += 1
    print(made, "done")
except OSError as err:
    print(made, errno.errorcode[err.errno])
"""


async def test_pids_limit_is_each_sandboxs_own(stub: env_pb2_grpc.EnvServiceStub) -> None:
    """A pids limit is each sandbox's own (without cgroups its RLIMIT_NPROC in its own user namespace, in a delegated
    subtree its group's pids.max): its forks fail at the limit, while another sandbox of the same user forks on; the
    built-in default is kept."""
    # 40 of the user's processes outside any sandbox: a limit that counted the user's processes on the host (the
    # kernel checks a namespace's parent level against the limit it was made with) would refuse the sandbox.
    user = ("setpriv", f"--reuid={UID}", f"--regid={GID}", "--clear-groups")
    holders = [subprocess.Popen([*user, "sleep", "60"]) for _ in range(40)]
    limited = await create(stub, image=IMAGE, resources=pb.Resources(pids=32))
    other = await create(stub, image=IMAGE)
    try:
        assert (limited.resources.pids, other.resources.pids) == (32, 4096)
        bomb = await run(stub, limited.sandbox_id, ["python3", "-c", FORKS, "1000"], timeout=90)
        assert len(bomb.stdout.split()) == 2, bomb  # "<forks made> <why it stopped>"
        made, why = bomb.stdout.decode().split()
        assert why == "EAGAIN" and 0 < int(made) < 32, bomb  # the agent and its threads count too
        beside = await run(stub, other.sandbox_id, ["python3", "-c", FORKS, "100"], timeout=90)
        assert beside.stdout.decode().split() == ["100", "done"], beside
    finally:
        for holder in holders:
            holder.kill()
            holder.wait()
        await delete_quietly(stub, limited.sandbox_id)
        await delete_quietly(stub, other.sandbox_id)


@with_delegation
async def test_memory_limit_in_the_delegated_subtree(stub: env_pb2_grpc.EnvServiceStub) -> None:
    """Past its memory limit a command is OOM-killed and reported as such, the sandbox carries on, and another one
    without the limit allocates more (small sizes: every page fault is slow in the VM this runs in)."""
    limited = await create(stub, image=IMAGE, resources=pb.Resources(memory_bytes=64 * MiB))
    other = await create(stub, image=IMAGE)
    try:
        small = await run(stub, limited.sandbox_id, ["python3", "-c", "x = b'x' * (16 << 20)"])
        assert (small.state, small.oom_killed) == (pb.EXEC_STATE_SUCCEEDED, False), small
        hog = await run(stub, limited.sandbox_id, ["python3", "-c", "x = b'x' * (200 << 20)"])
        assert (hog.state, hog.exit_code, hog.oom_killed) == (pb.EXEC_STATE_FAILED, 137, True), hog
        assert "out of memory" in hog.error and "64 MiB" in hog.error
        after = await run(stub, limited.sandbox_id, "echo still here")
        assert (after.stdout, after.oom_killed) == (b"still here\n", False)
        big = await run(stub, other.sandbox_id, ["python3", "-c", "x = b'x' * (100 << 20); print(len(x) >> 20)"])
        assert (big.state, big.stdout) == (pb.EXEC_STATE_SUCCEEDED, b"100\n"), big
    finally:
        await delete_quietly(stub, limited.sandbox_id)
        await delete_quietly(stub, other.sandbox_id)


@with_delegation
async def test_cpu_and_pids_limits_in_the_delegated_subtree(
    stub: env_pb2_grpc.EnvServiceStub, subtree: Path, home: Path
) -> None:
    """The limits are the sandbox's group under the user's subtree, in v2's files; at 500 millis one CPU-second takes
    about two seconds; a fork bomb stops at the pids limit and leaves nothing; deleting a sandbox removes its group."""
    limited = await create(stub, image=IMAGE, resources=pb.Resources(cpu_millis=500, memory_bytes=64 * MiB, pids=64))
    bombed = await create(stub, image=IMAGE, resources=pb.Resources(pids=64))
    group = subtree / parent_name(home / "state") / limited.sandbox_id
    try:
        limits = {f: (group / f).read_text().strip() for f in ("cpu.max", "memory.max", "memory.swap.max", "pids.max")}
        assert limits == {
            "cpu.max": "50000 100000",
            "memory.max": str(64 * MiB),
            "memory.swap.max": "0",
            "pids.max": "64",
        }
        assert (subtree / SERVICE_LEAF / "cgroup.procs").read_text().split()  # the service moved there to hand down
        busy = await run(stub, limited.sandbox_id, ["python3", "-c", BUSY_ONE_CPU_SECOND])
        assert busy.state == pb.EXEC_STATE_SUCCEEDED and float(busy.stdout) >= 1.8, busy
        bomb = await run(stub, bombed.sandbox_id, FORK_BOMB, timeout=5)
        assert b"fork: retry: Resource temporarily unavailable" in bomb.stderr, (bomb.state, bomb.exit_code, bomb.error)
        after = await run(stub, bombed.sandbox_id, "echo fine; ls /proc | grep -c '^[0-9]'")
        assert after.stdout.startswith(b"fine\n") and int(after.stdout.split()[1]) < 10, after
    finally:
        await delete_quietly(stub, limited.sandbox_id)
        await delete_quietly(stub, bombed.sandbox_id)
    assert not group.exists()


async def test_images_of_another_user_are_refused(client: AsyncSandboxClient) -> None:
    """An image whose files the service's user does not own would be read-only inside: refused, saying why."""
    with pytest.raises(FailedPrecondition, match="belongs to uid 0, and this env service runs rootless"):
        await client.create_sandbox(OTHERS)


async def test_allowlisted_egress(stub: env_pb2_grpc.EnvServiceStub, test_host: LinkLocalHost) -> None:
    """Through pasta: only allowed destinations answer; a broad rule opens the world but not this host, unless a rule
    names the host's one address, nor the host's loopback; a policy change applies to the live sandbox; no rules, no
    egress. The rules are nftables' where the kernel has its inet family, else legacy iptables' (the cgroup v2 VM)."""
    allowed, other, router = f"{test_host.allowed}:8080", f"{test_host.other}:8080", test_host.router

    async def greet(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"hello_host\n")
        await writer.drain()
        writer.close()

    host_server = await asyncio.start_server(greet, router, 0)  # on one of this host's own addresses
    here = f"{router}:{host_server.sockets[0].getsockname()[1]}"
    loopback_server = await asyncio.start_server(greet, "127.0.0.1", 0)  # before pasta starts: it must not map it
    loopback = f"127.0.0.1:{loopback_server.sockets[0].getsockname()[1]}"
    sb = await create(stub, image=IMAGE, network_policy=pb.NetworkPolicy(allow=[rule(f"{test_host.allowed}/32", 8080)]))
    try:
        assert await probe(stub, sb.sandbox_id, allowed, f"{test_host.allowed}:8081", other, here, loopback) == {
            allowed: f"hello_8080_from_{router}",  # pasta's connection, from this host
            f"{test_host.allowed}:8081": "EHOSTUNREACH",
            other: "EHOSTUNREACH",
            here: "EHOSTUNREACH",
            loopback: "ECONNREFUSED",  # the sandbox's own
        }
        await set_policy(stub, sb.sandbox_id, rule("0.0.0.0/0"))
        assert await probe(stub, sb.sandbox_id, other, here, loopback) == {
            other: f"hello_8080_from_{router}",
            here: "EHOSTUNREACH",
            loopback: "ECONNREFUSED",
        }
        await set_policy(stub, sb.sandbox_id, rule("0.0.0.0/0"), rule(f"{router}/32"))
        assert (await probe(stub, sb.sandbox_id, here))[here] == "hello_host"
        await set_policy(stub, sb.sandbox_id)
        assert await probe(stub, sb.sandbox_id, allowed) == {allowed: "EHOSTUNREACH"}
    finally:
        host_server.close()
        loopback_server.close()
        await delete_quietly(stub, sb.sandbox_id)


def image_archive(path: Path) -> Path:
    """A `docker save` archive of one layer: a read-only folder holding a file, another user's setuid file, a
    device node and a symlink."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as layer:
        for name, kind, mode, data in [
            ("ro", tarfile.DIRTYPE, 0o555, b""),
            ("ro/inside", tarfile.REGTYPE, 0o644, b"kept\n"),
            ("tool", tarfile.REGTYPE, 0o4755, b"#!/bin/sh\n"),
            ("null", tarfile.CHRTYPE, 0o666, b""),
            ("link", tarfile.SYMTYPE, 0o777, b""),
        ]:
            info = tarfile.TarInfo(name)
            info.type, info.mode, info.size, info.uid, info.gid = kind, mode, len(data), 1000, 1000
            info.devmajor, info.devminor, info.linkname = 1, 3, "ro/inside"
            layer.addfile(info, io.BytesIO(data))
    with tarfile.open(path, "w") as tar:
        for name, data in [
            ("l0/layer.tar", out.getvalue()),
            ("config.json", json.dumps({"config": {"Env": ["PATH=/usr/bin"]}}).encode()),
            ("manifest.json", json.dumps([{"Config": "config.json", "Layers": ["l0/layer.tar"]}]).encode()),
        ]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


async def test_the_user_imports_an_image(client: AsyncSandboxClient, home: Path) -> None:
    """`orchard image import` as the user: every file becomes its own, device nodes are left out, a read-only
    folder keeps its mode and its file; a sandbox runs on the image (its agent needs nothing from it)."""
    archive = image_archive(home / "image.tar")
    imported = subprocess.run(
        [*as_user(home), ORCHARD, "image", "--images-dir", str(home / "images"), "import", "mine", str(archive)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert imported.returncode == 0, imported.stderr
    rootfs = home / "images" / "mine" / "rootfs"
    owners = {p.name: (p.lstat().st_uid, oct(p.lstat().st_mode & 0o7777)) for p in rootfs.iterdir()}
    assert {k: owners[k] for k in ("ro", "tool", "link")} == {
        "ro": (UID, "0o555"),
        "tool": (UID, "0o4755"),
        "link": (UID, "0o777"),
    }
    assert "null" not in owners and (rootfs / "ro" / "inside").read_text() == "kept\n"
    sandbox = await client.create_sandbox("mine")
    assert await sandbox.download_content("/link") == b"kept\n"
    assert {e.name: e.mode for e in await sandbox.list_files("/ro")} == {"inside": 0o644}
    await sandbox.delete()
