"""The size-capped writable layer of a local sandbox: a sparse ext4 image on a loop device, mounted under the
sandbox's folder, that holds its overlay's upper and work dirs. A writer past the cap gets ENOSPC."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

from orchard.errors import FailedPrecondition, InvalidArgument

MIN_DISK_BYTES = 1 << 20
# No journal (the layer does not outlive a crash), no reserved blocks (the sandbox drops CAP_SYS_RESOURCE),
# nothing discarded or zeroed: a fresh sparse file already reads as zeros, and zeroing would write the whole image.
MKFS_ARGS = ("-q", "-F", "-m", "0", "-O", "^has_journal", "-E", "nodiscard,lazy_itable_init=1")
MOUNT_OPTIONS = "loop,noatime,noinit_itable"


def check_disk(disk_bytes: int, state_dir: Path) -> None:
    """Refuse a cap below the minimum or beyond the free space of the state dir's filesystem."""
    free = shutil.disk_usage(state_dir).free
    if disk_bytes and not MIN_DISK_BYTES <= disk_bytes <= free:
        raise InvalidArgument(
            f"resources.disk_bytes {disk_bytes} must be between {MIN_DISK_BYTES >> 20} MiB and the "
            f"free space where sandboxes live ({free / (1 << 30):.1f} GiB in {state_dir})",
            field="resources.disk_bytes",
        )


async def mount_layer(home: Path, disk_bytes: int) -> Path:
    """Make and mount a `disk_bytes` filesystem at home/layer and return that path."""
    image, target = home / "layer.img", home / "layer"
    target.mkdir(exist_ok=True)
    with open(image, "wb") as f:
        f.truncate(disk_bytes)  # sparse: takes disk space only as the sandbox writes
    await _run("mkfs.ext4", *MKFS_ARGS, str(image))
    await _run("mount", "-o", MOUNT_OPTIONS, str(image), str(target))  # the loop device goes with the unmount
    return target


async def _run(*argv: str) -> None:
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
        )
    except FileNotFoundError:
        raise FailedPrecondition(
            f"a disk cap needs {argv[0]} on the env service's host (apt-get install e2fsprogs "
            "mount); create the sandbox without resources.disk_bytes"
        ) from None
    output, _ = await proc.communicate()
    if proc.returncode != 0:
        raise FailedPrecondition(
            f"cannot make the sandbox's capped writable layer: {argv[0]} failed: "
            f"{output.decode(errors='replace').strip()}"
        )
