"""The sandbox backend interface: a backend makes and removes the isolation boundary and hands the
manager a channel to the sandbox's agent. Everything else (ids, leases, ordering, limits) is the manager's."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from orchard.services.env.agent_client import AgentClient


@dataclass(frozen=True)
class EgressRule:
    """One allowed destination: a CIDR or host name, and a port (0 = any)."""

    cidr: str = ""
    host: str = ""
    port: int = 0


@dataclass(frozen=True)
class Resources:
    """Limits of one sandbox; 0 means unlimited."""

    cpu_millis: int = 0
    memory_bytes: int = 0
    pids: int = 0
    disk_bytes: int = 0


@dataclass(frozen=True)
class SandboxSpec:
    """What a backend needs to build one sandbox."""

    sandbox_id: str
    image: str
    workdir: str
    env: dict[str, str] = field(default_factory=dict)
    resources: Resources = Resources()
    egress: tuple[EgressRule, ...] = ()
    layers: tuple[str, ...] = ()
    """The snapshot layers (their snapshot ids, the top one first) the sandbox starts from, over its image:
    SnapshotFiles.layers of the snapshot it is made from; empty for a sandbox made from its image alone."""
    tenant: str = ""
    """The tenant that owns it; backends may label what they make with it (isolation is the manager's)."""
    expire_time: float = 0.0
    """When its ttl runs out (epoch seconds; 0 = not set); backends may label what they make with it."""
    isolation: str = "container"
    """What isolates it: "container" (namespaces, seccomp) or "gvisor" (a user-space kernel)."""


@dataclass(frozen=True)
class SnapshotFiles:
    """What a backend made of a snapshot."""

    layers: tuple[str, ...]
    """The layers a sandbox made from the snapshot stacks over its image, top first: the snapshot's own, then
    those the source sandbox itself was made from."""
    size_bytes: int
    """Bytes of the files in the snapshot's own layer."""


class SandboxBackend(Protocol):
    """Creates and destroys sandboxes; one module per implementation (see backends/__init__.py)."""

    name: str

    async def create(self, spec: SandboxSpec) -> AgentClient:
        """Build the sandbox, start its agent, and return a ready client to it."""
        ...

    async def destroy(self, sandbox_id: str) -> None:
        """Kill every process of the sandbox and remove its files; idempotent."""
        ...

    async def set_egress(self, sandbox_id: str, rules: tuple[EgressRule, ...]) -> None:
        """Replace a live sandbox's egress allowlist in one step (no rules: no egress at all)."""
        ...

    async def snapshot(self, sandbox_id: str, snapshot_id: str) -> SnapshotFiles:
        """Copy the live sandbox's writable layer into an immutable snapshot layer named snapshot_id. The caller
        keeps the sandbox's commands from running meanwhile."""
        ...

    async def delete_snapshot(self, snapshot_id: str) -> None:
        """Remove a snapshot's layer; the caller makes sure no sandbox stacks it any more. Idempotent."""
        ...

    async def stored_snapshots(self) -> set[str]:
        """The ids of the snapshots whose files this backend holds (kept ones outlive the service)."""
        ...

    async def oom_kills(self, sandbox_id: str) -> int:
        """How many of the sandbox's processes the kernel has killed for lack of memory so far (0 if untracked)."""
        ...

    async def close(self) -> None:
        """Destroy every sandbox this backend still holds (service shutdown); snapshots are the manager's to
        remove (kept ones stay)."""
        ...


@runtime_checkable
class RecoverableBackend(Protocol):
    """A backend whose sandboxes outlive the service's process (a container engine keeps them running): after a
    crash, the next run of the service takes them back instead of reporting them ended."""

    async def recover(self, alive: Mapping[str, SandboxSpec]) -> dict[str, AgentClient]:
        """Reconnect to the sandboxes of `alive` (by id) that a previous run left running, and remove every other
        sandbox it left. Returns a ready agent client per sandbox taken back."""
        ...


SandboxEnded = Callable[[str, str], None]
"""Told (sandbox id, why) when a live sandbox's boundary ended without destroy(): its pod evicted, OOM-killed or
deleted behind the service's back."""


@runtime_checkable
class ReportingBackend(Protocol):
    """A backend that learns by itself when a sandbox dies (a pod watch) and tells the manager at once, so the
    sandbox says so before any client call finds out."""

    def report_ended(self, callback: SandboxEnded) -> None:
        """Call callback(sandbox_id, why) on the event loop whenever a sandbox ends without destroy()."""
        ...
