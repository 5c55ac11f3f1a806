"""The env service run as an unprivileged user (`nobody`): the quick start, files, exec, PTY, snapshots and forks,
no network, and the refusals of what needs root, through the real gRPC API and SDK.

The test runs as root and drops to the user itself (setpriv). One service for the module, on a state dir and an
images dir that user owns (a copy of the built python:3.11-slim image: a rootless sandbox can write only files its
user owns). It starts in a private mount namespace only to give the user what a user's machine gives it: this
checkout's Python, on a path through a folder others may not enter here (root's home, 0700), which a tmpfs holding
just that path covers there; and /dev/net/tun for pasta, mode 0600 on this machine (Debian's udev makes it 0666),
replaced there by a node of mode 0666.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import grpc
import pytest
import test_env_network
from env_helpers import create, delete_quietly, image_built, needs_image, served_env
from test_env_network import LinkLocalHost, probe, rule, set_policy

from orchard import AsyncSandboxClient
from orchard.env.v1 import env_pb2 as pb
from orchard.env.v1 import env_pb2_grpc
from orchard.errors import FailedPrecondition
from orchard.services.env.images import default_images_dir, image_dirname

IMAGE = "python:3.11-slim"
UID = GID = 65534  # nobody
REPO = Path(__file__).resolve().parents[2]
TUN = "/dev/net/tun"

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

# Run as root in a private mount namespace: a tun device others may use when $2 is "tun"; cover the one folder others
# may not enter ($3, "" for none) with a tmpfs holding only the paths named before "--" (relative to it); exec the rest.
EXPOSE = """set -e
stage="$1"; tun="$2"; hidden="$3"; shift 3
if [ "$tun" = tun ]; then
  mkdir -p "$stage.dev"; mount -t tmpfs -o mode=755 tmpfs "$stage.dev"
  mknod -m 666 "$stage.dev/tun" c 10 200; mount --bind "$stage.dev/tun" /dev/net/tun
fi
if [ -n "$hidden" ]; then
  mkdir -p "$stage"; mount --rbind "$hidden" "$stage"; mount -t tmpfs -o mode=755 tmpfs "$hidden"
fi
while [ "$1" != -- ]; do mkdir -p "$hidden/$1"; mount --rbind "$stage/$1" "$hidden/$1"; shift; done
shift
[ -z "$hidden" ] || umount -l "$stage"
exec "$@"
"""


def closed_folder(paths: list[Path]) -> Path | None:
    """The first folder on these paths that others may not enter (assumed the same one for all), or None."""
    for path in paths:
        for folder in reversed(path.parents):
            if not folder.stat().st_mode & 0o001:
                return folder
    return None


def as_user(home: Path) -> list[str]:
    """A command prefix that runs the rest as UID/GID with HOME=home, able to reach this checkout's Python."""
    needed = [Path(sys.base_prefix).resolve(), REPO]
    hidden = closed_folder(needed)
    inside = [str(p.relative_to(hidden)) for p in needed if hidden is not None and p.is_relative_to(hidden)]
    tun = "tun" if os.stat(TUN).st_mode & 0o006 != 0o006 else ""
    return [
        *("unshare", "--mount", "--propagation", "private", "/bin/sh", "-c", EXPOSE, "sh", str(home / "stage")),
        tun,
        str(hidden or ""),
        *inside,
        "--",
        *("setpriv", f"--reuid={UID}", f"--regid={GID}", "--clear-groups", "env", f"HOME={home}"),
    ]


@pytest.fixture(scope="module")
def home() -> Iterator[Path]:
    """A folder of the user's: its images dir (a copy of IMAGE) and its state dir (under /tmp: pytest's own
    temporary folders are root's, 0700)."""
    folder = Path(tempfile.mkdtemp(prefix="orchard-rootless-", dir="/tmp"))
    try:
        (folder / "images").mkdir()
        (folder / "state").mkdir()
        assert image_built(IMAGE)
        subprocess.run(
            ["cp", "-a", str(default_images_dir() / image_dirname(IMAGE)), str(folder / "images")], check=True
        )
        subprocess.run(["chown", "-R", f"{UID}:{GID}", str(folder)], check=True)
        folder.chmod(0o755)
        yield folder
    finally:
        subprocess.run(["rm", "-rf", str(folder)], check=False)  # ten times faster than shutil.rmtree here


@pytest.fixture(scope="module")
def address(home: Path) -> Iterator[str]:
    """The env service, run as the user, on its own state and images dirs."""
    with served_env(home / "state", prefix=as_user(home), args=["--images-dir", str(home / "images")]) as address:
        yield address


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
        ({"image": "host"}, "the `host` image needs an env service running as root"),
        ({"resources": pb.Resources(memory_bytes=64 << 20)}, "limits need cgroups this env service (uid 65534"),
        ({"resources": pb.Resources(pids=64)}, "delegated cgroup v2 subtree"),
        ({"resources": pb.Resources(disk_bytes=64 << 20)}, "resources.disk_bytes needs root"),
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


async def test_images_of_another_user_are_refused(client: AsyncSandboxClient, home: Path) -> None:
    """An image whose files the service's user does not own would be read-only inside: refused, saying why."""
    rootfs = home / "images" / image_dirname(IMAGE) / "rootfs"
    os.chown(rootfs, 0, 0)
    try:
        with pytest.raises(FailedPrecondition, match="belongs to uid 0, and this env service runs rootless"):
            await client.create_sandbox(IMAGE)
    finally:
        os.chown(rootfs, UID, GID)


async def test_allowlisted_egress(stub: env_pb2_grpc.EnvServiceStub, test_host: LinkLocalHost) -> None:
    """Through pasta: only allowed destinations answer; a broad rule opens the world but not this host, unless a rule
    names the host's one address; a policy change applies to the live sandbox; no rules, no egress."""
    allowed, other, router = f"{test_host.allowed}:8080", f"{test_host.other}:8080", test_host.router
    sb = await create(stub, image=IMAGE, network_policy=pb.NetworkPolicy(allow=[rule(f"{test_host.allowed}/32", 8080)]))

    async def greet(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"hello_host\n")
        await writer.drain()
        writer.close()

    host_server = await asyncio.start_server(greet, router, 0)  # on one of this host's own addresses
    here = f"{router}:{host_server.sockets[0].getsockname()[1]}"
    try:
        assert await probe(stub, sb.sandbox_id, allowed, f"{test_host.allowed}:8081", other, here) == {
            allowed: f"hello_8080_from_{router}",  # pasta's connection, from this host
            f"{test_host.allowed}:8081": "EHOSTUNREACH",
            other: "EHOSTUNREACH",
            here: "EHOSTUNREACH",
        }
        await set_policy(stub, sb.sandbox_id, rule("0.0.0.0/0"))
        assert await probe(stub, sb.sandbox_id, other, here) == {
            other: f"hello_8080_from_{router}",
            here: "EHOSTUNREACH",
        }
        await set_policy(stub, sb.sandbox_id, rule("0.0.0.0/0"), rule(f"{router}/32"))
        assert (await probe(stub, sb.sandbox_id, here))[here] == "hello_host"
        await set_policy(stub, sb.sandbox_id)
        assert await probe(stub, sb.sandbox_id, allowed) == {allowed: "EHOSTUNREACH"}
    finally:
        host_server.close()
        await delete_quietly(stub, sb.sandbox_id)
