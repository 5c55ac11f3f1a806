"""The `local` backend: each sandbox is bubblewrap namespaces (pid, mount, net, ipc, uts) over an
overlayfs writable layer on its image, with one long-lived agent process inside that runs its commands: the native
agent (agent-rs/), bound in read-only at /.orchard/agent and spoken to over its stdin and stdout.

A snapshot is a copy of a sandbox's writable layer (`cp -a`: whiteouts, opaque directories, owners and xattrs
kept) at <state_dir>/snapshots/<id>/layer. A sandbox made from it stacks that layer, and the layers its source
sandbox stacked, between its own fresh writable layer and its image: no copying. The `host` image is the
exception: overlayfs refuses a lower layer that lies inside another one (here: inside the host's root), so such a
sandbox starts with a copy of the snapshot's layer as its writable layer instead (reflinked where the filesystem
can), and snapshots of it need no other layer.

Run by an ordinary user (rootless.py decides, by the uid), each bwrap starts behind a user and mount namespace of
that user, in which its overlay is mounted (only the sandbox sees it), and an allowlisted sandbox behind pasta
(rootless_network.py); what needs the host's root (limits without writable cgroups, a disk cap, the `host` image)
is refused before anything is made.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import fcntl
import logging
import os
import shutil
import signal
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from orchard.errors import FailedPrecondition, Unavailable
from orchard.services.env.agent_client import AgentClient
from orchard.services.env.backends import rootless as rootless_mode
from orchard.services.env.backends.agent_binary import SANDBOX_AGENT_PATH, agent_binary
from orchard.services.env.backends.base import EgressRule, SandboxSpec, SnapshotFiles
from orchard.services.env.backends.cgroups import Cgroups, check_limits, enter_argv
from orchard.services.env.backends.confinement import default_confinement
from orchard.services.env.backends.disk import check_disk, mount_layer
from orchard.services.env.backends.network import SandboxNetworks
from orchard.services.env.backends.rootless_network import RootlessNetworks, check_host
from orchard.services.env.images import ImageStore
from orchard.services.env.settings import EnvSettings

log = logging.getLogger(__name__)

SANDBOX_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
MNT_DETACH = 2
MAX_LAYERS = 64
"""Most snapshot layers one sandbox stacks (overlayfs allows about 500 lower layers; lookups slow with each)."""
KILL_WAIT_S = 10.0
"""How long a sandbox's bwrap may take to follow its killed init out before it is killed as well."""

_libc = ctypes.CDLL(None, use_errno=True)


async def _copy_tree(source: Path, target: Path, prefix: Sequence[str] = ()) -> None:
    """Copy a writable layer to target (which must not exist) with all overlayfs keeps in it: whiteouts (0/0
    character devices), opaque directories (trusted.overlay.* xattrs), owners, modes, times, hard and symbolic links.
    `cp -a` does all that as root, reflinked (copy-on-write) where the filesystem can; prefix runs it as root of a
    user namespace when the service is rootless."""
    proc = await asyncio.create_subprocess_exec(
        *prefix,
        "cp",
        "-a",
        "--reflink=auto",
        "-T",
        str(source),
        str(target),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        _, err = await proc.communicate()
    except BaseException:  # cancelled: stop copying (os.kill, not proc.kill(): see destroy)
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)
            await proc.wait()
        raise
    if proc.returncode != 0:
        detail = err.decode(errors="replace").strip()[-1000:]
        raise FailedPrecondition(f"cannot copy a sandbox's writable layer: {detail}")


@contextlib.contextmanager
def _seccomp_fd(bpf: bytes) -> Iterator[int]:
    """The filter in a memfd at offset 0 for bwrap's --seccomp to read, closed here once bwrap has started."""
    fd = os.memfd_create("orchard-seccomp", os.MFD_CLOEXEC)
    try:
        os.write(fd, bpf)
        os.lseek(fd, 0, os.SEEK_SET)
        yield fd
    finally:
        os.close(fd)


def _files_size(root: Path) -> int:
    total = 0
    for folder, _, files in os.walk(root):
        total += sum(os.lstat(os.path.join(folder, name)).st_size for name in files)
    return total


def _unmount(target: Path) -> None:
    if os.path.ismount(target):
        _libc.umount2(str(target).encode(), MNT_DETACH)


def _children(pid: int) -> list[int]:
    """The pids of a process's children ([] when it has none or is gone)."""
    try:
        return [int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except (OSError, ValueError):
        return []


def _running(pid: int) -> bool:
    """Whether a process exists and has not exited (a zombie has)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


async def _kill_sandbox(bwrap: asyncio.subprocess.Process, under_pasta: bool = False) -> None:
    """Kill every process of a sandbox and return once none is left (under_pasta: the process started is pasta, a
    rootless sandbox's network, and bwrap is its child; pasta outlives it and is ended last).

    The sandbox's init (bwrap's child, pid 1 of its pid namespace) is killed first: the kernel ends every
    process of the namespace before init's exit completes, and bwrap exits only after its child has, so when
    bwrap is reaped nothing of the sandbox runs. Killing bwrap first would leave init to die of --die-with-parent
    a moment after DeleteSandbox returned. os.kill, not proc.kill(): that one reaps an already exited bwrap
    itself, behind the child watcher's back."""
    bwraps = _children(bwrap.pid) if under_pasta else [bwrap.pid]
    inits = [init for pid in bwraps for init in _children(pid)]  # none yet while a wrapper has not become bwrap
    for pid in inits:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    if under_pasta:
        deadline = time.monotonic() + KILL_WAIT_S
        while inits and any(map(_running, bwraps)) and time.monotonic() < deadline:
            await asyncio.sleep(0.005)
    elif inits:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(bwrap.wait()), KILL_WAIT_S)
    if bwrap.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(bwrap.pid, signal.SIGKILL)
        await bwrap.wait()


class LocalBackend:
    """Sandboxes as bubblewrap processes on this host."""

    name = "local"

    def __init__(self, settings: EnvSettings) -> None:
        self._settings = settings
        self._images = ImageStore(settings.images_dir)
        self._root = settings.state_dir / "sandboxes"
        self._snapshots = settings.state_dir / "snapshots"
        # Files of deleted sandboxes and snapshots, renamed here at once and removed in the background: a sandbox
        # with a big writable layer (a venv) takes seconds to remove, and DeleteSandbox must not wait for it.
        self._trash = settings.state_dir / "trash"
        self._removals: set[asyncio.Task[None]] = set()
        self._procs: dict[str, asyncio.subprocess.Process] = {}
        self._layers: dict[str, tuple[str, ...]] = {}  # sandbox id -> the snapshot layers it stacks
        self._clients: dict[str, AgentClient] = {}
        self._lock_fd: int | None = None
        self._cgroups = Cgroups(settings.state_dir, settings.cgroup_root)
        self._net = SandboxNetworks(settings.state_dir, settings.egress_firewall)
        self._confinement = default_confinement()  # FailedPrecondition at start without libseccomp
        self._agent = agent_binary(settings)
        self._rootless = rootless_mode.rootless()  # each bwrap then starts in a user namespace (rootless.py)
        self._cgroups_unusable = False  # rootless, and no cgroups this user may write: pids through RLIMIT_NPROC
        # Rootless sandboxes with a network policy.
        self._pasta = RootlessNetworks(settings.state_dir, settings.egress_firewall)
        if shutil.which(settings.bwrap_path) is None:
            raise FailedPrecondition(
                f"bubblewrap ({settings.bwrap_path!r}) is not installed; run scripts/install.sh "
                "or `apt-get install bubblewrap`"
            )

    async def start(self) -> None:
        """Take the state dir for this service, then remove what a previous, crashed run left behind
        (its processes died with it; its snapshots lived in its memory)."""
        self._root.mkdir(parents=True, exist_ok=True)
        self._snapshots.mkdir(exist_ok=True)
        self._trash.mkdir(exist_ok=True)
        if self._rootless:
            await rootless_mode.probe(self._settings.state_dir)
        for left in list(self._trash.iterdir()):  # what a crash left mid-removal
            await asyncio.to_thread(self._remove_dir, left)
        self._lock_fd = os.open(self._settings.state_dir / "service.lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._lock_fd)
            raise FailedPrecondition(
                f"another env service is using the state dir {self._settings.state_dir}; "
                "stop it or give this one its own --state-dir"
            ) from None
        try:
            if removed := await asyncio.to_thread(self._cgroups.start):
                log.info("removed the cgroups of %d sandboxes left by a previous run", removed)
        except (OSError, FailedPrecondition) as err:
            if not self._rootless:
                raise
            log.info("rootless: no cgroups this user may write (%s)", err)
            self._cgroups_unusable = True
        if self._rootless and not self._cgroups_unusable:
            try:
                self._cgroups.require("limits", "")
            except FailedPrecondition as err:
                log.info("rootless: %s", err.message)
                self._cgroups_unusable = True
        if self._cgroups_unusable:
            log.warning(
                "rootless without cgroups: a sandbox's pids limit is its process limit (RLIMIT_NPROC) in its own user "
                "namespace; cpu and memory limits are refused"
            )
        if not self._rootless and (removed := await self._net.remove_leftovers()):  # rootless makes no networks
            log.info("removed %d sandbox networks left by a previous run", removed)
        s = self._settings
        if s.default_cpu_millis or s.default_memory_bytes or s.default_pids:
            try:
                if self._cgroups_unusable and (s.default_cpu_millis or s.default_memory_bytes):
                    raise rootless_mode.refuse_limits()
                if not self._cgroups_unusable:
                    self._cgroups.require(
                        "the service's default cpu, memory or pids limit",
                        "set them to 0 (e.g. ORCHARD_ENV_DEFAULT_PIDS=0) to run sandboxes without limits",
                    )
            except FailedPrecondition:
                if s.model_fields_set & {"default_cpu_millis", "default_memory_bytes", "default_pids"}:
                    raise  # the operator asked for default limits this host cannot give: say so at start-up
                # Only the built-in pids default: run without it rather than refuse to start on this host.
                log.warning("this host gives the service no cgroup controllers: sandboxes get no default pids limit")
                s.default_pids = 0
        leftovers = [p for p in self._root.iterdir() if p.is_dir()]
        for path in leftovers:
            await asyncio.to_thread(self._remove_dir, path)
        if leftovers:
            log.info("removed %d sandboxes left by a previous run", len(leftovers))
        for partial in self._snapshots.glob("*/"):  # a snapshot cut short by a crash has no layer folder yet
            if not (partial / "layer").is_dir():
                await asyncio.to_thread(self._remove_dir, partial)

    def _remove_dir(self, path: Path) -> None:
        if self._rootless:  # nothing of it is mounted here; a sandbox's files may have any modes
            rootless_mode.remove_tree(path)
            return
        _unmount(path / "rootfs")
        _unmount(path / "layer")  # a disk cap's filesystem; its loop device goes with it
        shutil.rmtree(path, ignore_errors=True)

    async def _discard(self, path: Path) -> None:
        """Make `path` (a sandbox's folder or a snapshot's) vanish now and unmount and remove it in the
        background (unmounting an overlay with many written files syncs them: most of a second); a crash
        meanwhile leaves it in the trash folder, which the next start empties."""
        if not path.exists():
            return
        target = self._trash / f"{path.name}-{os.urandom(4).hex()}"
        try:
            path.rename(target)  # its mounts move with it
        except OSError:  # a busy mount point: remove it in place
            target = path
        task = asyncio.create_task(asyncio.to_thread(self._remove_dir, target), name=f"remove-{path.name}")
        self._removals.add(task)
        task.add_done_callback(self._removals.discard)

    def _bwrap_argv(self, spec: SandboxSpec, rootfs: Path, host_image: bool, seccomp_fd: int) -> list[str]:
        argv = [
            self._settings.bwrap_path,
            "--bind",
            str(rootfs),
            "/",
            "--dev",
            "/dev",
            "--proc",
            "/proc",
            *self._confinement.bwrap_args,
        ]
        if host_image:
            # The host's root is the lower layer: hide the host's /tmp and every sandbox's state from it.
            # A disk cap caps /tmp alike (it lives in memory: a tmpfs).
            size = ["--size", str(spec.resources.disk_bytes)] if spec.resources.disk_bytes else []
            argv += [*size, "--tmpfs", "/tmp", "--tmpfs", str(self._settings.state_dir)]
        argv += [
            "--unshare-all",
            "--die-with-parent",
            "--new-session",
            "--cap-drop",
            "ALL",  # as root bwrap would keep every capability (remount, nft ...)
            "--hostname",
            spec.sandbox_id[:63],
            "--clearenv",
            "--setenv",
            "PATH",
            SANDBOX_PATH,
            "--setenv",
            "HOME",
            "/root",
            "--setenv",
            "LANG",
            "C.UTF-8",
            "--setenv",
            "ORCHARD_SANDBOX_ID",
            spec.sandbox_id,
            # Patches can keep a file's size and mtime second; stale .pyc files would then hide the change.
            "--setenv",
            "PYTHONDONTWRITEBYTECODE",
            "1",
        ]
        if spec.egress:
            argv.append("--share-net")  # keep the namespace with the allowlist it is started in (network.py)
        argv += ["--dir", spec.workdir]  # the overlay is mounted only in the sandbox's namespaces
        for key, value in spec.env.items():
            argv += ["--setenv", key, value]
        argv += [
            # The agent: one static file from the host, so the image needs nothing of it (no Python, no libc).
            "--ro-bind",
            str(self._agent),
            SANDBOX_AGENT_PATH,
            "--seccomp",
            str(seccomp_fd),
            "--chdir",
            spec.workdir,
            SANDBOX_AGENT_PATH,
        ]
        return argv

    async def create(self, spec: SandboxSpec) -> AgentClient:
        if spec.isolation == "gvisor":
            raise FailedPrecondition(
                "the local backend isolates sandboxes with bubblewrap (namespaces, seccomp); "
                "gVisor needs the docker backend (an engine with runsc) or the kubernetes "
                "backend (a gvisor RuntimeClass)",
                field="isolation",
            )
        res = spec.resources
        check_limits(res)
        check_disk(res.disk_bytes, self._settings.state_dir)
        image = self._images.resolve(spec.image)
        if self._rootless:
            self._check_rootless(spec, image.name, image.rootfs, image.is_host)
        home = self._root / spec.sandbox_id
        rootfs = home / "rootfs"
        rootfs.mkdir(parents=True, exist_ok=True)
        try:
            if spec.egress and not self._rootless:  # rootless: pasta's namespace, made with the sandbox
                await self._net.create(spec.sandbox_id, spec.egress)
            layer = await mount_layer(home, res.disk_bytes) if res.disk_bytes else home
            (layer / "work").mkdir(exist_ok=True)
            layers = [self._snapshots / snapshot_id / "layer" for snapshot_id in spec.layers]
            if image.is_host and layers:
                assert len(layers) == 1, "a snapshot of a host-image sandbox is one layer"
                await _copy_tree(layers[0], layer / "upper")
                layers = []
            else:
                (layer / "upper").mkdir(exist_ok=True)
            self._layers[spec.sandbox_id] = spec.layers if layers else ()
            with open(home / "agent.log", "wb") as agent_log, _seccomp_fd(self._confinement.seccomp_bpf) as fd:
                argv = self._bwrap_argv(spec, rootfs, image.is_host, fd)
                if self._rootless:
                    options = rootless_mode.overlay_options(
                        self._snapshots, spec.layers, image.rootfs, layer / "upper", layer / "work"
                    )
                    nproc = res.pids if self._cgroups_unusable else 0
                    argv = rootless_mode.enter_argv(
                        self._snapshots, options, rootfs, argv, userns=not spec.egress, nproc=nproc
                    )
                    if spec.egress:  # pasta's user namespace holds the rest
                        argv = await self._pasta.enter_argv(spec.sandbox_id, spec.egress, argv)
                else:
                    # Mounted in a mount namespace of the sandbox's own, not the host's: every bwrap copies the mount
                    # table it starts from, so 1,000 overlays on the host made each start ~4x slower (and serialized).
                    options = rootless_mode.overlay_options(
                        self._snapshots,
                        spec.layers if layers else (),
                        image.rootfs,
                        layer / "upper",
                        layer / "work",
                        userxattr=False,
                    )
                    argv = rootless_mode.enter_argv(self._snapshots, options, rootfs, argv, userns=False)
                if (res.cpu_millis or res.memory_bytes or res.pids) and not self._cgroups_unusable:
                    argv = enter_argv(await asyncio.to_thread(self._cgroups.create, spec.sandbox_id, res), argv)
                argv = [*self._net.enter_argv(spec.sandbox_id), *argv]
                proc = await asyncio.create_subprocess_exec(
                    *argv,
                    pass_fds=(fd,),
                    stdin=asyncio.subprocess.PIPE,
                    stdout=asyncio.subprocess.PIPE,
                    stderr=agent_log,
                )
            self._procs[spec.sandbox_id] = proc
            assert proc.stdout is not None and proc.stdin is not None
            client = AgentClient(proc.stdout, proc.stdin, label=spec.sandbox_id)
            try:
                await client.start(self._settings.agent_start_timeout_s)
            except Unavailable as err:
                detail = (home / "agent.log").read_text(errors="replace")[-2000:].strip()
                raise Unavailable(f"{err.message}: {detail or 'no output'}") from None
            if spec.sandbox_id in self._pasta:
                self._pasta.started(spec.sandbox_id, _children(proc.pid)[0])
        except BaseException:
            await self.destroy(spec.sandbox_id)
            raise
        self._clients[spec.sandbox_id] = client
        return client

    async def destroy(self, sandbox_id: str) -> None:
        self._layers.pop(sandbox_id, None)
        client = self._clients.pop(sandbox_id, None)
        if client is not None:
            await client.close("the sandbox was deleted")
        proc = self._procs.pop(sandbox_id, None)
        if proc is not None and proc.returncode is None:
            await _kill_sandbox(proc, under_pasta=sandbox_id in self._pasta)
        self._pasta.forget(sandbox_id)
        await asyncio.to_thread(self._cgroups.remove, sandbox_id)
        await self._net.destroy(sandbox_id)
        await self._discard(self._root / sandbox_id)

    def _check_rootless(self, spec: SandboxSpec, image: str, image_rootfs: Path, is_host: bool) -> None:
        """Refuse, before anything is made, what a rootless service cannot give this sandbox."""
        rootless_mode.check_image(image, image_rootfs, is_host)
        res = spec.resources
        if res.disk_bytes:
            raise rootless_mode.refuse_disk()
        if spec.egress:
            check_host()
        if (res.cpu_millis or res.memory_bytes) and self._cgroups_unusable:
            raise rootless_mode.refuse_limits()

    async def set_egress(self, sandbox_id: str, rules: tuple[EgressRule, ...]) -> None:
        if sandbox_id in self._pasta:
            await self._pasta.apply(sandbox_id, rules)
        else:  # refuses to open a sandbox made without a network policy
            await self._net.apply(sandbox_id, rules)

    async def snapshot(self, sandbox_id: str, snapshot_id: str) -> SnapshotFiles:
        layers = self._layers.get(sandbox_id)
        if layers is None:
            raise FailedPrecondition(f"sandbox {sandbox_id!r} is not running")
        if len(layers) >= MAX_LAYERS:
            raise FailedPrecondition(
                f"sandbox {sandbox_id!r} already stacks {len(layers)} snapshot layers, the most a sandbox may; flatten "
                "the chain: copy the files you need (e.g. a tar of the workspace) into a sandbox made from the image "
                "and snapshot that one"
            )
        home = self._root / sandbox_id
        upper = home / "layer" / "upper" if os.path.ismount(home / "layer") else home / "upper"  # under a disk cap
        target = self._snapshots / snapshot_id
        target.mkdir()
        try:
            await _copy_tree(upper, target / "layer", rootless_mode.as_owner([]) if self._rootless else ())
            size = await asyncio.to_thread(_files_size, target / "layer")
        except BaseException:
            await asyncio.to_thread(self._remove_dir, target)
            raise
        return SnapshotFiles(layers=(snapshot_id, *layers), size_bytes=size)

    async def delete_snapshot(self, snapshot_id: str) -> None:
        await self._discard(self._snapshots / snapshot_id)

    async def stored_snapshots(self) -> set[str]:
        return {p.name for p in self._snapshots.iterdir() if p.is_dir()} if self._snapshots.is_dir() else set()

    async def oom_kills(self, sandbox_id: str) -> int:
        # A read of a small kernel counter, on the loop: a thread hop would cost more than the read.
        return self._cgroups.oom_kills(sandbox_id)

    async def close(self) -> None:
        await asyncio.gather(*(self.destroy(sid) for sid in list(self._procs)))
        await asyncio.gather(*self._removals)  # files of deleted sandboxes still being removed
        if not self._cgroups_unusable:
            await asyncio.to_thread(self._cgroups.close)
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # releases the flock
            self._lock_fd = None
