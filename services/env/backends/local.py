"""The `local` backend: each sandbox is bubblewrap namespaces (pid, mount, net, ipc, uts) over an
overlayfs writable layer on its image, with one long-lived agent process inside that runs its commands."""

from __future__ import annotations

import asyncio
import ctypes
import fcntl
import logging
import os
import shutil
from pathlib import Path

from orchard.errors import FailedPrecondition, Unavailable
from orchard.services.env.agent_client import AgentClient
from orchard.services.env.backends.base import SandboxSpec
from orchard.services.env.images import ImageStore
from orchard.services.env.settings import EnvSettings

log = logging.getLogger(__name__)

AGENT_SOURCE = (Path(__file__).resolve().parent.parent / "agent" / "agent.py").read_text()
SANDBOX_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
MNT_DETACH = 2

_libc = ctypes.CDLL(None, use_errno=True)


def _mount_overlay(lower: Path, upper: Path, work: Path, target: Path) -> None:
    opts = f"lowerdir={lower},upperdir={upper},workdir={work}".encode()
    if _libc.mount(b"overlay", str(target).encode(), b"overlay", 0, opts) != 0:
        err = ctypes.get_errno()
        raise FailedPrecondition(f"cannot mount the sandbox's writable layer on {target}: {os.strerror(err)} "
                                 "(the local backend needs root and overlayfs)")


def _unmount(target: Path) -> None:
    if os.path.ismount(target):
        _libc.umount2(str(target).encode(), MNT_DETACH)


class LocalBackend:
    """Sandboxes as bubblewrap processes on this host."""

    name = "local"

    def __init__(self, settings: EnvSettings) -> None:
        self._settings = settings
        self._images = ImageStore(settings.images_dir)
        self._root = settings.state_dir / "sandboxes"
        self._procs: dict[str, asyncio.subprocess.Process] = {}
        self._clients: dict[str, AgentClient] = {}
        self._lock_fd: int | None = None
        if shutil.which(settings.bwrap_path) is None:
            raise FailedPrecondition(f"bubblewrap ({settings.bwrap_path!r}) is not installed; run scripts/install.sh "
                                     "or `apt-get install bubblewrap`")

    async def start(self) -> None:
        """Take the state dir for this service, then remove what a previous, crashed run left behind
        (its processes died with it)."""
        self._root.mkdir(parents=True, exist_ok=True)
        self._lock_fd = os.open(self._settings.state_dir / "service.lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._lock_fd)
            raise FailedPrecondition(f"another env service is using the state dir {self._settings.state_dir}; "
                                     "stop it or give this one its own --state-dir") from None
        leftovers = [p for p in self._root.iterdir() if p.is_dir()]
        for path in leftovers:
            await asyncio.to_thread(self._remove_dir, path)
        if leftovers:
            log.info("removed %d sandboxes left by a previous run", len(leftovers))

    def _remove_dir(self, path: Path) -> None:
        _unmount(path / "rootfs")
        shutil.rmtree(path, ignore_errors=True)

    def _bwrap_argv(self, spec: SandboxSpec, rootfs: Path, host_image: bool) -> list[str]:
        argv = [self._settings.bwrap_path, "--bind", str(rootfs), "/", "--dev", "/dev", "--proc", "/proc"]
        if host_image:
            # The host's root is the lower layer: hide the host's /tmp and every sandbox's state from it.
            argv += ["--tmpfs", "/tmp", "--tmpfs", str(self._settings.state_dir)]
        argv += [
            "--unshare-all", "--die-with-parent", "--new-session",
            "--cap-drop", "ALL",  # as root bwrap would keep every capability (remount, nft ...)
            "--hostname", spec.sandbox_id[:63],
            "--clearenv", "--setenv", "PATH", SANDBOX_PATH, "--setenv", "HOME", "/root",
            "--setenv", "LANG", "C.UTF-8", "--setenv", "ORCHARD_SANDBOX_ID", spec.sandbox_id,
            # Patches can keep a file's size and mtime second; stale .pyc files would then hide the change.
            "--setenv", "PYTHONDONTWRITEBYTECODE", "1",
        ]
        for key, value in spec.env.items():
            argv += ["--setenv", key, value]
        argv += ["--chdir", spec.workdir, "/usr/bin/python3", "-I", "-S", "-c", AGENT_SOURCE]
        return argv

    async def create(self, spec: SandboxSpec) -> AgentClient:
        if spec.egress:
            raise FailedPrecondition("the local backend has no egress allowlists yet: every sandbox has no network; "
                                     "create the sandbox without network_policy rules")
        if any((spec.resources.cpu_millis, spec.resources.memory_bytes, spec.resources.pids,
                spec.resources.disk_bytes)):
            raise FailedPrecondition("the local backend does not enforce resource limits yet; "
                                     "create the sandbox without resources")
        image = self._images.resolve(spec.image)
        home = self._root / spec.sandbox_id
        rootfs = home / "rootfs"
        for sub in ("upper", "work", "rootfs"):
            (home / sub).mkdir(parents=True, exist_ok=True)
        try:
            _mount_overlay(image.rootfs, home / "upper", home / "work", rootfs)
            (rootfs / spec.workdir.lstrip("/")).mkdir(parents=True, exist_ok=True)
            with open(home / "agent.log", "wb") as agent_log:
                proc = await asyncio.create_subprocess_exec(
                    *self._bwrap_argv(spec, rootfs, image.is_host),
                    stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=agent_log,
                )
            self._procs[spec.sandbox_id] = proc
            assert proc.stdout is not None and proc.stdin is not None
            client = AgentClient(proc.stdout, proc.stdin, label=spec.sandbox_id)
            try:
                await client.start(self._settings.agent_start_timeout_s)
            except Unavailable as err:
                detail = (home / "agent.log").read_text(errors="replace")[-2000:].strip()
                raise Unavailable(f"{err.message}: {detail or 'no output'}") from None
        except BaseException:
            await self.destroy(spec.sandbox_id)
            raise
        self._clients[spec.sandbox_id] = client
        return client

    async def destroy(self, sandbox_id: str) -> None:
        client = self._clients.pop(sandbox_id, None)
        if client is not None:
            await client.close("the sandbox was deleted")
        proc = self._procs.pop(sandbox_id, None)
        if proc is not None and proc.returncode is None:
            proc.kill()  # bwrap's init dies with it (--die-with-parent) and takes the pid namespace along
            await proc.wait()
        await asyncio.to_thread(self._remove_dir, self._root / sandbox_id)

    async def close(self) -> None:
        await asyncio.gather(*(self.destroy(sid) for sid in list(self._procs)))
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # releases the flock
            self._lock_fd = None
