"""Per-sandbox cgroups (v1 memory, cpu and pids controllers) for the local backend: limits, OOM-kill counts
and removal. Each sandbox's groups sit under the service's own group, in a parent named for its state dir."""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import time
from pathlib import Path

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
# Run by /bin/sh before bwrap: it moves itself into each group given before "--", then execs the rest, so bwrap
# and everything it forks start inside the groups (safer than a preexec_fn in a threaded server). It writes "0"
# (this thread) to `tasks`, not its pid to `cgroup.procs`: moving only the current thread skips the kernel's global
# threadgroup lock, whose RCU grace period cost about 10 ms per create here; sh has one thread, so that moves it all.
ENTER_SCRIPT = 'while [ "$1" != -- ]; do echo 0 > "$1" || exit 125; shift; done; shift; exec "$@"'


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


def _own_group(controller: str) -> Path | None:
    """This process's group in a v1 controller, or None when the controller is not mounted as v1."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, names, path = line.split(":", 2)
        if controller in names.split(","):
            group = CGROUP_FS / controller / path.lstrip("/")
            return group if group.is_dir() else None
    return None


class Cgroups:
    """The service's parent group in each controller, and under it a group per sandbox limited there."""

    def __init__(self, state_dir: Path) -> None:
        self._name = parent_name(state_dir)  # services never touch each other's groups
        self._parents: dict[str, Path] = {}

    def start(self) -> int:
        """Find the controllers and remove the groups a crashed previous run left; returns of how many sandboxes."""
        owns = {controller: _own_group(controller) for controller in CONTROLLERS}
        self._parents = {c: own / self._name for c, own in owns.items() if own is not None}
        removed: set[str] = set()
        for parent in self._parents.values():
            parent.mkdir(exist_ok=True)
            for group in [p for p in parent.iterdir() if p.is_dir()]:
                _rmdir(group)
                removed.add(group.name)
        return len(removed)

    def require(self, what: str, remedy: str) -> None:
        """Raise FailedPrecondition naming the missing controllers, if any."""
        missing = [c for c in CONTROLLERS if c not in self._parents]
        if missing:
            raise FailedPrecondition(
                f"{what} needs the cgroup v1 controllers {', '.join(missing)} mounted under "
                f"{CGROUP_FS}, which this host lacks (cgroup v2 is not supported yet); {remedy}"
            )

    def create(self, sandbox_id: str, resources: Resources) -> list[Path]:
        """Make a group in each controller the sandbox has a limit for (no idle memory groups to keep), with
        that limit; returns their `tasks` files, to join with enter_argv."""
        self.require("a sandbox with cpu, memory or pids limits", "create it without them")
        limits = {"memory": resources.memory_bytes, "cpu": resources.cpu_millis, "pids": resources.pids}
        groups = {c: self._parents[c] / sandbox_id for c, limit in limits.items() if limit}
        for group in groups.values():
            group.mkdir(exist_ok=True)
        if "memory" in groups:
            _write(groups["memory"] / "memory.limit_in_bytes", resources.memory_bytes)
            memsw = groups["memory"] / "memory.memsw.limit_in_bytes"  # present when the kernel accounts swap
            if memsw.exists():
                _write(memsw, resources.memory_bytes)
        if "cpu" in groups:
            _write(groups["cpu"] / "cpu.cfs_period_us", CFS_PERIOD_US)
            _write(groups["cpu"] / "cpu.cfs_quota_us", resources.cpu_millis * CFS_PERIOD_US // 1000)
        if "pids" in groups:
            _write(groups["pids"] / "pids.max", resources.pids)
        return [group / "tasks" for group in groups.values()]

    def oom_kills(self, sandbox_id: str) -> int:
        """How many processes the kernel has killed in the sandbox's memory group for lack of memory."""
        parent = self._parents.get("memory")
        if parent is None:
            return 0
        try:
            text = (parent / sandbox_id / "memory.oom_control").read_text()
        except FileNotFoundError:  # a sandbox without a memory limit has no memory group
            return 0
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
        return 0

    def remove(self, sandbox_id: str) -> None:
        """Remove the sandbox's groups once its processes are gone (they die with its pid namespace)."""
        for parent in self._parents.values():
            _rmdir(parent / sandbox_id)

    def close(self) -> None:
        """Remove the service's (by now empty) parent groups."""
        for parent in self._parents.values():
            try:
                parent.rmdir()
            except OSError as err:
                log.warning("cannot remove cgroup %s: %s", parent, err.strerror)


def _write(path: Path, value: int) -> None:
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


def enter_argv(tasks: list[Path], argv: list[str]) -> list[str]:
    """argv behind a /bin/sh that first moves itself into the groups whose `tasks` files are given."""
    return ["/bin/sh", "-c", ENTER_SCRIPT, "sh", *map(str, tasks), "--", *argv]
