"""SandboxManager: everything about sandboxes that is the same for every backend — ids, leases and
expiry, per-sandbox command order, global limits, exec records, files and patches."""

from __future__ import annotations

import asyncio
import base64
import json
import contextlib
import ipaddress
import logging
import posixpath
import re
import shlex
import time
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass

from orchard.errors import (
    AlreadyExists,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    OrchardError,
    ResourceExhausted,
    Unavailable,
)
from orchard.runtime import tenancy
from orchard.services.env import metrics
from orchard.services.env.agent_client import PtySession, terminal_size
from orchard.services.env.backends.base import EgressRule, Resources, SandboxBackend, SandboxSpec
from orchard.services.env.files import FileOps, resolve_path
from orchard.services.env.models import Exec, ExecState, Sandbox, SandboxState
from orchard.services.env.settings import EnvSettings
from orchard.services.env.snapshots import Snapshots

log = logging.getLogger(__name__)

SANDBOX_ID = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
TOMBSTONES = 10_000  # deleted sandboxes remembered, so a late caller learns why one is gone
DEFAULT_PTY_ARGV = ("bash",)  # interactive: its stdin is a terminal
PATCH_TIMEOUT_S = 30.0
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


@dataclass(frozen=True)
class ExecRequest:
    """A StartExec request: argv (joined with shell quoting) or a bash string."""

    sandbox_id: str
    argv: list[str] | None = None
    shell: str | None = None
    cwd: str = ""
    env: Mapping[str, str] | None = None
    stdin: bytes = b""
    timeout_s: float = 0.0
    login_shell: bool = False
    max_output: int = 0


def check_egress(rules: tuple[EgressRule, ...]) -> None:
    """Raise InvalidArgument unless every rule names exactly one of a CIDR and a host name, and a port 0..65535."""
    if len(rules) > MAX_EGRESS_RULES:
        raise InvalidArgument(f"network_policy has {len(rules)} rules; at most {MAX_EGRESS_RULES} are allowed "
                              "(join neighbouring addresses into one cidr)", field="network_policy")
    for i, rule in enumerate(rules):
        if bool(rule.cidr) == bool(rule.host):
            raise InvalidArgument(f"network_policy rule {i}: set exactly one of cidr and host", field="network_policy")
        if rule.cidr:
            try:
                ipaddress.ip_network(rule.cidr, strict=False)
            except ValueError:
                raise InvalidArgument(f"network_policy rule {i}: cidr {rule.cidr!r} is not an IP network like "
                                      "'169.254.0.0/16' or an address like '169.254.1.2'",
                                      field="network_policy") from None
        elif not HOST_NAME.match(rule.host):
            raise InvalidArgument(f"network_policy rule {i}: host {rule.host!r} is not a valid host name",
                                  field="network_policy")
        if not 0 <= rule.port <= 65535:
            raise InvalidArgument(f"network_policy rule {i}: port {rule.port} is not in 0..65535 (0 = any port)",
                                  field="network_policy")


def _page_cursor(page_token: str) -> str:
    """The last sandbox id of the previous page, from a next_page_token this service issued."""
    try:
        after = base64.b64decode(page_token.encode(), altchars=b"-_", validate=True).decode()
    except ValueError:
        after = ""
    if not SANDBOX_ID.match(after):
        raise InvalidArgument("page_token is not one this service issued; pass the next_page_token of the "
                              "previous page, or none for the first", field="page_token")
    return after


class SandboxManager:
    """Owns every sandbox and exec of one env service."""

    def __init__(self, settings: EnvSettings, backend: SandboxBackend) -> None:
        self.settings = settings
        self.backend = backend
        self.sandboxes: dict[str, Sandbox] = {}
        self.execs: dict[str, Exec] = {}
        self._queued = 0  # execs in state QUEUED, kept as a count: StartExec must not scan every exec
        self._ptys = 0  # terminal sessions open
        self._gone: OrderedDict[str, tuple[str, str]] = OrderedDict()  # id -> (tenant, why it ended)
        self._by_request: dict[tuple[str, str], str] = {}  # (tenant, request_id) -> sandbox id
        self._records = settings.state_dir / "records"
        self._create_slots = asyncio.Semaphore(settings.max_concurrent_creates)
        self._exec_slots = asyncio.Semaphore(settings.max_concurrent_execs)
        self._tasks: set[asyncio.Task[None]] = set()
        self._deleting: dict[str, asyncio.Task[None]] = {}
        self._sweeper: asyncio.Task[None] | None = None
        self.files = FileOps(self)
        self.snapshots = Snapshots(self)

    @property
    def queued_execs(self) -> int:
        """Commands waiting for their sandbox's earlier commands or a global slot."""
        return self._queued

    # ---- lifecycle of the manager ----

    async def start(self) -> None:
        """Learn which sandboxes a previous run left (their backend already removed them), then sweep."""
        self._records.mkdir(parents=True, exist_ok=True)
        for record in self._records.glob("*.json"):
            try:
                data = json.loads(record.read_text())
                self._gone[data["sandbox_id"]] = (data["tenant"], "ended when the env service restarted: the previous "
                                                  "service process stopped without deleting it")
            except (OSError, ValueError, KeyError):
                log.warning("unreadable sandbox record %s", record)
            record.unlink(missing_ok=True)
        self._sweeper = asyncio.create_task(self._sweep_forever(), name="env-sweeper")

    async def close(self) -> None:
        """Stop sweeping, cancel running commands, and destroy every sandbox (every tenant's)."""
        tenancy.set_tenant(tenancy.SYSTEM)
        if self._sweeper is not None:
            self._sweeper.cancel()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await asyncio.gather(*(self.delete_sandbox(sid, reason="the env service stopped")
                               for sid in list(self.sandboxes)), return_exceptions=True)
        await self.backend.close()

    def _spawn(self, coro: object, name: str) -> None:
        task = asyncio.create_task(coro, name=name)  # type: ignore[arg-type]
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # ---- sandboxes ----

    def get_sandbox(self, sandbox_id: str) -> Sandbox:
        """The sandbox, if the current tenant may see it; another tenant's is NOT_FOUND, so ids don't leak."""
        sandbox = self.sandboxes.get(sandbox_id)
        if sandbox is None or not tenancy.may_access(sandbox.tenant):
            gone = self._gone.get(sandbox_id)
            if sandbox is None and gone is not None and tenancy.may_access(gone[0]):
                raise NotFound(f"sandbox {sandbox_id!r} not found ({gone[1]})")
            raise NotFound(f"sandbox {sandbox_id!r} not found")
        return sandbox

    def ready_sandbox(self, sandbox_id: str) -> Sandbox:
        sandbox = self.get_sandbox(sandbox_id)
        if sandbox.state is not SandboxState.READY or sandbox.client is None:
            detail = f": {sandbox.failure_reason}" if sandbox.failure_reason else ""
            raise FailedPrecondition(f"sandbox {sandbox_id!r} is {sandbox.state.name.lower()}{detail}")
        return sandbox

    async def create_sandbox(self, req: CreateRequest) -> Sandbox:
        """Create a sandbox and return it ready; a retry with the same request_id returns the same one."""
        tenant = tenancy.current_tenant()
        if req.request_id and (tenant, req.request_id) in self._by_request:
            sandbox = self.get_sandbox(self._by_request[tenant, req.request_id])
            await sandbox.ready.wait()
            return sandbox
        s = self.settings
        snapshot = self.snapshots.get(req.from_snapshot, field="from_snapshot") if req.from_snapshot else None
        image = req.image or (snapshot.image if snapshot else "")
        if not image:
            raise InvalidArgument("image is required, e.g. 'python:3.11-slim' or 'host'", field="image")
        if snapshot is not None and image != snapshot.image:
            raise InvalidArgument(f"image {image!r} is not the image of snapshot {snapshot.snapshot_id!r} "
                                  f"({snapshot.image!r}); leave image empty to use the snapshot's", field="image")
        if req.sandbox_id and not SANDBOX_ID.match(req.sandbox_id):
            raise InvalidArgument(f"sandbox_id {req.sandbox_id!r} must be 1-63 lowercase letters, digits or '-', "
                                  "starting and ending with a letter or digit", field="sandbox_id")
        if req.sandbox_id in self.sandboxes:
            raise AlreadyExists(f"sandbox {req.sandbox_id!r} already exists", field="sandbox_id")
        if req.ttl_s < 0 or req.ttl_s > s.max_ttl_s:
            raise InvalidArgument(f"ttl must be between 0 and {s.max_ttl_s:g}s", field="ttl")
        if req.heartbeat_timeout_s < 0:
            raise InvalidArgument("heartbeat_timeout must not be negative", field="heartbeat_timeout")
        for key in list(req.env) + list(req.labels):
            if not key or "=" in key or "\x00" in key:
                raise InvalidArgument(f"invalid env or label key {key!r}", field="env")
        for key, value in req.env.items():
            if "\x00" in value:
                raise InvalidArgument(f"env variable {key!r} contains a NUL byte", field="env")
        check_egress(req.egress)
        workdir = req.workdir or "/workspace"
        if not workdir.startswith("/"):
            raise InvalidArgument(f"workdir {workdir!r} must be an absolute path", field="workdir")
        if len(self.sandboxes) >= s.max_sandboxes:
            raise ResourceExhausted(f"the service already holds {s.max_sandboxes} sandboxes (its limit); "
                                    "delete some or retry later", retry_after=5.0)
        r = req.resources
        resources = Resources(r.cpu_millis or s.default_cpu_millis, r.memory_bytes or s.default_memory_bytes,
                              r.pids or s.default_pids, r.disk_bytes or s.default_disk_bytes)
        sandbox = Sandbox(
            sandbox_id=req.sandbox_id or f"sb-{uuid.uuid4().hex[:12]}",
            image=image, workdir=posixpath.normpath(workdir), env=dict(req.env), labels=dict(req.labels),
            resources=resources, egress=req.egress, ttl_s=req.ttl_s or s.default_ttl_s,
            heartbeat_timeout_s=req.heartbeat_timeout_s, request_id=req.request_id, tenant=tenant,
            from_snapshot=req.from_snapshot, layers=snapshot.layers if snapshot else (),
        )
        self.sandboxes[sandbox.sandbox_id] = sandbox
        if req.request_id:
            self._by_request[tenant, req.request_id] = sandbox.sandbox_id
        spec = SandboxSpec(sandbox_id=sandbox.sandbox_id, image=sandbox.image, workdir=sandbox.workdir,
                           env=sandbox.env, resources=sandbox.resources, egress=sandbox.egress,
                           layers=sandbox.layers)
        try:
            async with self._create_slots:
                sandbox.client = await self.backend.create(spec)
        except BaseException:
            self.sandboxes.pop(sandbox.sandbox_id, None)
            self._by_request.pop((tenant, req.request_id), None)
            sandbox.state = SandboxState.FAILED
            sandbox.ready.set()
            await self.snapshots.collect()  # the snapshot may have been deleted meanwhile
            raise
        sandbox.state = SandboxState.READY
        sandbox.ready.set()
        metrics.SANDBOXES_CREATED.inc()
        # A record on disk, so that after a crash the next run can say what became of this sandbox.
        (self._records / f"{sandbox.sandbox_id}.json").write_text(json.dumps(
            {"sandbox_id": sandbox.sandbox_id, "tenant": sandbox.tenant, "create_time": sandbox.create_time}))
        log.info("sandbox created", extra={"sandbox_id": sandbox.sandbox_id, "image": sandbox.image})
        return sandbox

    def list_sandboxes(self, label_selector: Mapping[str, str], page_size: int,
                       page_token: str) -> tuple[list[Sandbox], str]:
        if page_size < 0:
            raise InvalidArgument("page_size must not be negative", field="page_size")
        size = min(page_size or 100, 1000)
        after = _page_cursor(page_token) if page_token else ""
        matching = sorted(
            (sb for sb in self.sandboxes.values()
             if sb.sandbox_id > after and tenancy.may_access(sb.tenant)
             and all(sb.labels.get(k) == v for k, v in label_selector.items())),
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
        task = self._deleting.get(sandbox_id)
        if task is None:
            task = asyncio.create_task(self._delete(sandbox, reason), name=f"delete-{sandbox_id}")
            self._deleting[sandbox_id] = task
            task.add_done_callback(lambda _: self._deleting.pop(sandbox_id, None))
        await asyncio.shield(task)
        return sandbox

    async def _delete(self, sandbox: Sandbox, reason: str) -> None:
        sandbox_id = sandbox.sandbox_id
        await sandbox.ready.wait()
        sandbox.state = SandboxState.DELETING
        for ex in self.execs.values():
            if ex.sandbox_id == sandbox_id and not ex.state.done:
                await self._finish(ex, ExecState.CANCELLED, error=f"the sandbox was {reason}")
        try:
            await self.backend.destroy(sandbox_id)
        finally:
            sandbox.state = SandboxState.DELETED
            self.sandboxes.pop(sandbox_id, None)
            self._by_request.pop((sandbox.tenant, sandbox.request_id), None)
            self._gone[sandbox_id] = (sandbox.tenant, reason)
            (self._records / f"{sandbox_id}.json").unlink(missing_ok=True)
            metrics.SANDBOXES_ENDED.labels(metrics.reason_kind(reason)).inc()
            while len(self._gone) > TOMBSTONES:
                self._gone.popitem(last=False)
        await self.snapshots.collect()  # the layers of deleted snapshots this sandbox stacked may go now
        log.info("sandbox deleted", extra={"sandbox_id": sandbox_id, "reason": reason})

    async def set_network_policy(self, sandbox_id: str, egress: tuple[EgressRule, ...]) -> Sandbox:
        """Replace a ready sandbox's egress allowlist; returns the sandbox with the new policy in force."""
        sandbox = self.ready_sandbox(sandbox_id)
        check_egress(egress)
        async with sandbox.policy_lock:
            await self.backend.set_egress(sandbox_id, egress)
            sandbox.egress = egress
        log.info("network policy set", extra={"sandbox_id": sandbox_id, "rules": len(egress)})
        return sandbox

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
        expired = [sb for sb in self.sandboxes.values()
                   if sb.expire_time <= now and sb.state in (SandboxState.READY, SandboxState.FAILED)]
        await asyncio.gather(*(self.delete_sandbox(sb.sandbox_id, reason=sb.expiry_reason()) for sb in expired),
                             return_exceptions=True)
        horizon = now - self.settings.exec_retention_s
        for exec_id in [e.exec_id for e in self.execs.values()
                        if e.state.done and e.end_time is not None and e.end_time < horizon]:
            del self.execs[exec_id]

    # ---- commands ----

    def get_exec(self, exec_id: str) -> Exec:
        ex = self.execs.get(exec_id)
        if ex is None or not tenancy.may_access(ex.tenant):
            raise NotFound(f"exec {exec_id!r} not found (finished commands are kept "
                           f"{self.settings.exec_retention_s:g}s)")
        return ex

    def start_exec(self, req: ExecRequest) -> Exec:
        """Queue a command behind the sandbox's earlier ones and return it at once."""
        s = self.settings
        sandbox = self.ready_sandbox(req.sandbox_id)
        if req.argv is not None:
            if not req.argv:
                raise InvalidArgument("argv must not be empty", field="argv")
            command = shlex.join(req.argv)
        elif req.shell:
            command = req.shell
        else:
            raise InvalidArgument("a command is required: set argv or shell", field="command")
        if "\x00" in command:
            raise InvalidArgument("the command contains a NUL byte", field="command")
        for key, value in (req.env or {}).items():
            if not key or "=" in key or "\x00" in key or "\x00" in value:
                raise InvalidArgument(f"invalid env variable {key!r}: names must be non-empty without '=' and "
                                      "neither names nor values may contain a NUL byte", field="env")
        if req.timeout_s < 0 or req.timeout_s > s.max_exec_timeout_s:
            raise InvalidArgument(f"timeout must be between 0 and {s.max_exec_timeout_s:g}s", field="timeout")
        if req.max_output < 0 or req.max_output > s.max_output_bytes:
            raise InvalidArgument(f"max_output_bytes must be between 0 and {s.max_output_bytes}",
                                  field="max_output_bytes")
        if self._queued >= s.max_queued_execs:
            raise ResourceExhausted(f"{self._queued} commands are already waiting; retry later", retry_after=1.0)
        ex = Exec(
            exec_id=f"ex-{uuid.uuid4().hex[:16]}", sandbox_id=sandbox.sandbox_id, command=command,
            argv=["bash", "-lc" if req.login_shell else "-c", command],
            cwd=resolve_path(sandbox.workdir, req.cwd), env=dict(req.env or {}), stdin=req.stdin,
            timeout_s=req.timeout_s or s.default_exec_timeout_s, max_output=req.max_output or s.default_output_bytes,
            tenant=sandbox.tenant,
        )
        self.execs[ex.exec_id] = ex
        self._queued += 1
        self._spawn(self._run(sandbox, ex), name=f"exec-{ex.exec_id}")
        return ex

    async def _run(self, sandbox: Sandbox, ex: Exec) -> None:
        async with sandbox.exec_order, self._exec_slots:
            if ex.state.done or sandbox.client is None:
                return
            ex.state = ExecState.RUNNING
            self._queued -= 1
            ex.start_time = time.time()
            oom_kills = await self.backend.oom_kills(sandbox.sandbox_id)
            try:
                async for event in sandbox.client.exec(
                    ex.argv, cwd=ex.cwd, env=ex.env, stdin=ex.stdin, timeout=ex.timeout_s,
                    max_output=ex.max_output, on_id=lambda rid: setattr(ex, "agent_id", rid),
                ):
                    if event.kind == "out":
                        ex.chunks.append((event.fd, event.data))
                        await ex.notify()
                    elif event.kind == "exit":
                        ex.totals = event.totals
                        ex.exit_code = event.exit_code
                        ex.oom_killed = ex.exit_code != 0 and \
                            await self.backend.oom_kills(sandbox.sandbox_id) > oom_kills
                        state, error = self._outcome(ex, event.reason, event.error, sandbox.resources.memory_bytes)
                        await self._finish(ex, state, error=error)
            except OrchardError as err:
                if isinstance(err, Unavailable) and sandbox.state is SandboxState.READY:
                    reason = err.message
                    if await self.backend.oom_kills(sandbox.sandbox_id) > oom_kills:
                        reason = (f"the sandbox ran out of memory (limit {sandbox.resources.memory_bytes >> 20} MiB) "
                                  "and the kernel killed its agent")
                    self.mark_failed(sandbox, reason)
                await self._finish(ex, ExecState.FAILED, error=err.message)
            except asyncio.CancelledError:
                await self._finish(ex, ExecState.CANCELLED, error="the env service stopped")
                raise

    def _outcome(self, ex: Exec, reason: str | None, error: str | None, memory_bytes: int) -> tuple[ExecState, str]:
        if error:
            return ExecState.FAILED, error
        if reason == "timeout":
            return ExecState.TIMED_OUT, f"command timed out after {ex.timeout_s:g}s; its whole process tree was killed"
        if reason:
            return ExecState.CANCELLED, f"command {reason}; its whole process tree was killed"
        if ex.oom_killed:
            limit = f"limit {memory_bytes / (1 << 20):g} MiB" if memory_bytes else "no limit: the machine ran out"
            return ExecState.FAILED, (f"command ran out of memory ({limit}) and the kernel killed it; use less memory "
                                      "or create the sandbox with a larger resources.memory_bytes")
        return (ExecState.SUCCEEDED if ex.exit_code == 0 else ExecState.FAILED), ""

    async def _finish(self, ex: Exec, state: ExecState, *, error: str = "") -> None:
        if ex.state.done:
            return
        if ex.state is ExecState.QUEUED:
            self._queued -= 1
        ex.state, ex.error = state, error
        ex.end_time = time.time()
        ex.ended.set()
        metrics.observe_exec(ex)
        await ex.notify()

    async def wait_exec(self, exec_id: str, timeout_s: float) -> Exec:
        """Wait until the exec ends or timeout_s (capped by max_wait_s) passes; return it either way."""
        ex = self.get_exec(exec_id)
        if timeout_s < 0:
            raise InvalidArgument("timeout must not be negative", field="timeout")
        limit = min(timeout_s or self.settings.max_wait_s, self.settings.max_wait_s)
        try:
            async with asyncio.timeout(limit):
                await ex.ended.wait()
        except TimeoutError:
            pass
        return ex

    async def stream_exec(self, exec_id: str) -> AsyncIterator[tuple[int, bytes]]:
        """Yield (fd, chunk) from the first byte on, as they come, until the exec ends."""
        ex = self.get_exec(exec_id)
        sent = 0
        while True:
            async with ex.changed:
                await ex.changed.wait_for(lambda: len(ex.chunks) > sent or ex.state.done)
            while sent < len(ex.chunks):
                yield ex.chunks[sent]
                sent += 1
            if ex.state.done and sent == len(ex.chunks):
                return

    async def cancel_exec(self, exec_id: str) -> Exec:
        ex = self.get_exec(exec_id)
        if ex.state is ExecState.QUEUED:
            await self._finish(ex, ExecState.CANCELLED, error="cancelled before it started")
        elif ex.state is ExecState.RUNNING:
            sandbox = self.sandboxes.get(ex.sandbox_id)
            if sandbox is not None and sandbox.client is not None and ex.agent_id is not None:
                await sandbox.client.cancel(ex.agent_id, "cancelled")
            try:
                async with asyncio.timeout(10):
                    await ex.ended.wait()
            except TimeoutError:
                raise Unavailable(f"exec {exec_id!r} did not confirm its cancellation within 10s; its sandbox "
                                  "may be unhealthy: check it with GetSandbox, or delete it") from None
        return ex

    @contextlib.asynccontextmanager
    async def open_pty(self, sandbox_id: str, argv: Sequence[str] = (), rows: int = 0, cols: int = 0, cwd: str = "",
                       env: Mapping[str, str] | None = None) -> AsyncIterator[PtySession]:
        """Run argv (an interactive bash when empty) on a terminal of rows x cols (0: 24 x 80) for as long as
        the caller stays in the block; leaving it kills the program's whole process tree.

        A session is long-lived and mostly idle, so it neither waits behind the sandbox's commands nor takes
        one of the max_concurrent_execs slots (it would starve them); max_pty_sessions bounds sessions instead.
        The sandbox's deletion ends its sessions with Unavailable.
        """
        sandbox = self.ready_sandbox(sandbox_id)
        argv = list(argv) or list(DEFAULT_PTY_ARGV)
        if any("\x00" in arg for arg in argv):
            raise InvalidArgument("argv contains a NUL byte", field="argv")
        for key, value in (env or {}).items():
            if not key or "=" in key or "\x00" in key or "\x00" in value:
                raise InvalidArgument(f"invalid env variable {key!r}: names must be non-empty without '=' and "
                                      "neither names nor values may contain a NUL byte", field="env")
        rows, cols = terminal_size(rows or 24, cols or 80)
        if self._ptys >= self.settings.max_pty_sessions:
            raise ResourceExhausted(f"{self._ptys} terminal sessions are already open (the service's limit); close "
                                    "some or retry later", retry_after=5.0)
        assert sandbox.client is not None
        session = await sandbox.client.open_pty(argv, cwd=resolve_path(sandbox.workdir, cwd), env=dict(env or {}),
                                                rows=rows, cols=cols)
        self._ptys += 1
        try:
            yield session
        finally:
            self._ptys -= 1
            await asyncio.shield(session.close())  # a second cancellation must not leave the program running

    async def run_to_end(self, sandbox_id: str, argv: list[str], *, stdin: bytes, cwd: str,
                         timeout_s: float) -> Exec:
        """Run an internal command in the sandbox's order and wait for it (patches use this)."""
        ex = self.start_exec(ExecRequest(sandbox_id=sandbox_id, shell=shlex.join(argv), stdin=stdin, cwd=cwd,
                                         timeout_s=timeout_s))
        await ex.ended.wait()
        return ex

    # ---- patches ----

    async def apply_patch(self, sandbox_id: str, patch: str, cwd: str, timeout_s: float) -> tuple[list[str], str]:
        """Apply a unified diff with `git apply` (all or nothing); returns the files and git's output."""
        if not patch.strip():
            raise InvalidArgument("patch is empty", field="patch")
        ex = await self.run_to_end(sandbox_id, ["git", "apply", "--verbose", "--numstat", "--apply", "-"],
                                   stdin=patch.encode(), cwd=cwd, timeout_s=timeout_s or PATCH_TIMEOUT_S)
        output = ex.output(2).decode(errors="replace").strip()
        if ex.state is not ExecState.SUCCEEDED:
            detail = output or ex.error or f"git apply exited with {ex.exit_code}"
            if ex.exit_code == 127:
                detail = "git is not installed in this sandbox's image"
            raise FailedPrecondition(f"patch does not apply; no file was changed: {detail}", field="patch")
        files = [line.split("\t", 2)[2] for line in ex.output(1).decode(errors="replace").splitlines()
                 if line.count("\t") >= 2]
        return files, output
