"""Snapshots and forks with real sandboxes: SnapshotSandbox freezes a sandbox's files, CreateSandbox(from_snapshot)
starts copies of them that diverge independently, on the "host" image and on python:3.11-slim (a built image,
where forks stack the snapshot's layer instead of copying it)."""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Awaitable
from pathlib import Path
from typing import Any, TypeAlias

import grpc
import pytest
from env_helpers import EnvServer, StartEnv, create, needs_sandboxes, run, start

from orchard.env.v1 import env_pb2 as pb
from orchard.env.v1 import env_pb2_grpc
from orchard.errors import FailedPrecondition
from orchard.services.env.images import ImageStore, default_images_dir

pytestmark = [needs_sandboxes, pytest.mark.timeout(120)]

Stub = env_pb2_grpc.EnvServiceStub
Code: TypeAlias = grpc.StatusCode
PYTHON = "python:3.11-slim"


def _python_built() -> bool:
    try:
        ImageStore(default_images_dir()).resolve(PYTHON)
    except FailedPrecondition:
        return False
    return True


IMAGES = [
    pytest.param("host", id="host"),
    pytest.param(
        PYTHON,
        id="python",
        marks=pytest.mark.skipif(
            not _python_built(), reason=f"image {PYTHON} is not built: run `orchard image build {PYTHON}`"
        ),
    ),
]

# Files of every kind a writable layer holds: new files, a symlink, a file's mode, an image file deleted
# (a whiteout), an image directory replaced (an opaque directory), and a git repository with one commit.
SETUP = """
set -e
mkdir -p proj/deep/er && echo base > proj/a.txt && echo deep > proj/deep/er/f && ln -s a.txt proj/link
echo owned > proj/owned && chmod 640 proj/owned
rm /etc/debian_version
rm -rf /etc/apt && mkdir /etc/apt && echo mine > /etc/apt/only
git init -q repo && cd repo && echo hello > README && git add README
git -c user.name=t -c user.email=t@example.com commit -q -m first
"""
# What a sandbox made from that snapshot must see, printed one fact per line.
CHECK = """
cat proj/a.txt proj/deep/er/f; readlink proj/link; stat -c '%u:%g %a' proj/owned
test -e /etc/debian_version && echo debian_version-present || echo debian_version-deleted
ls -A /etc/apt | tr '\\n' ' '; echo
cd repo && git status --porcelain | wc -l && git log --format=%s
"""
CHECKED = "base\ndeep\na.txt\n0:0 640\ndebian_version-deleted\nonly \n0\nfirst\n"


async def rpc_error(call: Awaitable[Any]) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call
    return info.value


async def sh(stub: Stub, sandbox_id: str, cmd: str) -> str:
    """Run cmd; it must succeed; returns its stdout."""
    ex = await run(stub, sandbox_id, cmd)
    assert ex.state == pb.EXEC_STATE_SUCCEEDED, (cmd, ex.exit_code, ex.stdout, ex.stderr, ex.error)
    return ex.stdout.decode()


async def snapshot(stub: Stub, sandbox_id: str, **fields: Any) -> pb.Snapshot:
    request = pb.SnapshotSandboxRequest(sandbox_id=sandbox_id, **fields)
    return (await stub.SnapshotSandbox(request, timeout=60)).snapshot


async def fork(stub: Stub, snapshot_id: str, **fields: Any) -> pb.Sandbox:
    return await create(stub, image="", from_snapshot=snapshot_id, **fields)


def layers_on_disk(env: EnvServer) -> list[str]:
    return sorted(p.name for p in (env.settings.state_dir / "snapshots").iterdir())


@pytest.mark.parametrize("image", IMAGES)
async def test_forks_start_from_the_snapshot_and_diverge(start_env: StartEnv, image: str) -> None:
    """Three forks see every file of the snapshot (deletions, opaque dirs, owners, a clean git repo), each one's
    writes stay its own, and the original carries on without touching the snapshot or the forks."""
    env = await start_env()
    stub = env.stub
    source = await create(stub, image=image)
    await sh(stub, source.sandbox_id, SETUP)
    snap = await snapshot(stub, source.sandbox_id, labels={"step": "1"})
    assert (snap.name, snap.sandbox_id, snap.image, snap.tenant) == (
        f"snapshots/{snap.snapshot_id}",
        source.sandbox_id,
        image,
        "default",
    )
    assert snap.snapshot_id.startswith("snap-") and snap.size_bytes > 0 and dict(snap.labels) == {"step": "1"}
    assert (await stub.GetSnapshot(pb.GetSnapshotRequest(snapshot_id=snap.snapshot_id))).snapshot == snap

    latencies, forks = [], []
    for _ in range(3):
        began = time.perf_counter()
        forks.append(await fork(stub, snap.snapshot_id))
        latencies.append(time.perf_counter() - began)
    plain = time.perf_counter()
    await create(stub, image=image)
    plain_s = time.perf_counter() - plain
    print(
        f"\n[{image}] fork latency (CreateSandbox from_snapshot): "
        f"{', '.join(f'{s * 1000:.0f}' for s in latencies)} ms; plain create {plain_s * 1000:.0f} ms; "
        f"snapshot size {snap.size_bytes} bytes"
    )
    assert statistics.median(latencies) < 5

    for i, sb in enumerate(forks):
        assert (sb.state, sb.image, sb.from_snapshot) == (pb.SANDBOX_STATE_READY, image, snap.snapshot_id)
        assert await sh(stub, sb.sandbox_id, CHECK) == CHECKED
        await sh(stub, sb.sandbox_id, f"echo {i} > mine-{i} && echo changed-{i} > proj/a.txt && rm proj/deep/er/f")
    for i, sb in enumerate(forks):
        assert (
            await sh(stub, sb.sandbox_id, "ls mine-*; cat proj/a.txt; ls proj/deep/er | wc -l")
            == f"mine-{i}\nchanged-{i}\n0\n"
        )
    # The original keeps running; neither the forks' writes nor its later ones reach the others or the snapshot.
    assert await sh(stub, source.sandbox_id, "ls mine-* 2>/dev/null; echo later > later; cat proj/a.txt") == "base\n"
    for sb in forks:
        assert await sh(stub, sb.sandbox_id, "test -e later && echo seen || echo unseen") == "unseen\n"
    late = await fork(stub, snap.snapshot_id)
    assert await sh(stub, late.sandbox_id, CHECK + "cd .. && ls later mine-* 2>&1 | wc -l") == CHECKED + "2\n"
    assert (await stub.GetSnapshot(pb.GetSnapshotRequest(snapshot_id=snap.snapshot_id))).snapshot == snap


@pytest.mark.parametrize("image", IMAGES)
async def test_a_snapshot_of_a_fork_builds_on_its_parent(start_env: StartEnv, image: str) -> None:
    """Snapshot → fork → change → snapshot → fork → snapshot → fork: each generation sees its ancestors' files
    and changes, deletions included. On a built image the forks stack the layers (nothing copied)."""
    env = await start_env()
    stub = env.stub
    source = await create(stub, image=image)
    await sh(stub, source.sandbox_id, SETUP)
    snaps = [await snapshot(stub, source.sandbox_id)]
    sb = source
    for generation in range(1, 4):
        sb = await fork(stub, snaps[-1].snapshot_id)
        await sh(
            stub,
            sb.sandbox_id,
            f"echo {generation} >> proj/gens && rm -f proj/a.txt && cd repo && "
            f"echo {generation} > README && git -c user.name=t -c user.email=t@example.com "
            f"commit -qam gen{generation}",
        )
        snaps.append(await snapshot(stub, sb.sandbox_id))
    last = await fork(stub, snaps[-1].snapshot_id)
    out = await sh(
        stub,
        last.sandbox_id,
        "cat proj/gens; test -e proj/a.txt || echo a-deleted; cat proj/deep/er/f; "
        "test -e /etc/debian_version || echo whiteout-kept; "
        "cd repo && git status --porcelain | wc -l && git log --format=%s",
    )
    assert out == "1\n2\n3\na-deleted\ndeep\nwhiteout-kept\n0\ngen3\ngen2\ngen1\nfirst\n"
    ids = [s.snapshot_id for s in snaps]
    layers = env.manager.snapshots.get(ids[-1]).layers
    assert layers == ((ids[-1],) if image == "host" else tuple(reversed(ids)))  # host forks copy: one layer


@pytest.mark.parametrize("image", IMAGES[1:])
async def test_chains_stack_up_to_64_layers(start_env: StartEnv, image: str) -> None:
    """Fork-and-snapshot 64 generations deep on a built image: the deepest fork sees every generation's file
    (64 snapshot layers over the image in one mount), and a snapshot of it is FAILED_PRECONDITION saying to
    flatten."""
    env = await start_env()
    stub = env.stub
    sb = await create(stub, image=image)
    for generation in range(64):
        await sh(stub, sb.sandbox_id, f"echo {generation} > gen-{generation}")
        snap = await snapshot(stub, sb.sandbox_id)
        await stub.DeleteSandbox(pb.DeleteSandboxRequest(sandbox_id=sb.sandbox_id))
        sb = await fork(stub, snap.snapshot_id)
    assert len(env.manager.snapshots.get(snap.snapshot_id).layers) == 64
    assert await sh(stub, sb.sandbox_id, "cat gen-* | wc -l; cat gen-0 gen-63") == "64\n0\n63\n"
    err = await rpc_error(stub.SnapshotSandbox(pb.SnapshotSandboxRequest(sandbox_id=sb.sandbox_id)))
    assert err.code() is Code.FAILED_PRECONDITION and "flatten" in (err.details() or ""), err
    assert len(layers_on_disk(env)) == 64


@pytest.mark.parametrize("image", IMAGES)
async def test_deleting_a_snapshot_keeps_its_files_for_its_forks(start_env: StartEnv, image: str) -> None:
    """DeleteSnapshot forgets the snapshot at once (NOT_FOUND after), but its layer stays on disk while a fork
    or a snapshot built on it lives, and goes with the last one; nothing is left after the service stops."""
    env = await start_env()
    stub = env.stub
    source = await create(stub, image=image)
    await sh(stub, source.sandbox_id, "echo one > one")
    s1 = await snapshot(stub, source.sandbox_id, snapshot_id="s1")
    f1 = await fork(stub, "s1")
    await sh(stub, f1.sandbox_id, "echo two > two")
    s2 = await snapshot(stub, f1.sandbox_id, snapshot_id="s2")
    deleted = (await stub.DeleteSnapshot(pb.DeleteSnapshotRequest(snapshot_id="s1"))).snapshot
    assert deleted == s1
    for call in (
        stub.GetSnapshot(pb.GetSnapshotRequest(snapshot_id="s1")),
        stub.DeleteSnapshot(pb.DeleteSnapshotRequest(snapshot_id="s1")),
        stub.CreateSandbox(pb.CreateSandboxRequest(from_snapshot="s1")),
    ):
        assert (await rpc_error(call)).code() is Code.NOT_FOUND
    assert [s.snapshot_id for s in (await stub.ListSnapshots(pb.ListSnapshotsRequest())).snapshots] == ["s2"]
    assert layers_on_disk(env) == ["s1", "s2"]  # f1 (and, on a built image, s2) still stack s1
    err = await rpc_error(
        stub.SnapshotSandbox(pb.SnapshotSandboxRequest(sandbox_id=source.sandbox_id, snapshot_id="s1"))
    )
    assert err.code() is Code.ALREADY_EXISTS  # its id is free again only once its files are gone
    assert await sh(stub, f1.sandbox_id, "cat one two") == "one\ntwo\n"
    await stub.DeleteSandbox(pb.DeleteSandboxRequest(sandbox_id=f1.sandbox_id))
    assert layers_on_disk(env) == (["s2"] if image == "host" else ["s1", "s2"])
    f2 = await fork(stub, "s2")
    assert await sh(stub, f2.sandbox_id, "cat one two") == "one\ntwo\n"
    await stub.DeleteSnapshot(pb.DeleteSnapshotRequest(snapshot_id="s2"))
    assert layers_on_disk(env) == (["s2"] if image == "host" else ["s1", "s2"])  # f2 still stacks them
    assert await sh(stub, f2.sandbox_id, "cat one two") == "one\ntwo\n"
    await stub.DeleteSandbox(pb.DeleteSandboxRequest(sandbox_id=f2.sandbox_id))
    assert layers_on_disk(env) == []
    assert s2.snapshot_id == "s2"
    # A snapshot and a fork left alive at stop are removed with the service; a restart starts with none. A kept
    # snapshot (and the layers it stacks) outlives the restart, and sandboxes fork from it as before.
    await snapshot(stub, source.sandbox_id, snapshot_id="s3")
    await fork(stub, "s3")
    await run(stub, source.sandbox_id, "echo kept > kept")
    kept = (
        await stub.SnapshotSandbox(
            pb.SnapshotSandboxRequest(sandbox_id=source.sandbox_id, snapshot_id="s4", keep=True, labels={"env": "e1"})
        )
    ).snapshot
    assert kept.keep
    await env.server.stop()
    assert layers_on_disk(env) == ["s4"] and list((env.settings.state_dir / "sandboxes").iterdir()) == []
    again = await start_env(state_dir=env.settings.state_dir)
    err = await rpc_error(again.stub.GetSnapshot(pb.GetSnapshotRequest(snapshot_id="s3")))
    assert err.code() is Code.NOT_FOUND and "service stops" in (err.details() or "")
    back = (await again.stub.ListSnapshots(pb.ListSnapshotsRequest(label_selector={"env": "e1"}))).snapshots
    assert [(s.snapshot_id, s.keep) for s in back] == [("s4", True)]
    child = await fork(again.stub, "s4")
    assert await sh(again.stub, child.sandbox_id, "cat one kept") == "one\nkept\n"
    await again.stub.DeleteSandbox(pb.DeleteSandboxRequest(sandbox_id=child.sandbox_id))
    await again.stub.DeleteSnapshot(pb.DeleteSnapshotRequest(snapshot_id="s4"))
    assert layers_on_disk(again) == []


async def test_a_snapshot_waits_for_earlier_commands_only(start_env: StartEnv) -> None:
    """A snapshot is taken in the sandbox's command order: it holds what a command started before it wrote
    (waiting for it to end), and nothing of a command started after it."""
    env = await start_env()
    stub = env.stub
    sb = await create(stub)
    await start(stub, sb.sandbox_id, "sleep 1; echo before > before")
    taking = asyncio.create_task(snapshot(stub, sb.sandbox_id))
    await asyncio.sleep(0.3)  # the snapshot is queued behind the sleeping command by now
    after = await start(stub, sb.sandbox_id, "echo after > after")
    snap = await taking
    assert (await run(stub, sb.sandbox_id, "cat after")).stdout == b"after\n"
    forked = await fork(stub, snap.snapshot_id)
    assert await sh(stub, forked.sandbox_id, "cat before; ls after 2>&1 | grep -c 'No such'") == "before\n1\n"
    assert after.exec_id


async def test_disk_capped_sandboxes_snapshot_and_fork(start_env: StartEnv) -> None:
    """A sandbox whose writable layer is a capped filesystem snapshots like any other, and forks of it may have
    caps of their own."""
    env = await start_env()
    stub = env.stub
    cap = pb.Resources(disk_bytes=64 << 20)
    sb = await create(stub, resources=cap)
    await sh(stub, sb.sandbox_id, "head -c 1000000 /dev/urandom > blob && md5sum blob > sum && rm /etc/debian_version")
    snap = await snapshot(stub, sb.sandbox_id)
    assert snap.size_bytes >= 1_000_000
    for resources in (pb.Resources(), cap):
        forked = await fork(stub, snap.snapshot_id, resources=resources)
        assert (
            await sh(stub, forked.sandbox_id, "md5sum -c --quiet sum && test ! -e /etc/debian_version && echo ok")
            == "ok\n"
        )


async def test_snapshot_errors(start_env: StartEnv, tmp_path: Path) -> None:
    """Bad ids are INVALID_ARGUMENT, unknown ones and other tenants' NOT_FOUND (the same answer), a taken id
    ALREADY_EXISTS, a mismatched image INVALID_ARGUMENT, past max_snapshots RESOURCE_EXHAUSTED; listing pages
    and filters by label; a retried request_id returns the same snapshot."""
    tokens = tmp_path / "tokens"
    tokens.write_text("alice:alice-token-0001\nbob:bob-token-00002\n")
    env = await start_env(auth_tokens_file=tokens, max_snapshots=3)
    stub = env.stub
    alice = (("authorization", "Bearer alice-token-0001"),)
    bob = (("authorization", "Bearer bob-token-00002"),)

    async def code(call: Awaitable[Any], fragment: str = "") -> Code:
        err = await rpc_error(call)
        assert fragment.lower() in (err.details() or "").lower(), err
        return err.code()

    sb = (await stub.CreateSandbox(pb.CreateSandboxRequest(image="host"), metadata=alice, timeout=30)).sandbox
    sid = sb.sandbox_id
    s1 = (
        await stub.SnapshotSandbox(
            pb.SnapshotSandboxRequest(sandbox_id=sid, snapshot_id="a1", labels={"k": "x"}, request_id="r1"),
            metadata=alice,
        )
    ).snapshot
    again = (
        await stub.SnapshotSandbox(pb.SnapshotSandboxRequest(sandbox_id=sid, request_id="r1"), metadata=alice)
    ).snapshot
    assert again == s1 and s1.tenant == "alice"
    s2 = (
        await stub.SnapshotSandbox(pb.SnapshotSandboxRequest(sandbox_id=sid, labels={"k": "y"}), metadata=alice)
    ).snapshot

    for bad in ("", "Bad_Id", "-x", "x" * 64):
        assert (
            await code(stub.GetSnapshot(pb.GetSnapshotRequest(snapshot_id=bad), metadata=alice), "snapshot_id")
            is Code.INVALID_ARGUMENT
        )
    assert (
        await code(
            stub.SnapshotSandbox(pb.SnapshotSandboxRequest(sandbox_id=sid, snapshot_id="UP"), metadata=alice),
            "snapshot_id",
        )
        is Code.INVALID_ARGUMENT
    )
    assert (
        await code(stub.CreateSandbox(pb.CreateSandboxRequest(from_snapshot="no/pe"), metadata=alice), "from_snapshot")
        is Code.INVALID_ARGUMENT
    )
    assert (
        await code(
            stub.CreateSandbox(pb.CreateSandboxRequest(image="python:3.11-slim", from_snapshot="a1"), metadata=alice),
            "image",
        )
        is Code.INVALID_ARGUMENT
    )
    assert (
        await code(
            stub.SnapshotSandbox(pb.SnapshotSandboxRequest(sandbox_id=sid, snapshot_id="a1"), metadata=alice), "a1"
        )
        is Code.ALREADY_EXISTS
    )
    assert (
        await code(stub.SnapshotSandbox(pb.SnapshotSandboxRequest(sandbox_id="sb-nope"), metadata=alice), "sb-nope")
        is Code.NOT_FOUND
    )
    assert (
        await code(stub.ListSnapshots(pb.ListSnapshotsRequest(page_token="zz"), metadata=alice), "page_token")
        is Code.INVALID_ARGUMENT
    )
    for who in (alice, bob):  # unknown, and another tenant's: the same NOT_FOUND
        for snapshot_id in ("nope", "a1") if who is bob else ("nope",):
            assert (
                await code(stub.GetSnapshot(pb.GetSnapshotRequest(snapshot_id=snapshot_id), metadata=who), snapshot_id)
                is Code.NOT_FOUND
            )
            assert (
                await code(
                    stub.DeleteSnapshot(pb.DeleteSnapshotRequest(snapshot_id=snapshot_id), metadata=who), snapshot_id
                )
                is Code.NOT_FOUND
            )
            assert (
                await code(
                    stub.CreateSandbox(pb.CreateSandboxRequest(from_snapshot=snapshot_id), metadata=who), snapshot_id
                )
                is Code.NOT_FOUND
            )
    assert (
        await code(stub.SnapshotSandbox(pb.SnapshotSandboxRequest(sandbox_id=sid), metadata=bob), sid) is Code.NOT_FOUND
    )
    assert not (await stub.ListSnapshots(pb.ListSnapshotsRequest(), metadata=bob)).snapshots

    page1 = await stub.ListSnapshots(pb.ListSnapshotsRequest(page_size=1), metadata=alice)
    page2 = await stub.ListSnapshots(
        pb.ListSnapshotsRequest(page_size=1, page_token=page1.next_page_token), metadata=alice
    )
    assert [s.snapshot_id for s in [*page1.snapshots, *page2.snapshots]] == sorted(["a1", s2.snapshot_id])
    assert not page2.next_page_token
    filtered = await stub.ListSnapshots(pb.ListSnapshotsRequest(label_selector={"k": "y"}), metadata=alice)
    assert [s.snapshot_id for s in filtered.snapshots] == [s2.snapshot_id]

    await stub.SnapshotSandbox(pb.SnapshotSandboxRequest(sandbox_id=sid), metadata=alice)
    assert (
        await code(stub.SnapshotSandbox(pb.SnapshotSandboxRequest(sandbox_id=sid), metadata=alice), "3 snapshots")
        is Code.RESOURCE_EXHAUSTED
    )
    await stub.DeleteSnapshot(pb.DeleteSnapshotRequest(snapshot_id="a1"), metadata=alice)
    await stub.SnapshotSandbox(pb.SnapshotSandboxRequest(sandbox_id=sid), metadata=alice)


async def test_the_sdk_snapshots_and_forks(start_env: StartEnv) -> None:
    """AsyncSandbox.snapshot, create_sandbox(from_snapshot=...), get/list/delete_snapshot; closing the client
    deletes what it made."""
    from orchard.sdk import AsyncSandboxClient

    env = await start_env()
    port = env.server.port
    async with AsyncSandboxClient(f"127.0.0.1:{port}") as client:
        sandbox = await client.create_sandbox("host")
        await sandbox.exec("echo hi > f")
        snap = await sandbox.snapshot(labels={"run": "r"})
        assert (snap.sandbox_id, snap.image, snap.labels) == (sandbox.sandbox_id, "host", {"run": "r"})
        forked = await client.create_sandbox(from_snapshot=snap.snapshot_id)
        assert forked.info.from_snapshot == snap.snapshot_id
        assert (await forked.exec("cat f")).stdout == "hi\n"
        assert await client.get_snapshot(snap.snapshot_id) == snap
        assert [s.snapshot_id for s in await client.list_snapshots({"run": "r"})] == [snap.snapshot_id]
        kept = await sandbox.snapshot()
        assert await client.delete_snapshot(snap.snapshot_id) is True
        assert await client.delete_snapshot(snap.snapshot_id) is False
    assert not env.manager.sandboxes
    with pytest.raises(Exception, match="not found"):
        env.manager.snapshots.get(kept.snapshot_id)
