"""Rootless mode of the `local` backend: the env service runs as an ordinary user where the kernel lets one make
user namespaces. Each sandbox's bwrap then starts behind `unshare --user --map-root-user --mount`: the service's
user is root inside that namespace (and so inside the sandbox), and mounts the sandbox's overlayfs writable layer
there (kernel >= 5.11), where only the sandbox sees it.

What needs the host's root is refused with FAILED_PRECONDITION naming what is missing: cpu and memory limits
(unless the host delegates cgroups the service can write; a pids limit is then RLIMIT_NPROC), the disk cap (a loop
device) and the `host` image. Egress allowlists
go through pasta instead of a veth (rootless_network.py). The mode is decided once, here: the service is rootless when its effective uid
is not 0.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

from orchard.errors import FailedPrecondition

PROBE_TIMEOUT_S = 10.0
MIN_KERNEL = (5, 14)
"""Overlayfs in a user namespace came in 5.11; RLIMIT_NPROC counted per user namespace (a sandbox's pids limit
without cgroups) in 5.14."""
# Run by /bin/sh inside the new user and mount namespaces: mount the overlay ($2 on $3, relative lower layers
# resolved from $1), then exec bwrap. Exit 125 says the mount failed (its message goes to the agent's log).
ENTER_SCRIPT = 'cd "$1" && mount -t overlay overlay -o "$2" "$3" || exit 125; shift 3; cd /; exec "$@"'
USERNS = ("unshare", "--user", "--map-root-user", "--mount")
HOW_TO_ROOT = "run the env service as root for it"


def rootless() -> bool:
    """Whether this process runs the local backend rootless (not as uid 0): the one place the mode is decided."""
    return os.geteuid() != 0


def overlay_options(
    layers_dir: Path, layers: Sequence[str], image: Path, upper: Path, work: Path, *, userxattr: bool = True
) -> str:
    """The overlay's mount options: snapshot layers named relative to layers_dir (mount options must fit in a page,
    and 64 absolute layer paths under a long state dir would not); rootless, user.* xattrs (trusted.* needs the
    host's root)."""
    lower = ":".join([*(f"{layer}/layer" for layer in layers), str(image)])
    return f"lowerdir={lower},upperdir={upper},workdir={work}" + (",userxattr" if userxattr else "")


def enter_argv(
    layers_dir: Path, options: str, rootfs: Path, argv: list[str], *, userns: bool = True, nproc: int = 0
) -> list[str]:
    """argv (bwrap's) behind the user and mount namespaces in which the sandbox's overlay is mounted on rootfs;
    userns=False: a mount namespace only, for a caller already root of a user namespace (pasta's).

    nproc > 0 caps the sandbox's processes and threads with RLIMIT_NPROC, the pids limit where no cgroup can: the
    kernel (5.14 and later) counts it per user namespace, so each sandbox has its own count, and its processes,
    without capabilities in the host's namespace, cannot raise it. The limit is set inside the new namespace
    (unshare and prlimit exec, so the first fork happens there): a fork is checked against the task's limit in its
    own namespace and, one level up, against the limit its namespace was *created* with, so a namespace made under
    the lowered limit would cap all of this user's processes on the host at it (a limited sandbox could not start
    while the service's user had more elsewhere)."""
    namespaces = USERNS if userns else ("unshare", "--mount")
    limit = ("prlimit", f"--nproc={nproc}:{nproc}", "--") if nproc else ()
    return [*namespaces, *limit, "/bin/sh", "-c", ENTER_SCRIPT, "sh", str(layers_dir), options, str(rootfs), *argv]


def as_owner(argv: list[str]) -> list[str]:
    """argv run as root of a user namespace of the service's user: it may then read, copy and remove every file of
    a writable layer, whatever modes a sandbox gave them (as the host's root may)."""
    return ["unshare", "--user", "--map-root-user", *argv]


async def probe(state_dir: Path) -> None:
    """Mount an overlay in a user namespace under state_dir once; FailedPrecondition saying what to change if this
    host does not allow it."""
    if shutil.which("unshare") is None or shutil.which("prlimit") is None:
        raise FailedPrecondition("a rootless local backend needs unshare and prlimit (apt-get install util-linux)")
    release = os.uname().release
    if tuple(int(part) for part in re.findall(r"\d+", release)[:2]) < MIN_KERNEL:
        raise FailedPrecondition(
            f"a rootless local backend needs Linux {'.'.join(map(str, MIN_KERNEL))} or later (overlayfs in a user "
            f"namespace, process limits counted per namespace), and this host runs {release}; or {HOW_TO_ROOT}"
        )
    with tempfile.TemporaryDirectory(prefix="probe-", dir=state_dir) as tmp:
        for name in ("lower", "upper", "work", "merged"):
            os.mkdir(os.path.join(tmp, name))
        try:  # overlayfs in a user namespace keeps opaque folders in user.overlay.* xattrs of the writable layer
            os.setxattr(os.path.join(tmp, "upper"), "user.orchard.probe", b"1")
        except OSError as no_xattrs:
            raise FailedPrecondition(
                f"the state dir {state_dir} is on a filesystem without user extended attributes ({no_xattrs.strerror}; "
                "tmpfs has them from Linux 6.6), which a rootless sandbox's writable layer needs (overlayfs in a user "
                "namespace keeps its opaque folders in them): give the service a --state-dir on ext4, xfs or btrfs; "
                f"or {HOW_TO_ROOT}"
            ) from None
        options = overlay_options(Path(tmp), [], Path(tmp) / "lower", Path(tmp) / "upper", Path(tmp) / "work")
        proc = await asyncio.create_subprocess_exec(
            *enter_argv(Path(tmp), options, Path(tmp) / "merged", ["true"]),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )
        async with asyncio.timeout(PROBE_TIMEOUT_S):
            _, err = await proc.communicate()
        # The probe's work dir holds a folder only the namespace's root may remove.
        await asyncio.to_thread(remove_tree, Path(tmp) / "work")
    if proc.returncode != 0:
        detail = err.decode(errors="replace").strip()[-500:]
        raise FailedPrecondition(
            f"the env service runs as uid {os.geteuid()}, not root, and this host does not let it make a sandbox "
            f"({detail}): a rootless local backend needs unprivileged user namespaces (sysctl "
            "kernel.unprivileged_userns_clone=1 and user.max_user_namespaces > 0; on Ubuntu 24.04 also "
            f"kernel.apparmor_restrict_unprivileged_userns=0) and overlayfs in a user namespace; or {HOW_TO_ROOT}"
        )


def remove_tree(path: Path) -> None:
    """Remove a folder of the service's user whatever modes are inside it (the overlay's work dir has a 000 one)."""
    if path.exists():
        subprocess.run(as_owner(["rm", "-rf", "--", str(path)]), check=False, stdin=subprocess.DEVNULL)


def check_image(name: str, rootfs: Path, is_host: bool) -> None:
    """Refuse an image a rootless sandbox cannot run on: the host's root (mounts under it, which overlayfs in a
    user namespace cannot stack on) or one whose files another user owns (read-only inside, and owned by nobody)."""
    if is_host:
        raise FailedPrecondition(
            "the `host` image needs an env service running as root: its root filesystem has mounts under it, which "
            "overlayfs in a user namespace cannot stack on; use an image this service's user owns: `orchard image "
            "import NAME ARCHIVE` as that user (a `docker save` or OCI archive), or a copy of a built one (docs/env.md)",
            field="image",
        )
    owner = rootfs.stat().st_uid
    if owner != os.geteuid():
        raise FailedPrecondition(
            f"image {name!r} at {rootfs} belongs to uid {owner}, and this env service runs rootless as uid "
            f"{os.geteuid()}: a sandbox could not write its own files (they would be nobody's); give the service "
            f"images it owns (`orchard image import` as this user, or `cp -a` a built image's folder into its images "
            f"dir, then `chown -R {os.geteuid()}`), or {HOW_TO_ROOT}",
            field="image",
        )


def refuse_limits() -> FailedPrecondition:
    """The error for cpu or memory limits on a host that gives a rootless service no cgroups to write."""
    return FailedPrecondition(
        f"cpu and memory limits need cgroups this env service (uid {os.geteuid()}, not root) may write: a "
        "delegated cgroup v2 subtree (e.g. start it with `systemd-run --user --scope -p Delegate=yes`), which this "
        f"host does not give; create the sandbox without them, or {HOW_TO_ROOT}",
        field="resources",
    )


def refuse_disk() -> FailedPrecondition:
    """The error for a disk cap (a loop device and an ext4 mount on the host) in rootless mode."""
    return FailedPrecondition(
        f"resources.disk_bytes needs root on the env service's host (a loop device and an ext4 mount), and this "
        f"service runs as uid {os.geteuid()}; create the sandbox without it, or {HOW_TO_ROOT}",
        field="resources.disk_bytes",
    )
