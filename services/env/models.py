"""The env service's domain objects: sandboxes, the commands (execs) run in them, and snapshots of them."""

from __future__ import annotations

import asyncio
import enum
import hashlib
import time
from collections.abc import Coroutine, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from orchard.runtime.tenancy import DEFAULT_TENANT
from orchard.services.env.agent_client import AgentClient
from orchard.services.env.backends.base import EgressRule, Resources
from orchard.services.env.exec_output import ExecOutput

if TYPE_CHECKING:
    from orchard.services.env.browser import BrowserSession


class SandboxKind(enum.Enum):
    """What a sandbox runs (values as in the proto's SandboxKind)."""

    CONTAINER = 1
    BROWSER = 2


class SandboxState(enum.Enum):
    PENDING = 1
    READY = 2
    FAILED = 3
    DELETING = 4
    DELETED = 5


class ExecState(enum.Enum):
    QUEUED = 1
    RUNNING = 2
    SUCCEEDED = 3
    FAILED = 4
    TIMED_OUT = 5
    CANCELLED = 6

    @property
    def done(self) -> bool:
        return self.value >= ExecState.SUCCEEDED.value


def sandbox_key(tenant: str, sandbox_id: str) -> str:
    """The id a sandbox has inside the service (its backend, records and maps): its own for the default tenant;
    for another tenant, one made unique by a hash of (tenant, id), so that two tenants may choose the same id and
    neither can learn from an ALREADY_EXISTS that the other holds it. A valid sandbox id itself (<= 63 chars)."""
    if tenant == DEFAULT_TENANT:
        return sandbox_id
    digest = hashlib.sha256(f"{tenant}/{sandbox_id}".encode()).hexdigest()[:16]
    return f"{sandbox_id[:46].rstrip('-')}-{digest}"


@dataclass
class Sandbox:
    """One sandbox and its lease; client is the channel to its agent once ready."""

    sandbox_id: str
    """The id its tenant knows it by (unique within the tenant)."""
    image: str
    workdir: str
    env: dict[str, str]
    labels: dict[str, str]
    resources: Resources
    egress: tuple[EgressRule, ...]
    ttl_s: float
    heartbeat_timeout_s: float
    create_time: float = field(default_factory=time.time)
    last_heartbeat_time: float = field(default_factory=time.time)
    state: SandboxState = SandboxState.PENDING
    failure_reason: str = ""
    request_id: str = ""
    tenant: str = DEFAULT_TENANT
    """The tenant that created it; other tenants get NOT_FOUND for it."""
    client: AgentClient | None = None
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    exec_order: asyncio.Lock = field(default_factory=asyncio.Lock)
    policy_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    """Held while the network policy changes, so the recorded policy is the one in force."""
    from_snapshot: str = ""
    """The id of the snapshot it was made from; empty when made from its image alone."""
    layers: tuple[str, ...] = ()
    """The snapshot layers its files stack on (that snapshot's layers); they stay on disk while it lives."""
    kind: SandboxKind = SandboxKind.CONTAINER
    browser: BrowserSession | None = None
    """A browser sandbox's context and page, once ready."""
    isolation: str = ""
    """"container" or "gvisor" (SandboxSpec.isolation); empty for a browser sandbox."""
    key: str = ""
    """Its id unique across tenants (sandbox_key): what the backend, records and the manager's maps use."""

    def __post_init__(self) -> None:
        self.key = self.key or sandbox_key(self.tenant, self.sandbox_id)

    @property
    def expire_time(self) -> float:
        expiry = self.create_time + self.ttl_s
        if self.heartbeat_timeout_s > 0:
            expiry = min(expiry, self.last_heartbeat_time + self.heartbeat_timeout_s)
        return expiry

    def expiry_reason(self) -> str:
        if (
            self.heartbeat_timeout_s > 0
            and self.last_heartbeat_time + self.heartbeat_timeout_s < self.create_time + self.ttl_s
        ):
            return f"no heartbeat for {self.heartbeat_timeout_s:g}s"
        return f"expired after ttl {self.ttl_s:g}s"


@dataclass
class Exec:
    """One command: its request, its state, and its output."""

    exec_id: str
    sandbox_id: str
    command: str
    argv: list[str]
    cwd: str
    env: dict[str, str]
    stdin: bytes
    timeout_s: float
    max_output: int
    out: ExecOutput
    """Its kept output, in arrival order."""
    tenant: str = DEFAULT_TENANT
    """The tenant of its sandbox."""
    sandbox_key: str = ""
    """Its sandbox's key (Sandbox.key)."""
    create_time: float = field(default_factory=time.time)
    state: ExecState = ExecState.QUEUED
    exit_code: int = -1
    totals: tuple[int, int] = (0, 0)
    error: str = ""
    oom_killed: bool = False
    """True when the kernel killed a process of this command for lack of memory and it did not succeed."""
    start_time: float | None = None
    end_time: float | None = None
    agent_id: int | None = None
    changed: asyncio.Condition = field(default_factory=asyncio.Condition)
    """Notified on new output and on the end (streams wait on it)."""
    ended: asyncio.Event = field(default_factory=asyncio.Event)
    """Set once the exec is done (waiters wait on it: no wake-up per output chunk)."""

    async def output(self, fd: int, offset: int = 0, limit: int | None = None) -> bytes:
        """Kept bytes of stdout (1) or stderr (2), all of them or `limit` from `offset`."""
        return await self.out.read(fd, offset, limit)

    def truncated(self, fd: int) -> bool:
        return self.totals[fd - 1] > self.max_output

    async def notify(self) -> None:
        async with self.changed:
            self.changed.notify_all()


@dataclass
class Snapshot:
    """A frozen copy of a sandbox's files; sandboxes made from it stack its layers over their image."""

    snapshot_id: str
    sandbox_id: str
    """The sandbox it was taken from."""
    image: str
    layers: tuple[str, ...]
    """The layers a sandbox made from it stacks, top first: its own, then its source sandbox's."""
    size_bytes: int
    labels: dict[str, str]
    tenant: str = DEFAULT_TENANT
    """The tenant that took it; other tenants get NOT_FOUND for it."""
    create_time: float = field(default_factory=time.time)
    request_id: str = ""
    keep: bool = False
    """Kept across restarts of the service (a record on disk); otherwise it ends with the service."""


class SandboxDirectory(Protocol):
    """What the manager's collaborators (commands, snapshots) may ask of it, and no more: a ready sandbox by id
    (tenant-checked), the live sandboxes by key, failing one, and running a task it owns. The manager is one."""

    @property
    def sandboxes(self) -> Mapping[str, Sandbox]: ...

    def ready_sandbox(self, sandbox_id: str) -> Sandbox: ...

    def mark_failed(self, sandbox: Sandbox, reason: str) -> None: ...

    def spawn(self, coro: Coroutine[Any, Any, None], name: str) -> None: ...
