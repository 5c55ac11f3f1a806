"""Per-sandbox cgroups for the local backend: memory, CPU and process limits, OOM-kill counts and removal, on a
cgroup v2 (unified) hierarchy in a delegated subtree, or on the cgroup v1 controllers of a legacy or hybrid host.
Each sandbox's groups sit in a parent named for the service's state dir."""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from orchard.errors import FailedPrecondition, InvalidArgument
from orchard.services.env.backends.base import Resources

log = logging.getLogger(__name__)

CGROUP_FS = Path("/sys/fs/cgroup")
CONTROLLERS = ("memory", "cpu", "pids")
CFS_PERIOD_US = 100_000
MIN_CPU_MILLIS = 10  # the kernel's smallest CFS quota is 1 ms per period
MIN_MEMORY_BYTES = 32 << 20  # bwrap, its init and the agent take about 13 MiB before any command runs
MIN_PIDS = 16  # bwrap, its init, the agent and the agent's worker threads
REMOVE_TIMEOUT_S = 5.0
# cgroup v2: a group with processes cannot hand controllers to its children, so the processes of the service's own
# (delegated) group move into this leaf beside the parents; a service started from there finds its subtree above.
SERVICE_LEAF = "orchard-env-service"
DELEGATE_REMEDY = (
    "run the service under systemd with Delegate=yes or `systemd-run --scope -p Delegate=yes`, "
    "or give it a delegated subtree (ORCHARD_ENV_CGROUP_ROOT)"
)
# Run by /bin/sh before bwrap: it moves itself into each group given before "--", then execs the rest, so bwrap
# and everything it forks start inside the groups (safer than a preexec_fn in a threaded server). On v1 it writes
# "0" (this thread) to `tasks`, not its pid to `cgroup.procs`: moving only the current thread skips the kernel's
# global threadgroup lock, whose RCU grace period cost about 10 ms per create here; sh has one thread, so that moves
# it all. v2 moves processes only, through `cgroup.procs` (its `cgroup.threads` stays within one domain).
ENTER_SCRIPT = 'while [ "$1" != -- ]; do echo 0 > "$1" || exit 125; shift; done; shift; exec "$@"'

Hierarchy = Literal["v1", "v2"]


def check_limits(resources: Resources) -> None:
    """Refuse CPU, memory and process limits this machine cannot give, or too small to start a sandbox."""
    cpus = len(os.sched_getaffinity(0))
    memory = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
    r = resources
    if r.cpu_millis and not MIN_CPU_MILLIS <= r.cpu_millis <= 1000 * cpus:
        raise InvalidArgument(
            f"resources.cpu_millis {r.cpu_millis} must be between {MIN_CPU_MILLIS} and "
            f"{1000 * cpus} (this machine has {cpus} CPUs)",
            field="resources.cpu_millis",
        )
    if r.memory_bytes and not MIN_MEMORY_BYTES <= r.memory_bytes <= memory:
        raise InvalidArgument(
            f"resources.memory_bytes {r.memory_bytes} must be between {MIN_MEMORY_BYTES >> 20} MiB "
            f"and this machine's memory ({memory / (1 << 30):.1f} GiB)",
            field="resources.memory_bytes",
        )
    if r.pids and not MIN_PIDS <= r.pids <= pid_max:
        raise InvalidArgument(
            f"resources.pids {r.pids} must be between {MIN_PIDS} and this machine's pid_max ({pid_max})",
            field="resources.pids",
        )


def parent_name(state_dir: Path) -> str:
    """The name of a service's parent group: one per state dir, which one service at a time holds."""
    return "orchard-env-" + hashlib.sha256(str(state_dir.resolve()).encode()).hexdigest()[:12]


def mounted_hierarchy(mountinfo: str) -> Hierarchy | None:
    """Which hierarchy the controllers are on, from /proc/self/mountinfo: "v2" when cgroup2 is mounted at
    /sys/fs/cgroup, "v1" when v1 controllers are mounted under it (a hybrid host's v2 mount at
    /sys/fs/cgroup/unified holds none of them), None when neither is visible."""
    fs_at: dict[str, str] = {}
    for line in mountinfo.splitlines():
        fields = line.split()
        point, fstype = fields[4], fields[fields.index("-") + 1]
        for hidden in [p for p in fs_at if p.startswith(point.rstrip("/") + "/")]:
            del fs_at[hidden]  # a later mount over a parent hides what was mounted below it
        fs_at[point] = fstype
    if fs_at.get(str(CGROUP_FS)) == "cgroup2":
        return "v2"
    if any(fs_at.get(str(CGROUP_FS / c)) == "cgroup" for c in CONTROLLERS):
        return "v1"
    return None


def own_groups(proc_cgroup: str) -> dict[str, str]:
    """This process's group per v1 controller and, under "", its v2 group, from /proc/self/cgroup."""
    groups: dict[str, str] = {}
    for line in proc_cgroup.splitlines():
        _, names, path = line.split(":", 2)
        for name in names.split(",") if names else [""]:
            groups[name] = path
    return groups


@dataclass(frozen=True)
class Limit:
    """One value a sandbox's group gets: the controller it belongs to, the file and what is written."""

    controller: str
    file: str
    value: str


def limit_files(hierarchy: Hierarchy, resources: Resources) -> list[Limit]:
    """The files to write in a sandbox's groups for its limits (unset limits write nothing)."""
    r, out = resources, []
    if r.memory_bytes and hierarchy == "v1":
        # memsw (memory + swap) is written only where the kernel accounts swap: create() skips it when absent
        out += [
            Limit("memory", f, str(r.memory_bytes)) for f in ("memory.limit_in_bytes", "memory.memsw.limit_in_bytes")
        ]
    elif r.memory_bytes:
        out += [Limit("memory", "memory.max", str(r.memory_bytes)), Limit("memory", "memory.swap.max", "0")]
    if r.cpu_millis and hierarchy == "v1":
        quota = str(r.cpu_millis * CFS_PERIOD_US // 1000)
        out += [Limit("cpu", "cpu.cfs_period_us", str(CFS_PERIOD_US)), Limit("cpu", "cpu.cfs_quota_us", quota)]
    elif r.cpu_millis:
        out.append(Limit("cpu", "cpu.max", f"{r.cpu_millis * CFS_PERIOD_US // 1000} {CFS_PERIOD_US}"))
    if r.pids:
        out.append(Limit("pids", "pids.max", str(r.pids)))
    return out


OPTIONAL_FILES = {"memory.memsw.limit_in_bytes", "memory.swap.max"}  # absent where the kernel does not account swap


def oom_kill_count(text: str) -> int:
    """The `oom_kill` counter of a v1 memory.oom_control or a v2 memory.events file."""
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key == "oom_kill":
            return int(value)
    return 0


class Cgroups:
    """The service's parent groups and under them a group per sandbox limited there, on whichever hierarchy the
    host mounts. v1: a parent in each controller's tree, under the service's own group there. v2: one parent in a
    delegated subtree (the given root, or the service's own group), with the controllers handed down to it."""

    def __init__(self, state_dir: Path, root: Path | None = None) -> None:
        self._name = parent_name(state_dir)  # services never touch each other's groups
        self._root = root
        self._hierarchy: Hierarchy | None = None
        self._parents: dict[str, Path] = {}  # controller -> parent group; on v2 every controller's is one group
        self._problem = ""  # what start() found missing, for require()

    def start(self) -> int:
        """Find the controllers and remove the groups a crashed previous run left; returns of how many sandboxes."""
        self._hierarchy = "v2" if self._root is not None else mounted_hierarchy(_read("/proc/self/mountinfo"))
        owns = own_groups(_read("/proc/self/cgroup"))
        if self._hierarchy == "v1":
            for c in CONTROLLERS:
                own = CGROUP_FS / c / owns.get(c, "/").lstrip("/")
                if c in owns and own.is_dir():
                    self._parents[c] = own / self._name
            missing = [c for c in CONTROLLERS if c not in self._parents]
            if missing:
                self._problem = (
                    f"the cgroup v1 controllers {', '.join(missing)} mounted under {CGROUP_FS}, which this host lacks"
                )
        elif self._hierarchy == "v2":
            own = CGROUP_FS / owns.get("", "/").lstrip("/")
            subtree = self._root or (own.parent if own.name == SERVICE_LEAF else own)
            self._problem = _delegate(subtree, subtree / self._name)
            if not self._problem:
                self._parents = dict.fromkeys(CONTROLLERS, subtree / self._name)
        else:
            self._problem = (
                f"cgroups, and this host has neither cgroup v2 mounted at {CGROUP_FS} nor the v1 controllers "
                f"{', '.join(CONTROLLERS)} under it"
            )
        removed: set[str] = set()
        for parent in set(self._parents.values()):
            parent.mkdir(exist_ok=True)
            for group in [p for p in parent.iterdir() if p.is_dir()]:
                _rmdir(group)
                removed.add(group.name)
        return len(removed)

    def require(self, what: str, remedy: str) -> None:
        """Raise FailedPrecondition saying what the host lacks for limits, if anything."""
        if self._problem:
            raise FailedPrecondition(f"{what} needs {self._problem}; {remedy}")

    def create(self, sandbox_id: str, resources: Resources) -> list[Path]:
        """Make the sandbox's groups for the limits it has (no idle memory groups to keep), with those limits;
        returns the files to write "0" to to join them, for enter_argv."""
        self.require("a sandbox with cpu, memory or pids limits", "create it without them")
        assert self._hierarchy is not None
        limits = limit_files(self._hierarchy, resources)
        groups = {lim.controller: self._parents[lim.controller] / sandbox_id for lim in limits}
        for group in set(groups.values()):
            group.mkdir(exist_ok=True)
        for lim in limits:
            path = groups[lim.controller] / lim.file
            if lim.file not in OPTIONAL_FILES or path.exists():
                _write(path, lim.value)
        join = "tasks" if self._hierarchy == "v1" else "cgroup.procs"
        return [group / join for group in dict.fromkeys(groups.values())]

    def oom_kills(self, sandbox_id: str) -> int:
        """How many processes the kernel has killed in the sandbox's memory group for lack of memory."""
        parent = self._parents.get("memory")
        if parent is None:
            return 0
        name = "memory.oom_control" if self._hierarchy == "v1" else "memory.events"
        try:
            return oom_kill_count((parent / sandbox_id / name).read_text())
        except FileNotFoundError:  # a sandbox without limits has no group
            return 0

    def remove(self, sandbox_id: str) -> None:
        """Remove the sandbox's groups once its processes are gone (they die with its pid namespace)."""
        for parent in set(self._parents.values()):
            _rmdir(parent / sandbox_id)

    def close(self) -> None:
        """Remove the service's (by now empty) parent groups."""
        for parent in set(self._parents.values()):
            try:
                parent.rmdir()
            except OSError as err:
                log.warning("cannot remove cgroup %s: %s", parent, err.strerror)


def _delegate(subtree: Path, parent: Path) -> str:
    """Hand the controllers down through `subtree` to the service's `parent` group in it (v2), moving the processes
    in `subtree` into its service leaf when they keep it from doing so; returns what is missing, or ""."""
    try:
        available = _read(subtree / "cgroup.controllers").split()
    except OSError as err:
        return f"a cgroup v2 subtree it can use, and {subtree} cannot be read ({err.strerror}): {DELEGATE_REMEDY}"
    missing = [c for c in CONTROLLERS if c not in available]
    if missing:
        return (
            f"the cgroup v2 controllers {', '.join(missing)}, which are not delegated to {subtree}: {DELEGATE_REMEDY}"
        )
    enable = " ".join(f"+{c}" for c in CONTROLLERS)
    try:
        for _ in range(10):  # processes in the subtree may still be forking
            if all(c in _read(subtree / "cgroup.subtree_control").split() for c in CONTROLLERS):
                break
            try:
                (subtree / "cgroup.subtree_control").write_text(enable)
                break
            except OSError as err:
                if err.errno != errno.EBUSY:
                    raise
            # v2's "no internal processes" rule: the subtree's own processes must move to a leaf first.
            leaf = subtree / SERVICE_LEAF
            leaf.mkdir(exist_ok=True)
            for pid in _read(subtree / "cgroup.procs").split():
                try:
                    (leaf / "cgroup.procs").write_text(pid)
                except ProcessLookupError:  # it exited meanwhile
                    pass
            log.info("moved the processes of cgroup %s into %s to hand its controllers down", subtree, leaf)
        else:
            return f"the cgroup v2 subtree {subtree} without processes of its own, and processes kept joining it"
        parent.mkdir(exist_ok=True)
        (parent / "cgroup.subtree_control").write_text(enable)
    except OSError as err:
        return f"write access to the cgroup v2 subtree {subtree} ({err.strerror}): {DELEGATE_REMEDY}"
    return ""


def _read(path: str | Path) -> str:
    return Path(path).read_text()


def _write(path: Path, value: int | str) -> None:
    try:
        path.write_text(str(value))
    except OSError as err:
        raise FailedPrecondition(f"cannot set the sandbox limit {path.name}={value}: {err.strerror}") from None


def _rmdir(group: Path) -> None:
    """rmdir a group, retrying while the last processes in it are still exiting."""
    deadline = time.monotonic() + REMOVE_TIMEOUT_S
    while True:
        try:
            group.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError as err:
            if err.errno != errno.EBUSY or time.monotonic() > deadline:
                log.warning("cannot remove cgroup %s: %s (the next start of the service retries)", group, err.strerror)
                return
        time.sleep(0.005)


def enter_argv(joins: list[Path], argv: list[str]) -> list[str]:
    """argv behind a /bin/sh that first moves itself into the groups whose join files (Cgroups.create) are given."""
    return ["/bin/sh", "-c", ENTER_SCRIPT, "sh", *map(str, joins), "--", *argv]
