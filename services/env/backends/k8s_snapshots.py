"""Snapshots of the kubernetes backend, kept on the service's own disk (<state_dir>/snapshots/<id>/; in a
cluster, mount a PersistentVolume there): what a pod's root filesystem became since its pod started, read and
written by the pod's own agent, so it needs no node access, no privileged pod and no API beyond the pod's.

A snapshot holds two files: `paths`, every path of the pod's root filesystem (NUL-separated, sorted bytewise), and
`changed.tar`, a tar of the paths whose inode changed (ctime) since the pod started: new and written files,
changed modes and owners, links, renames. ctime cannot be set back from user space, so nothing changed hides.
A fork restores into a fresh pod of the same image before it is ready: the tar is extracted over the image, and
every path the snapshot's `paths` lacks is removed (what was deleted). Its own later snapshot again holds
everything that differs from the image (the restored files changed after its start), so every snapshot stands
alone: one layer. /proc, /sys, /dev, the agent's /.orchard and other filesystems (-xdev: volumes, the kubelet's
/etc/hosts) are not part of it. The image needs bash, GNU find and tar (Debian's and Ubuntu's have them).
"""

from __future__ import annotations

import asyncio
import secrets
import shutil
from pathlib import Path
from typing import IO

from orchard.errors import FailedPrecondition, NotFound, ResourceExhausted, Unavailable
from orchard.services.env.agent_client import AgentClient

CHUNK = 1 << 20  # as files move: at most 1 MiB per agent frame
TIMEOUT_S = 1800.0
MAX_LISTING = 256 << 20  # the path list is held in memory: ~2 million paths
"""What the pod sends is the sandbox's (hostile) doing, whatever its tools print: both parts are bounded."""
RESTORE_DIR = "/tmp/.orchard-restore"
_FIND = "cd / && find . -xdev \\( -path ./proc -o -path ./sys -o -path ./dev -o -path ./.orchard{extra} \\) -prune -o "
LIST = _FIND.format(extra="") + "-print0"
CHANGED = _FIND.format(extra="") + '-newerct "@$1" -print0 | tar --null --no-recursion --numeric-owner -T - -cf -'
RESTORE = f"""set -e
r=.{RESTORE_DIR}
cd /
tar --numeric-owner -xpf $r/changed.tar
{_FIND.format(extra=" -o -path $r")}-print0 | LC_ALL=C sort -z > $r/now
LC_ALL=C comm -z -23 $r/now $r/paths | xargs -0 -r rm -rf --
rm -rf $r
"""
NEEDS = "kubernetes snapshots need bash, GNU find, tar, sort and comm in the sandbox image (Debian's have them)"


async def pod_clock(client: AgentClient) -> str:
    """When the pod's files start to count as changed, by the pod's own clock (`find -newerct @T`): read before
    anything changes them, less a second, since the kernel stamps inodes with a coarser clock than `date` reads.
    "" where the image has no `date` (its sandboxes cannot be snapshotted, and say so)."""
    try:
        code, out, _ = await _run(client, ["date", "+%s"])
    except FailedPrecondition:  # no such program
        return ""
    return str(int(out) - 1) if code == 0 and out.strip().isdigit() else ""


async def take(client: AgentClient, since: str, dest: Path, max_bytes: int) -> int:
    """Save the pod's paths and the tar of what changed since `since` (at most max_bytes) into dest (made here);
    bytes of the tar."""
    await asyncio.to_thread(dest.mkdir, parents=True)
    try:
        code, listing, err = await _run(client, ["bash", "-c", LIST], limit=MAX_LISTING)
        if code != 0:
            raise FailedPrecondition(f"{NEEDS}: listing the files exited {code}: {_text(err)}")
        paths = b"\0".join(sorted(p for p in listing.split(b"\0") if p)) + b"\0"
        await asyncio.to_thread((dest / "paths").write_bytes, paths)
        with await asyncio.to_thread(open, dest / "changed.tar", "wb") as out:
            code, _, err = await _run(client, ["bash", "-c", CHANGED, "bash", since], into=out, limit=max_bytes)
        if code not in (0, 1):  # tar's 1: a file changed while it was read (a background process wrote it)
            raise FailedPrecondition(f"{NEEDS}: the tar of the changed files exited {code}: {_text(err)}")
        return (dest / "changed.tar").stat().st_size
    except BaseException:
        await asyncio.to_thread(shutil.rmtree, dest, ignore_errors=True)
        raise


async def restore(client: AgentClient, src: Path) -> None:
    """Make a fresh pod's files those of the snapshot in src (before the sandbox is handed to anyone)."""
    for name in ("paths", "changed.tar"):
        await _upload(client, src / name, f"{RESTORE_DIR}/{name}")
    code, _, err = await _run(client, ["bash", "-c", RESTORE], limit=1 << 20)
    if code != 0:
        raise FailedPrecondition(f"cannot restore snapshot {src.name} into the pod ({NEEDS}): {_text(err)}")


async def _upload(client: AgentClient, path: Path, target: str) -> None:
    size = path.stat().st_size
    upload = secrets.token_hex(8)
    with await asyncio.to_thread(open, path, "rb") as f:
        offset = 0
        while True:
            chunk = await asyncio.to_thread(f.read, CHUNK)
            last = offset + len(chunk) >= size
            await client.call("write", chunk, path=target, upload=upload, offset=offset, mode=0o600, last=last)
            offset += len(chunk)
            if last:
                return


async def _run(
    client: AgentClient, argv: list[str], *, into: IO[bytes] | None = None, limit: int = 4096
) -> tuple[int, bytes, bytes]:
    """argv's exit code, stdout (unless written into `into`) and the end of its stderr. Past limit bytes of stdout it
    is killed: ResourceExhausted."""
    out, err, sent = bytearray(), bytearray(), 0
    ids: list[int] = []  # the agent-side id, to cancel it
    async for event in client.exec(
        argv, cwd="/", env={}, stdin=b"", timeout=TIMEOUT_S, max_output=limit + 1, on_id=ids.append
    ):
        if event.kind == "out" and event.fd == 1:
            sent += len(event.data)
            if sent > limit:
                await client.cancel(ids[0], "too large")
            elif into is None:
                out += event.data
            else:
                await asyncio.to_thread(into.write, event.data)
        elif event.kind == "out":
            err = (err + event.data)[-4096:]
        elif event.kind == "exit":
            if sent > limit:
                raise ResourceExhausted(
                    f"the sandbox's snapshot is larger than {limit} bytes (ORCHARD_ENV_K8S_SNAPSHOT_MAX_BYTES bounds "
                    "the tar of what it changed): remove what it need not keep, or raise the limit"
                )
            if event.error:
                raise FailedPrecondition(f"{NEEDS}: {event.error}")
            if event.reason:
                raise Unavailable(f"the snapshot's command was stopped: {event.reason}")
            return event.exit_code or 0, bytes(out), bytes(err)
    raise Unavailable("the pod's agent ended a snapshot command without its exit")


def _text(err: bytes) -> str:
    return err.decode(errors="replace").strip()[-1000:] or "no output"


def stored(root: Path) -> set[str]:
    """The ids of the snapshots under root."""
    return {p.name for p in root.iterdir() if p.is_dir()} if root.is_dir() else set()


def files_of(root: Path, snapshot_id: str) -> Path:
    path = root / snapshot_id
    if not (path / "changed.tar").is_file():
        raise NotFound(f"the files of snapshot {snapshot_id!r} are not in {root} (its volume was replaced?)")
    return path
