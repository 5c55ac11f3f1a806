"""The red-team suite: attacks from inside sandboxes of every built image, and from a hostile client at the API,
each counted, none allowed through. In-sandbox probes are redteam_probes.py (sysctls, masked /proc paths,
core_pattern, keyrings, user and other namespaces, mounts, raw and packet sockets, kernel calls, egress); here
also egress past an allowlist, file-API traversal and symlink races, cross-tenant calls, a fork bomb, a memory
hog, a disk fill and an output flood against the service's memory.

With ORCHARD_REDTEAM_REPORT=<file> set, the counts (attempts, got through, lost) per class are written there as
JSON (bench/redteam.py runs this suite that way for the README's figures).
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from env_helpers import StartEnv, create, duration, image_built, needs_sandboxes, run
from test_env_network import (
    LinkLocalHost,
    rule,
    test_host,  # noqa: F401 - the link-local test host fixture
)

from orchard.env.v1 import env_pb2 as pb

pytestmark = [needs_sandboxes, pytest.mark.timeout(300)]

HERE = Path(__file__).resolve().parent
PROBES = (HERE / "redteam_probes.py").read_text()
IMAGES = ["host", "python:3.11-slim", "claw"]
MiB = 1 << 20
Tally = dict[str, collections.Counter[str]]


@pytest.fixture(scope="module")
def tally() -> Iterator[Tally]:
    """Counts per attack class: attempts, through (got what a sandbox must not) and lost (data the service lost)."""
    counts: Tally = collections.defaultdict(collections.Counter)
    yield counts
    if report := os.environ.get("ORCHARD_REDTEAM_REPORT"):
        with open(report, "a") as out:
            out.write(json.dumps({cls: dict(c) for cls, c in counts.items()}) + "\n")


def record(tally: Tally, cls: str, attempts: int, through: list[str], lost: int = 0) -> None:
    tally[cls]["attempts"] += attempts
    tally[cls]["through"] += len(through)
    tally[cls]["lost"] += lost
    assert not through, f"{cls}: {len(through)} of {attempts} attempts got through: {through[:10]}"


def host_addresses() -> list[str]:
    """This host's own IPv4 addresses (every interface but loopback)."""
    out = subprocess.run(["ip", "-4", "-o", "addr", "show"], capture_output=True, text=True, check=True).stdout
    return [line.split()[3].split("/")[0] for line in out.splitlines() if " lo " not in line]


@contextlib.contextmanager
def host_listener() -> Iterator[int]:
    """A TCP server on every host address (0.0.0.0), as a host service a sandbox must not reach; yields its port."""
    server = socket.socket()
    server.bind(("0.0.0.0", 0))
    server.listen(16)
    try:
        yield server.getsockname()[1]
    finally:
        server.close()


@pytest.mark.parametrize("image", IMAGES)
async def test_in_sandbox_probes_get_nothing(start_env: StartEnv, tally: Tally, image: str) -> None:
    """Every probe class from inside a sandbox of this image; each class is tried a meaningful number of times."""
    if not image_built(image):
        pytest.skip(f"image {image} is not built: run `orchard image build {image}` (scripts/install.sh does)")
    env = await start_env()
    sb = await create(env.stub, image=image)
    with host_listener() as port:
        targets = [f"{address}:{port}" for address in host_addresses()] + [f"127.0.0.1:{port}"]
        ex = await run(env.stub, sb.sandbox_id, ["python3", "-c", PROBES, *targets], timeout=240)
    assert ex.exit_code == 0, ex.stderr.decode()[-3000:]
    rows = [json.loads(line) for line in ex.stdout.decode().splitlines()]
    by_class: dict[str, list[dict[str, object]]] = collections.defaultdict(list)
    for row in rows:
        by_class[str(row["cls"])].append(row)
    least = {
        "writable-sysctl": 100,
        "core-pattern": 5,
        "masked-path": 10,
        "keyring": 3,
        "user-namespace": 1,
        "namespace": 8,
        "mount": 6,
        "raw-socket": 5,
        "kernel-call": 15,
        "egress": 14,
    }
    for cls, minimum in least.items():
        assert len(by_class[cls]) >= minimum, f"only {len(by_class[cls])} {cls} probes ran"
    for cls, attempts in by_class.items():
        record(tally, cls, len(attempts), [f"{a['target']} ({a['detail']})" for a in attempts if a["through"]])


async def test_egress_past_an_allowlist_reaches_only_what_it_allows(
    start_env: StartEnv,
    tally: Tally,
    test_host: LinkLocalHost,  # noqa: F811 - the fixture imported above
) -> None:
    """A sandbox allowed one address:port reaches it and nothing else: not the host's own addresses (its end of
    the veth included) where a host service listens, not another port or address, not the metadata service."""
    env = await start_env()
    allowed = f"{test_host.allowed}:8080"
    sb = await create(env.stub, network_policy=pb.NetworkPolicy(allow=[rule(f"{test_host.allowed}/32", 8080)]))
    gateway = (await run(env.stub, sb.sandbox_id, "ip -4 route show default")).stdout.decode().split()[2]
    with host_listener() as port:
        targets = [
            f"{gateway}:{port}",
            f"{gateway}:{env.server.port}",
            f"{test_host.router}:{port}",
            f"{test_host.allowed}:8081",
            f"{test_host.other}:8080",
            f"{test_host.other}:22",
            "169.254.169.254:80",
            "127.0.0.1:" + str(port),
            *(f"{a}:{port}" for a in host_addresses()),
        ]
        probe = (
            "import socket, sys\nfor t in sys.argv[1:]:\n    h, p = t.rsplit(':', 1)\n    try:\n"
            "        socket.create_connection((h, int(p)), timeout=2).close(); print(t, 'open')\n"
            "    except OSError as e: print(t, 'closed')\n"
        )
        ex = await run(env.stub, sb.sandbox_id, ["python3", "-c", probe, allowed, *targets], timeout=120)
    results = dict(line.split() for line in ex.stdout.decode().splitlines())
    assert results.pop(allowed) == "open"  # the allowlist works: the rest is not refused for want of a network
    record(tally, "egress", len(results), [t for t, state in results.items() if state == "open"])


async def test_file_api_traversal_and_symlink_races_stay_inside(start_env: StartEnv, tally: Tally) -> None:
    """A secret on the host is never read and a marker never written through the file RPCs: `..`, absolute
    /proc/*/root paths, symlinks to / and a symlink flipped between a folder and / while the RPCs run."""
    env = await start_env()
    sb = await create(env.stub, image="python:3.11-slim" if image_built("python:3.11-slim") else "host")
    sid = sb.sandbox_id
    secret = f"orchard-redteam-{uuid.uuid4().hex}"
    host_secret = Path("/tmp") / secret
    host_secret.write_text(secret)
    marker = Path("/tmp") / f"{secret}-written"
    through: list[str] = []
    attempts = 0
    try:
        await run(env.stub, sid, "mkdir -p /workspace/d && ln -s / /workspace/root && ln -s /tmp /workspace/t")
        flipper = await env.stub.StartExec(
            pb.StartExecRequest(
                sandbox_id=sid,
                timeout=duration(60),
                shell=(
                    "for i in $(seq 1 100000); do ln -sfn /workspace/d /workspace/race; ln -sfn / /workspace/race; done"
                ),
            ),
            timeout=10,
        )
        paths = [
            f"../../../../tmp/{secret}",
            f"/proc/1/root/tmp/{secret}",
            f"/proc/self/root/tmp/{secret}",
            f"root/tmp/{secret}",
            f"t/{secret}",
            f"race/tmp/{secret}",
            f"/proc/1/cwd/../../tmp/{secret}",
            f"//tmp//{secret}",
            f"/workspace/../tmp/{secret}",
        ]
        for _ in range(8):
            for path in paths:
                attempts += 1
                with contextlib.suppress(grpc.aio.AioRpcError):
                    got = b"".join(
                        [
                            m.chunk
                            async for m in env.stub.DownloadFile(
                                pb.DownloadFileRequest(sandbox_id=sid, path=path), timeout=10
                            )
                        ]
                    )
                    if secret.encode() in got:
                        through.append(f"read {path}")
                attempts += 1
                target = path.replace(secret, marker.name)
                with contextlib.suppress(grpc.aio.AioRpcError):
                    await env.stub.UploadFile(
                        iter(
                            [
                                pb.UploadFileRequest(header=pb.FileHeader(sandbox_id=sid, path=target)),
                                pb.UploadFileRequest(chunk=b"escaped"),
                            ]
                        ),
                        timeout=10,
                    )
                if marker.exists():
                    through.append(f"wrote {target}")
                    marker.unlink()
                attempts += 1
                with contextlib.suppress(grpc.aio.AioRpcError):
                    listed = await env.stub.ListFiles(
                        pb.ListFilesRequest(sandbox_id=sid, path=path.rsplit("/", 1)[0] or "/"), timeout=10
                    )
                    if any(f.name == secret for f in listed.files):
                        through.append(f"listed {path}")
        await env.stub.CancelExec(pb.CancelExecRequest(exec_id=flipper.exec.exec_id), timeout=15)
    finally:
        host_secret.unlink(missing_ok=True)
        marker.unlink(missing_ok=True)
    record(tally, "file-api", attempts, through)


async def test_cross_tenant_calls_answer_as_unknown_ids(start_env: StartEnv, tally: Tally, tmp_path: Path) -> None:
    """Bob sends every RPC at Alice's sandbox, exec and snapshot ids: each answer is the one an unknown id gets
    (same code, same message with the id swapped), and Alice's things are untouched."""
    tokens = tmp_path / "tokens"
    alice_token, bob_token = "alice-token-0001", "bob-token-00002"
    tokens.write_text(f"alice:{alice_token}\nbob:{bob_token}\n")
    env = await start_env(auth_tokens_file=tokens)
    stub = env.stub
    alice, bob = (("authorization", f"Bearer {alice_token}"),), (("authorization", f"Bearer {bob_token}"),)
    sb = (await stub.CreateSandbox(pb.CreateSandboxRequest(image="host"), metadata=alice, timeout=30)).sandbox
    ex = (
        await stub.StartExec(
            pb.StartExecRequest(sandbox_id=sb.sandbox_id, shell="echo alice-secret", wait=duration(10)),
            metadata=alice,
            timeout=30,
        )
    ).exec
    snap = (
        await stub.SnapshotSandbox(pb.SnapshotSandboxRequest(sandbox_id=sb.sandbox_id), metadata=alice, timeout=60)
    ).snapshot

    def calls(sid: str, eid: str, snap_id: str) -> list[tuple[str, object]]:
        header = pb.FileHeader(sandbox_id=sid, path="x")
        return [
            ("GetSandbox", stub.GetSandbox(pb.GetSandboxRequest(sandbox_id=sid), metadata=bob)),
            ("DeleteSandbox", stub.DeleteSandbox(pb.DeleteSandboxRequest(sandbox_id=sid), metadata=bob)),
            ("Heartbeat", stub.Heartbeat(pb.HeartbeatRequest(sandbox_id=sid), metadata=bob)),
            ("SetNetworkPolicy", stub.SetNetworkPolicy(pb.SetNetworkPolicyRequest(sandbox_id=sid), metadata=bob)),
            ("StartExec", stub.StartExec(pb.StartExecRequest(sandbox_id=sid, shell="id"), metadata=bob)),
            ("ApplyPatch", stub.ApplyPatch(pb.ApplyPatchRequest(sandbox_id=sid, patch="x"), metadata=bob)),
            ("ListFiles", stub.ListFiles(pb.ListFilesRequest(sandbox_id=sid), metadata=bob)),
            ("SnapshotSandbox", stub.SnapshotSandbox(pb.SnapshotSandboxRequest(sandbox_id=sid), metadata=bob)),
            ("UploadFile", stub.UploadFile(iter([pb.UploadFileRequest(header=header)]), metadata=bob)),
            ("GetExec", stub.GetExec(pb.GetExecRequest(exec_id=eid), metadata=bob)),
            ("WaitExec", stub.WaitExec(pb.WaitExecRequest(exec_id=eid), metadata=bob)),
            ("CancelExec", stub.CancelExec(pb.CancelExecRequest(exec_id=eid), metadata=bob)),
            (
                "ReadExecOutput",
                stub.ReadExecOutput(
                    pb.ReadExecOutputRequest(exec_id=eid, stream=pb.OUTPUT_STREAM_STDOUT), metadata=bob
                ),
            ),
            ("GetSnapshot", stub.GetSnapshot(pb.GetSnapshotRequest(snapshot_id=snap_id), metadata=bob)),
            ("DeleteSnapshot", stub.DeleteSnapshot(pb.DeleteSnapshotRequest(snapshot_id=snap_id), metadata=bob)),
            (
                "CreateSandbox from_snapshot",
                stub.CreateSandbox(pb.CreateSandboxRequest(from_snapshot=snap_id), metadata=bob),
            ),
        ]

    async def answer(call: object) -> tuple[str, str]:
        try:
            await call  # type: ignore[misc]
        except grpc.aio.AioRpcError as err:
            return err.code().name, err.details() or ""
        return "OK", ""

    async def streamed(method: str, request: object, ids: tuple[str, str]) -> tuple[str, str]:
        try:
            async for _ in getattr(stub, method)(request, metadata=bob):
                pass
        except grpc.aio.AioRpcError as err:
            return err.code().name, (err.details() or "").replace(ids[0], ids[1])
        return "OK", ""

    through = []
    real, fake = (
        calls(sb.sandbox_id, ex.exec_id, snap.snapshot_id),
        calls("sb-unknown00000", "ex-unknown00000000", "snap-unknown0000"),
    )
    for (name, theirs), (_, unknown) in zip(real, fake, strict=True):
        got, expected = await answer(theirs), await answer(unknown)
        for real_id, fake_id in (
            (sb.sandbox_id, "sb-unknown00000"),
            (ex.exec_id, "ex-unknown00000000"),
            (snap.snapshot_id, "snap-unknown0000"),
        ):
            got = (got[0], got[1].replace(real_id, fake_id))
        if got != expected or got[0] == "OK":
            through.append(f"{name}: {got} vs {expected}")
    for method, request, ids in (
        ("StreamExec", pb.StreamExecRequest(exec_id=ex.exec_id), (ex.exec_id, "ex-unknown00000000")),
        (
            "DownloadFile",
            pb.DownloadFileRequest(sandbox_id=sb.sandbox_id, path="x"),
            (sb.sandbox_id, "sb-unknown00000"),
        ),
    ):
        unknown_request = type(request)()
        unknown_request.CopyFrom(request)
        if method == "StreamExec":
            unknown_request.exec_id = ids[1]  # type: ignore[attr-defined]
        else:
            unknown_request.sandbox_id = ids[1]  # type: ignore[attr-defined]
        if await streamed(method, request, ids) != await streamed(method, unknown_request, ids):
            through.append(method)
    mine = await stub.CreateSandbox(
        pb.CreateSandboxRequest(image="host", sandbox_id=sb.sandbox_id), metadata=bob, timeout=30
    )  # an id Alice holds is as free to Bob as any unknown one
    listed = await stub.ListSandboxes(pb.ListSandboxesRequest(), metadata=bob, timeout=10)
    if [s.tenant for s in listed.sandboxes] != ["bob"] or mine.sandbox.tenant != "bob":
        through.append("ListSandboxes or CreateSandbox showed Alice's sandbox")
    snaps = await stub.ListSnapshots(pb.ListSnapshotsRequest(), metadata=bob, timeout=10)
    if snaps.snapshots:
        through.append("ListSnapshots showed Alice's snapshot")
    still = await stub.GetExec(pb.GetExecRequest(exec_id=ex.exec_id), metadata=alice, timeout=10)
    lost = int(still.exec.stdout != b"alice-secret\n")
    await stub.GetSandbox(pb.GetSandboxRequest(sandbox_id=sb.sandbox_id), metadata=alice, timeout=10)
    record(tally, "cross-tenant", len(real) + 5, through, lost)
    assert not lost


FORK_BOMB = "bomb() { bomb | bomb & }; bomb; sleep 5"


async def test_resource_attacks_are_contained(start_env: StartEnv, tally: Tally) -> None:
    """A fork bomb, a memory hog and a disk fill each hit their sandbox's limit; the sandbox, a neighbour and
    the service carry on."""
    env = await start_env()
    neighbour = await create(env.stub)
    through = []
    bombed = await create(env.stub, resources=pb.Resources(pids=64, cpu_millis=500))
    await run(env.stub, bombed.sandbox_id, FORK_BOMB, timeout=8)
    count = await run(env.stub, bombed.sandbox_id, "ls /proc | grep -c '^[0-9]'")
    if count.exit_code != 0 or int(count.stdout) > 10:
        through.append(f"fork bomb left {count.stdout!r} processes")
    record(tally, "fork-bomb", 1, through)
    hog_box = await create(env.stub, resources=pb.Resources(memory_bytes=128 * MiB))
    hog = await run(env.stub, hog_box.sandbox_id, ["python3", "-c", "x = b'x' * (1 << 30)"])
    record(tally, "memory-hog", 1, [] if hog.oom_killed else [f"1 GiB allocated under 128 MiB: {hog.state}"])
    full_box = await create(env.stub, resources=pb.Resources(disk_bytes=64 * MiB))
    free_before = os.statvfs(env.settings.state_dir).f_bavail * os.statvfs(env.settings.state_dir).f_frsize
    fill = await run(
        env.stub,
        full_box.sandbox_id,
        "head -c 512M /dev/zero > /workspace/fill; echo $?; du -sm /workspace/fill",
        timeout=120,
    )
    free_after = os.statvfs(env.settings.state_dir).f_bavail * os.statvfs(env.settings.state_dir).f_frsize
    written = int(fill.stdout.split()[-2])
    filled = [] if written <= 64 and b"No space left" in fill.stderr else [f"wrote {written} MiB under a 64 MiB cap"]
    if free_before - free_after > 200 * MiB:
        filled.append(f"the host lost {(free_before - free_after) >> 20} MiB")
    record(tally, "disk-fill", 1, filled)
    for sandbox in (bombed, hog_box, full_box, neighbour):
        after = await run(env.stub, sandbox.sandbox_id, "echo alive")
        assert after.stdout == b"alive\n", sandbox.sandbox_id


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for {pid}")


@pytest.fixture
def env_process(tmp_path: Path) -> Iterator[tuple[str, int]]:
    """`orchard serve env` as a process of its own (its memory is what is measured); its address and pid."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [
            str(Path(sys.executable).with_name("orchard")),
            "serve",
            "env",
            "--port",
            str(port),
            "--state-dir",
            str(tmp_path / "state"),
            "--log-level",
            "WARNING",
            "--max-retained-output-bytes",
            str(256 * MiB),
        ],
        stdout=subprocess.DEVNULL,
    )
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            grpc.channel_ready_future(channel).result(timeout=60)
        yield f"127.0.0.1:{port}", proc.pid
    finally:
        proc.terminate()
        proc.wait(timeout=60)


async def test_an_output_flood_leaves_the_service_flat(env_process: tuple[str, int], tally: Tally) -> None:
    """Commands printing 32 MiB each, read back whole: the service's RSS after them is within 40 MiB of what it
    was after a warm-up, and every byte came back (bench/env_output_flood.py runs 1,000 of them)."""
    from orchard import AsyncSandboxClient

    address, pid = env_process
    size, warmup, execs = 32 * MiB, 5, 40
    lost = 0
    async with AsyncSandboxClient(target=address) as client:
        sandbox = await client.create_sandbox("host")
        for i in range(execs):
            result = await sandbox.exec(f"head -c {size} /dev/zero", max_output=size, timeout=120)
            lost += int(len(result.stdout) != size)
            if i + 1 == warmup:
                after_warmup = _rss_mib(pid)
        end = _rss_mib(pid)
        await sandbox.delete()
    growth = end - after_warmup
    record(tally, "output-flood", execs, [f"RSS grew {growth:.0f} MiB"] if growth > 40 else [], lost)
    assert not lost


async def test_every_sandbox_still_has_its_namespaces(start_env: StartEnv, tally: Tally) -> None:
    """The probes ran as root in the sandbox: it is the host's uid 0 without capabilities, in namespaces of its
    own (its pid 1 is not the host's init), so what it could not do above it cannot do by another name."""
    env = await start_env()
    sb = await create(env.stub)
    ex = await run(
        env.stub,
        sb.sandbox_id,
        "grep CapEff /proc/self/status; readlink /proc/self/ns/pid /proc/self/ns/net /proc/self/ns/mnt",
    )
    caps, *namespaces = ex.stdout.decode().split("\n")[:4]
    host = [os.readlink(f"/proc/self/ns/{n}") for n in ("pid", "net", "mnt")]
    through = []
    if caps.split()[1] != "0000000000000000":
        through.append(caps)
    through += [f"shares {mine}" for mine, theirs in zip(namespaces, host, strict=True) if mine == theirs]
    record(tally, "capabilities-namespaces", 4, through)
