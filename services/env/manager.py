"""SandboxManager: everything about sandboxes that is the same for every backend — ids, tenants, leases and
expiry, limits, network policy; with what runs in them (commands.py), their files and their snapshots."""

from __future__ import annotations

import asyncio
import base64
import ipaddress
import logging
import posixpath
import re
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass
from typing import Any

from orchard.errors import (
    AlreadyExists,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    ResourceExhausted,
)
from orchard.runtime import tenancy
from orchard.services.env import metrics, records
from orchard.services.env.agent_client import AgentClient
from orchard.services.env.backends.base import (
    EgressRule,
    RecoverableBackend,
    ReportingBackend,
    Resources,
    SandboxBackend,
    SandboxSpec,
)
from orchard.services.env.browser import BrowserPool
from orchard.services.env.commands import Commands
from orchard.services.env.files import FileOps
from orchard.services.env.images import BuildProgress, Image, ImageStore, Recipe
from orchard.services.env.labels import check_labels
from orchard.services.env.models import Sandbox, SandboxKind, SandboxState, sandbox_key
from orchard.services.env.settings import EnvSettings
from orchard.services.env.snapshots import Snapshots

log = logging.getLogger(__name__)

SANDBOX_ID = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
TOMBSTONES = 10_000  # deleted sandboxes remembered, so a late caller learns why one is gone
RESTART_REASON = "ended when the env service restarted: the previous service process stopped without deleting it"
MAX_EGRESS_RULES = 256
DNS_LABEL = r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?"
HOST_NAME = re.compile(rf"^(?=.{{1,253}}\.?$){DNS_LABEL}(\.{DNS_LABEL})*\.?$", re.IGNORECASE)


@dataclass(frozen=True)
class CreateRequest:
    """A validated-on-use CreateSandbox request in domain terms (0 = service default)."""

    image: str
    env: Mapping[str, str]
    labels: Mapping[str, str]
    resources: Resources = Resources()
    egress: tuple[EgressRule, ...] = ()
    ttl_s: float = 0.0
    heartbeat_timeout_s: float = 0.0
    sandbox_id: str = ""
    request_id: str = ""
    workdir: str = ""
    from_snapshot: str = ""
    kind: SandboxKind = SandboxKind.CONTAINER
    isolation: str = ""
    """"container", "gvisor", or "" for the service's default."""


def check_egress(rules: tuple[EgressRule, ...]) -> None:
    """Raise InvalidArgument unless every rule names exactly one of a CIDR and a host name, and a port 0..65535."""
    if len(rules) > MAX_EGRESS_RULES:
        raise InvalidArgument(
            f"network_policy has {len(rules)} rules; at most {MAX_EGRESS_RULES} are allowed "
            "(join neighbouring addresses into one cidr)",
            field="network_policy",
        )
    for i, rule in enumerate(rules):
        if bool(rule.cidr) == bool(rule.host):
            raise InvalidArgument(f"network_policy rule {i}: set exactly one of cidr and host", field="network_policy")
        if rule.cidr:
            try:
                ipaddress.ip_network(rule.cidr, strict=False)
            except ValueError:
                raise InvalidArgument(
                    f"network_policy rule {i}: cidr {rule.cidr!r} is not an IP network like "
                    "'169.254.0.0/16' or an address like '169.254.1.2'",
                    field="network_policy",
                ) from None
        elif not HOST_NAME.match(rule.host):
            raise InvalidArgument(
                f"network_policy rule {i}: host {rule.host!r} is not a valid host name", field="network_policy"
            )
        if not 0 <= rule.port <= 65535:
            raise InvalidArgument(
                f"network_policy rule {i}: port {rule.port} is not in 0..65535 (0 = any port)", field="network_policy"
            )


def _page_cursor(page_token: str) -> str:
    """The last sandbox id of the previous page, from a next_page_token this service issued."""
    try:
        after = base64.b64decode(page_token.encode(), altchars=b"-_", validate=True).decode()
    except ValueError:
        after = ""
    if not SANDBOX_ID.match(after):
        raise InvalidArgument(
            "page_token is not one this service issued; pass the next_page_token of the "
            "previous page, or none for the first",
            field="page_token",
        )
    return after


class SandboxManager:
    """Owns every sandbox and exec of one env service."""

    def __init__(self, settings: EnvSettings, backend: SandboxBackend) -> None:
        self.settings = settings
        self.backend = backend
        self.sandboxes: dict[str, Sandbox] = {}  # by Sandbox.key
        self._gone: OrderedDict[str, tuple[str, str]] = OrderedDict()  # key -> (tenant, why it ended)
        self._by_request: dict[tuple[str, str], str] = {}  # (tenant, request_id) -> sandbox key
        self._records = settings.state_dir / "records"
        self._create_slots = asyncio.Semaphore(settings.max_concurrent_creates)
        self._tasks: set[asyncio.Task[None]] = set()
        self._deleting: dict[str, asyncio.Task[None]] = {}
        self._sweeper: asyncio.Task[None] | None = None
        # Each collaborator gets the narrow SandboxDirectory of the manager (or one method), never the manager.
        self.files = FileOps(self.ready_sandbox)
        self.snapshots = Snapshots(settings, backend, self)
        self.commands = Commands(settings, backend, self)
        self.browsers = BrowserPool(settings, self._browser_failed)
        if isinstance(backend, ReportingBackend):
            backend.report_ended(self._sandbox_ended)

    # ---- lifecycle of the manager ----

    async def start(self) -> None:
        """Take back the sandboxes a previous run left that its backend kept running and whose ttl has not run
        out; remember the others as ended, so GetSandbox says why. Then sweep."""
        self._records.mkdir(parents=True, exist_ok=True)
        await asyncio.to_thread(self.commands.start)
        await self.snapshots.start()
        left = records.load_all(self._records)
        now = time.time()
        taken: dict[str, AgentClient] = {}
        if isinstance(self.backend, RecoverableBackend):
            taken = await self.backend.recover(
                {
                    sb.key: self._spec(sb)
                    for sb in left
                    if sb.create_time + sb.ttl_s > now and sb.kind is SandboxKind.CONTAINER
                }
            )
        for sandbox in left:
            if sandbox.key in taken:
                self._adopt(sandbox, taken[sandbox.key])
                continue
            # A sandbox its backend could have kept ended by its ttl; any other ended with the old process.
            expired = isinstance(self.backend, RecoverableBackend) and sandbox.create_time + sandbox.ttl_s <= now
            self._gone[sandbox.key] = (sandbox.tenant, sandbox.expiry_reason() if expired else RESTART_REASON)
            records.remove(self._records, sandbox.key)
        self._sweeper = asyncio.create_task(self._sweep_forever(), name="env-sweeper")

    def _adopt(self, sandbox: Sandbox, client: AgentClient) -> None:
        """Serve a sandbox a previous run created; its lease restarts now (nobody could heartbeat meanwhile)."""
        sandbox.client = client
        sandbox.state = SandboxState.READY
        sandbox.ready.set()
        self.sandboxes[sandbox.key] = sandbox
        if sandbox.request_id:
            self._by_request[sandbox.tenant, sandbox.request_id] = sandbox.key
        log.info("sandbox taken back after a restart", extra={"sandbox_id": sandbox.sandbox_id})

    async def close(self) -> None:
        """Stop sweeping, cancel running commands, and destroy every sandbox (every tenant's)."""
        with tenancy.as_tenant(tenancy.SYSTEM):  # scoped: the caller's own tenant is left as it was
            await self._close()

    async def _close(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await asyncio.gather(
            *(self.delete_sandbox(sid, reason="the env service stopped") for sid in list(self.sandboxes)),
            return_exceptions=True,
        )
        await self.browsers.close()
        await self.snapshots.close()
        await self.backend.close()

    def spawn(self, coro: Coroutine[Any, Any, None], name: str) -> None:
        """Run coro as a task this manager owns (cancelled when it closes)."""
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # ---- images ----

    async def build_image(
        self, name: str, recipe: Recipe | None, force: bool, progress: Callable[[BuildProgress], None]
    ) -> Image:
        """Build image `name` in the service's images dir (adding `recipe` under that name first, if given)."""
        store = ImageStore(self.settings.images_dir)
        if recipe is not None:
            store.add_recipe(name, recipe)
        return await store.build(name, force=force, progress=progress)

    # ---- sandboxes ----

    def get_sandbox(self, sandbox_id: str) -> Sandbox:
        """The current tenant's sandbox of that id (for SYSTEM, the one of that key); another tenant's is
        NOT_FOUND, so ids don't leak."""
        tenant = tenancy.current_tenant()
        key = sandbox_id if tenant == tenancy.SYSTEM else sandbox_key(tenant, sandbox_id)
        sandbox = self.sandboxes.get(key)
        if sandbox is None or not tenancy.may_access(sandbox.tenant):
            gone = self._gone.get(key)
            if sandbox is None and gone is not None and tenancy.may_access(gone[0]):
                raise NotFound(f"sandbox {sandbox_id!r} not found ({gone[1]})")
            raise NotFound(f"sandbox {sandbox_id!r} not found")
        return sandbox

    def ready_sandbox(self, sandbox_id: str) -> Sandbox:
        """A ready container sandbox (for commands, files, patches, snapshots, terminals and its policy)."""
        sandbox = self.get_sandbox(sandbox_id)
        if sandbox.kind is SandboxKind.BROWSER:
            raise FailedPrecondition(
                f"sandbox {sandbox_id!r} is a browser sandbox (drive it with Screenshot, Act "
                "and GetPageContent); commands, files, patches, snapshots and terminals need "
                "a container sandbox"
            )
        return self._ready(sandbox)

    def ready_browser(self, sandbox_id: str) -> Sandbox:
        """A ready browser sandbox (for Screenshot, Act and GetPageContent)."""
        sandbox = self.get_sandbox(sandbox_id)
        if sandbox.kind is not SandboxKind.BROWSER:
            raise FailedPrecondition(
                f"sandbox {sandbox_id!r} is a container sandbox; Screenshot, Act and "
                "GetPageContent need a browser sandbox (CreateSandbox with kind "
                "SANDBOX_KIND_BROWSER)"
            )
        return self._ready(sandbox)

    def _ready(self, sandbox: Sandbox) -> Sandbox:
        sandbox_id = sandbox.sandbox_id
        if sandbox.state is not SandboxState.READY or (sandbox.client is None and sandbox.browser is None):
            detail = f": {sandbox.failure_reason}" if sandbox.failure_reason else ""
            raise FailedPrecondition(f"sandbox {sandbox_id!r} is {sandbox.state.name.lower()}{detail}")
        return sandbox

    async def create_sandbox(self, req: CreateRequest) -> Sandbox:
        """Create a sandbox and return it ready; a retry with the same request_id returns the same one."""
        tenant = tenancy.current_tenant()
        if req.request_id and (tenant, req.request_id) in self._by_request:
            sandbox = self.sandboxes[self._by_request[tenant, req.request_id]]
            await sandbox.ready.wait()
            return sandbox
        s = self.settings
        browser = req.kind is SandboxKind.BROWSER
        if browser:
            for name, value in (
                ("image", req.image),
                ("from_snapshot", req.from_snapshot),
                ("env", req.env),
                ("workdir", req.workdir),
            ):
                if value:
                    raise InvalidArgument(
                        f"{name} is for container sandboxes; a browser sandbox takes none (leave it empty)", field=name
                    )
        snapshot = self.snapshots.get(req.from_snapshot, field="from_snapshot") if req.from_snapshot else None
        image = req.image or (snapshot.image if snapshot else "")
        if not image and not browser:
            raise InvalidArgument("image is required, e.g. 'python:3.11-slim' or 'host'", field="image")
        if snapshot is not None and image != snapshot.image:
            raise InvalidArgument(
                f"image {image!r} is not the image of snapshot {snapshot.snapshot_id!r} "
                f"({snapshot.image!r}); leave image empty to use the snapshot's",
                field="image",
            )
        if req.sandbox_id and not SANDBOX_ID.match(req.sandbox_id):
            raise InvalidArgument(
                f"sandbox_id {req.sandbox_id!r} must be 1-63 lowercase letters, digits or '-', "
                "starting and ending with a letter or digit",
                field="sandbox_id",
            )
        if req.sandbox_id and sandbox_key(tenant, req.sandbox_id) in self.sandboxes:
            # Only the tenant's own ids can collide: another tenant's same id is another key.
            raise AlreadyExists(f"sandbox {req.sandbox_id!r} already exists", field="sandbox_id")
        if req.ttl_s < 0 or req.ttl_s > s.max_ttl_s:
            raise InvalidArgument(f"ttl must be between 0 and {s.max_ttl_s:g}s", field="ttl")
        if req.heartbeat_timeout_s < 0:
            raise InvalidArgument("heartbeat_timeout must not be negative", field="heartbeat_timeout")
        for key in req.env:
            if not key or "=" in key or "\x00" in key:
                raise InvalidArgument(f"invalid env variable name {key!r}", field="env")
        check_labels(req.labels)
        for key, value in req.env.items():
            if "\x00" in value:
                raise InvalidArgument(f"env variable {key!r} contains a NUL byte", field="env")
        check_egress(req.egress)
        workdir = "/" if browser else req.workdir or "/workspace"
        if not workdir.startswith("/"):
            raise InvalidArgument(f"workdir {workdir!r} must be an absolute path", field="workdir")
        if len(self.sandboxes) >= s.max_sandboxes:
            raise ResourceExhausted(
                f"the service already holds {s.max_sandboxes} sandboxes (its limit); delete some or retry later",
                retry_after=5.0,
            )
        r = req.resources
        resources = (
            Resources()
            if browser
            else Resources(
                r.cpu_millis or s.default_cpu_millis,
                r.memory_bytes or s.default_memory_bytes,
                r.pids or s.default_pids,
                r.disk_bytes or s.default_disk_bytes,
            )
        )
        sandbox = Sandbox(
            sandbox_id=req.sandbox_id or f"sb-{uuid.uuid4().hex[:12]}",
            image=image,
            workdir=posixpath.normpath(workdir),
            env=dict(req.env),
            labels=dict(req.labels),
            resources=resources,
            egress=req.egress,
            ttl_s=req.ttl_s or s.default_ttl_s,
            heartbeat_timeout_s=req.heartbeat_timeout_s,
            request_id=req.request_id,
            tenant=tenant,
            from_snapshot=req.from_snapshot,
            layers=snapshot.layers if snapshot else (),
            kind=req.kind,
            isolation="" if browser else req.isolation or s.default_isolation,
        )
        self.sandboxes[sandbox.key] = sandbox
        if req.request_id:
            self._by_request[tenant, req.request_id] = sandbox.key
        try:
            async with self._create_slots:
                if browser:
                    # The proxy reads the policy on every connection: SetNetworkPolicy applies at once.
                    sandbox.browser = await self.browsers.open(sandbox.key, lambda: sandbox.egress)
                else:
                    sandbox.client = await self.backend.create(self._spec(sandbox))
        except BaseException:
            self.sandboxes.pop(sandbox.key, None)
            self._by_request.pop((tenant, req.request_id), None)
            sandbox.state = SandboxState.FAILED
            sandbox.ready.set()
            await self.snapshots.collect()  # the snapshot may have been deleted meanwhile
            raise
        sandbox.state = SandboxState.READY
        sandbox.ready.set()
        metrics.SANDBOXES_CREATED.inc()
        # A record on disk, so that after a crash the next run can say what became of this sandbox (or take it back).
        records.save(self._records, sandbox)
        log.info(
            "sandbox created",
            extra={"sandbox_id": sandbox.sandbox_id, "image": sandbox.image, "kind": sandbox.kind.name.lower()},
        )
        return sandbox

    @staticmethod
    def _spec(sandbox: Sandbox) -> SandboxSpec:
        return SandboxSpec(
            sandbox_id=sandbox.key,
            image=sandbox.image,
            workdir=sandbox.workdir,
            env=sandbox.env,
            resources=sandbox.resources,
            egress=sandbox.egress,
            layers=sandbox.layers,
            tenant=sandbox.tenant,
            isolation=sandbox.isolation,
            expire_time=sandbox.create_time + sandbox.ttl_s,
        )

    def list_sandboxes(
        self, label_selector: Mapping[str, str], page_size: int, page_token: str
    ) -> tuple[list[Sandbox], str]:
        if page_size < 0:
            raise InvalidArgument("page_size must not be negative", field="page_size")
        size = min(page_size or 100, 1000)
        after = _page_cursor(page_token) if page_token else ""
        matching = sorted(
            (
                sb
                for sb in self.sandboxes.values()
                if sb.sandbox_id > after
                and tenancy.may_access(sb.tenant)
                and all(sb.labels.get(k) == v for k, v in label_selector.items())
            ),
            key=lambda sb: sb.sandbox_id,
        )
        page = matching[:size]
        more = len(matching) > size
        token = base64.urlsafe_b64encode(page[-1].sandbox_id.encode()).decode() if more else ""
        return page, token

    def heartbeat(self, sandbox_id: str) -> Sandbox:
        sandbox = self.get_sandbox(sandbox_id)
        sandbox.last_heartbeat_time = time.time()
        return sandbox

    async def delete_sandbox(self, sandbox_id: str, *, reason: str = "deleted by a client") -> Sandbox:
        """Cancel the sandbox's commands, kill its processes and remove its files.

        The work runs in a task of its own, shared by concurrent callers: a caller that gives up (an RPC
        deadline, the sweeper stopping) does not leave a sandbox half deleted.
        """
        sandbox = self.get_sandbox(sandbox_id)
        key = sandbox.key
        task = self._deleting.get(key)
        if task is None:
            task = asyncio.create_task(self._delete(sandbox, reason), name=f"delete-{key}")
            self._deleting[key] = task
            task.add_done_callback(lambda _: self._deleting.pop(key, None))
        await asyncio.shield(task)
        return sandbox

    async def _delete(self, sandbox: Sandbox, reason: str) -> None:
        key = sandbox.key
        await sandbox.ready.wait()
        sandbox.state = SandboxState.DELETING
        await self.commands.cancel_all(key, reason)
        try:
            if sandbox.kind is SandboxKind.BROWSER:
                await self.browsers.close_session(key)
            else:
                await self.backend.destroy(key)
        finally:
            sandbox.state = SandboxState.DELETED
            self.sandboxes.pop(key, None)
            self._by_request.pop((sandbox.tenant, sandbox.request_id), None)
            self._gone[key] = (sandbox.tenant, reason)
            records.remove(self._records, key)
            metrics.SANDBOXES_ENDED.labels(metrics.reason_kind(reason)).inc()
            while len(self._gone) > TOMBSTONES:
                self._gone.popitem(last=False)
        await self.snapshots.collect()  # the layers of deleted snapshots this sandbox stacked may go now
        log.info("sandbox deleted", extra={"sandbox_id": sandbox.sandbox_id, "key": key, "reason": reason})

    async def set_network_policy(self, sandbox_id: str, egress: tuple[EgressRule, ...]) -> Sandbox:
        """Replace a ready sandbox's egress allowlist; returns the sandbox with the new policy in force."""
        sandbox = self.get_sandbox(sandbox_id)
        sandbox = self._ready(sandbox) if sandbox.kind is SandboxKind.BROWSER else self.ready_sandbox(sandbox_id)
        check_egress(egress)
        async with sandbox.policy_lock:
            if sandbox.kind is SandboxKind.CONTAINER:
                await self.backend.set_egress(sandbox.key, egress)
            sandbox.egress = egress
            if sandbox.state is SandboxState.READY:  # not while a delete removes its record
                records.save(self._records, sandbox)
        log.info("network policy set", extra={"sandbox_id": sandbox_id, "rules": len(egress)})
        return sandbox

    def _browser_failed(self, key: str, reason: str) -> None:
        sandbox = self.sandboxes.get(key)
        if sandbox is not None:
            metrics.BROWSER_FAILURES.labels("page" if "page" in reason else "process").inc()
            self.mark_failed(sandbox, reason)

    def _sandbox_ended(self, key: str, reason: str) -> None:
        """The backend saw the sandbox's boundary end (ReportingBackend): it fails, saying why. Its reason replaces
        a command's "the agent exited", which may have come first, since only the backend knows the cause."""
        sandbox = self.sandboxes.get(key)
        if sandbox is None:
            return
        if sandbox.state is SandboxState.FAILED:
            sandbox.failure_reason = reason
        self.mark_failed(sandbox, reason)

    def mark_failed(self, sandbox: Sandbox, reason: str) -> None:
        if sandbox.state is SandboxState.READY:
            sandbox.state = SandboxState.FAILED
            sandbox.failure_reason = reason
            log.warning("sandbox failed", extra={"sandbox_id": sandbox.sandbox_id, "reason": reason})

    async def _sweep_forever(self) -> None:
        tenancy.set_tenant(tenancy.SYSTEM)  # expiry is the service's own work, across tenants
        while True:
            await asyncio.sleep(self.settings.sweep_interval_s)
            try:
                await self.sweep()
            except Exception:
                log.exception("sweep failed; will retry")

    async def sweep(self) -> None:
        """Delete expired sandboxes and forget finished commands past their retention."""
        now = time.time()
        expired = [
            sb
            for sb in self.sandboxes.values()
            if sb.expire_time <= now and sb.state in (SandboxState.READY, SandboxState.FAILED)
        ]
        await asyncio.gather(
            *(self.delete_sandbox(sb.key, reason=sb.expiry_reason()) for sb in expired), return_exceptions=True
        )
        self.commands.forget_ended_before(now - self.settings.exec_retention_s)
