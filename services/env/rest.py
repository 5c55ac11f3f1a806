"""The REST gateway: the public Orchard Env HTTP API (what the upstream `orchard_env` SDK speaks) in front of
the same SandboxManager the gRPC servicer uses. Like servicer.py it translates, nothing else: JSON ↔ manager
calls, and OrchardErrors ↔ HTTP statuses in one place (`http_status`). Started by `orchard serve env
--http-port N`, in the gRPC server's process.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import logging
import math
import os
import socket
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime
from importlib.metadata import version

import grpc
from aiohttp import web

from orchard.errors import (
    DeadlineExceeded,
    FailedPrecondition,
    InvalidArgument,
    OrchardError,
    PermissionDenied,
    Unauthenticated,
)
from orchard.runtime import tenancy
from orchard.runtime.http import HttpSite
from orchard.services.env import rest_models as m
from orchard.services.env.backends.base import EgressRule
from orchard.services.env.commands import ExecRequest
from orchard.services.env.files import CHUNK
from orchard.services.env.manager import CreateRequest, SandboxManager
from orchard.services.env.models import Exec, ExecState, Sandbox, SandboxState
from orchard.services.env.rest_pty import serve_pty
from orchard.services.env.settings import EnvSettings

log = logging.getLogger("orchard.http")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

API_KEY_HEADER = "X-API-Key"
REQUEST_ID_HEADER = "X-Request-ID"
AUTH_EXEMPT_PATHS = frozenset({"/", "/health"})
# Upstream's defaults. cpu/memory are recorded (as labels) and echoed, not passed on as limits: upstream clients
# always send them, and the service's own defaults (default_cpu_millis ...) decide a sandbox's limits.
DEFAULT_CPU, DEFAULT_MEMORY, DEFAULT_READY_TIMEOUT_S = "4", "16Gi", 3600
CPU_LABEL, MEMORY_LABEL = "orchard.dev/requested-cpu", "orchard.dev/requested-memory"
OPEN_EGRESS = (EgressRule(cidr="0.0.0.0/0"),)  # block_network=false: all of IPv4 (sandbox links have no IPv6)
HEARTBEAT_TIMEOUT_S = 180.0  # upstream: once a sandbox got a heartbeat, 180 s without one reaps it
EXEC_WAIT_SLACK_S = 30.0  # upstream: exec with wait=true blocks up to the command's timeout + 30 s

SANDBOX_STATUS = {
    SandboxState.PENDING: "pending",
    SandboxState.READY: "ready",
    SandboxState.FAILED: "failed",
    SandboxState.DELETING: "deleting",
    SandboxState.DELETED: "deleted",
}
JOB_STATUS = {
    ExecState.QUEUED: "queued",
    ExecState.RUNNING: "running",
    ExecState.SUCCEEDED: "succeeded",
    ExecState.FAILED: "failed",
    ExecState.TIMED_OUT: "failed",
    ExecState.CANCELLED: "failed",
}

# The REST twin of the gRPC error interceptor. FAILED_PRECONDITION is 400 as in google.rpc.Code's HTTP mapping
# (and upstream's "sandbox not ready"); RESOURCE_EXHAUSTED is 503 because upstream clients retry 503 only.
_HTTP_STATUS = {
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.FAILED_PRECONDITION: 400,
    grpc.StatusCode.OUT_OF_RANGE: 400,
    grpc.StatusCode.UNAUTHENTICATED: 401,
    grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.DEADLINE_EXCEEDED: 408,
    grpc.StatusCode.ALREADY_EXISTS: 409,
    grpc.StatusCode.ABORTED: 409,
    grpc.StatusCode.CANCELLED: 499,
    grpc.StatusCode.UNIMPLEMENTED: 501,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 503,
    grpc.StatusCode.UNAVAILABLE: 503,
}


def http_status(err: OrchardError) -> int:
    """The HTTP status that reports err (500 for codes without a mapping)."""
    return _HTTP_STATUS.get(err.code, 500)


def error_response(status: int, detail: object, retry_after: float | None = None) -> web.Response:
    """A FastAPI-style error: {"detail": ...}, with Retry-After on 503."""
    response = web.json_response({"detail": detail}, status=status)
    if status == 503:
        response.headers["Retry-After"] = str(max(1, math.ceil(retry_after or 1)))
    return response


def _iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).isoformat(timespec="seconds")


def _request_id(request: web.Request) -> str:
    sent = request.headers.get(REQUEST_ID_HEADER, "")
    return sent if 0 < len(sent) <= 128 and sent.isprintable() else uuid.uuid4().hex[:16]


def _ws_key(request: web.Request) -> str | None:
    """A browser WebSocket cannot set headers: upstream takes ?api_key= or subprotocol `api_key.<key>`."""
    if request.query.get("api_key"):
        return request.query["api_key"]
    for proto in request.headers.get("Sec-WebSocket-Protocol", "").split(","):
        if proto.strip().startswith("api_key."):
            return proto.strip()[len("api_key.") :]
    return None


class HttpGateway:
    """aiohttp server for the upstream-compatible REST API, over one SandboxManager."""

    def __init__(self, manager: SandboxManager, settings: EnvSettings) -> None:
        self.manager = manager
        self.settings = settings
        self._site = HttpSite()
        # A download answers base64 in one JSON body: keep that body within the service's message bound.
        self._max_download = settings.max_message_bytes * 3 // 4
        self._tokens = settings.auth_tokens()  # token -> tenant; empty when auth is off

    @property
    def port(self) -> int:
        """The bound HTTP port (useful with http_port=0); only valid after `start`."""
        return self._site.port

    async def start(self) -> int:
        """Listen on settings.host:http_port; returns the bound port."""
        app = web.Application(client_max_size=self.settings.max_message_bytes, middlewares=[self._middleware])
        r = app.router
        r.add_get("/", self.banner)
        r.add_get("/health", self.health)
        r.add_get("/resources", self.resources)
        r.add_post("/sandboxes", self.create_sandbox)
        r.add_get("/sandboxes/{sandbox_id}", self.get_sandbox)
        r.add_delete("/sandboxes/{sandbox_id}", self.delete_sandbox)
        r.add_get("/sandboxes/{sandbox_id}/wait", self.wait_sandbox)
        r.add_post("/sandboxes/{sandbox_id}/heartbeat", self.heartbeat)
        r.add_post("/sandboxes/{sandbox_id}/exec", self.exec)
        r.add_get("/sandboxes/{sandbox_id}/exec/pty", self.pty)
        r.add_post("/sandboxes/{sandbox_id}/apply_patch", self.apply_patch)
        r.add_post("/sandboxes/{sandbox_id}/files", self.upload)
        r.add_get("/sandboxes/{sandbox_id}/files", self.download)
        r.add_get("/sandboxes/{sandbox_id}/files/list", self.list_files)
        r.add_get("/jobs/{job_id}", self.get_job)
        r.add_get("/jobs/{job_id}/wait", self.wait_job)
        port = await self._site.start(
            app, self.settings.host, self.settings.http_port or 0, self.settings.grace_period_s
        )
        log.info(
            "env REST gateway listening on http://%s:%d",
            self.settings.host,
            port,
            extra={"service": "env", "http_port": port, "auth": self.settings.auth_enabled},
        )
        return port

    async def stop(self) -> None:
        """Stop accepting, let requests in flight finish for grace_period_s, then close; safe to repeat."""
        if await self._site.stop():
            log.info("env REST gateway stopped", extra={"service": "env"})

    # ---- errors, auth and the per-request log line ----

    @web.middleware
    async def _middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        request_id = _request_id(request)
        started = time.monotonic()
        error: str | None = None
        response: web.StreamResponse
        try:
            self._check_auth(request)
            response = await handler(request)
        except web.HTTPException as exc:  # aiohttp's own: no such route (404), method (405), body too big (413)
            error = exc.reason if (exc.text or "").startswith(f"{exc.status}:") else exc.text or exc.reason
            response = error_response(exc.status, error)
        except m.Unprocessable as exc:
            error = str(exc)
            response = error_response(422, exc.errors)
        except OrchardError as err:
            error = err.message
            response = error_response(http_status(err), err.message, err.retry_after)
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
            log.error(
                "unexpected error in %s %s (request id %s)",
                request.method,
                request.path,
                request_id,
                exc_info=exc,
                extra={"request_id": request_id},
            )
            response = error_response(500, f"internal error (request id {request_id})")
        if not response.prepared:
            response.headers[REQUEST_ID_HEADER] = request_id
        resource = request.match_info.route.resource
        route = resource.canonical if resource is not None else request.path
        fields: dict[str, object] = {
            "method": request.method,
            "route": route,
            "status": response.status,
            "duration_ms": round((time.monotonic() - started) * 1000, 2),
            "request_id": request_id,
        }
        if error is not None:
            fields["error"] = error
        level = logging.DEBUG if route == "/health" else logging.INFO
        log.log(level, "http %s %s %d", request.method, route, response.status, extra=fields)
        return response

    def _check_auth(self, request: web.Request) -> None:
        """With auth on, the key must be a known token; the request then runs as that token's tenant."""
        if not self._tokens or request.path in AUTH_EXEMPT_PATHS:
            return
        sent = request.headers.get(API_KEY_HEADER)
        if sent is None and request.headers.get("Upgrade", "").lower() == "websocket":
            sent = _ws_key(request)
        if sent is None:
            raise Unauthenticated(f"missing API key; send the env service's auth token as '{API_KEY_HEADER}: <token>'")
        tenant = tenancy.tenant_of(sent, self._tokens)
        if tenant is None:
            raise PermissionDenied(f"invalid API key in {API_KEY_HEADER}; check the token this env service runs with")
        tenancy.set_tenant(tenant)

    # ---- service ----

    async def banner(self, request: web.Request) -> web.Response:
        return web.json_response({"service": "orchard-env", "version": version("orchard"), "status": "running"})

    async def health(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "healthy"})

    async def resources(self, request: web.Request) -> web.Response:
        """This host's capacity and the sandboxes' limits, in upstream's cluster-summary shape."""
        cpu = float(os.cpu_count() or 1)
        memory = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        sandboxes = [sb for sb in self.manager.sandboxes.values() if tenancy.may_access(sb.tenant)]
        requested_cpu = sum(sb.resources.cpu_millis for sb in sandboxes) / 1000
        requested_memory = sum(sb.resources.memory_bytes for sb in sandboxes)
        capacity = {"cpu": cpu, "memory_bytes": memory}
        return web.json_response(
            {
                "status": "ok",
                "backend": self.manager.backend.name,
                "nodes": [{"name": socket.gethostname(), "capacity": capacity, "allocatable": capacity}],
                "total_capacity": capacity,
                "total_allocatable": capacity,
                "total_requested": {"cpu": requested_cpu, "memory_bytes": requested_memory},
                "available": {"cpu": max(cpu - requested_cpu, 0.0), "memory_bytes": max(memory - requested_memory, 0)},
                "sandbox_pods": [{"name": sb.sandbox_id, "status": SANDBOX_STATUS[sb.state]} for sb in sandboxes],
                "max_sandboxes": self.settings.max_sandboxes,
                "max_concurrent_execs": self.settings.max_concurrent_execs,
            }
        )

    # ---- sandboxes ----

    def _sandbox(self, sb: Sandbox) -> m.SandboxResponse:
        return m.SandboxResponse(
            sandbox_id=sb.sandbox_id,
            namespace=self.manager.backend.name,
            image=sb.image,
            block_network=not sb.egress,
            cpu=sb.labels.get(CPU_LABEL, ""),
            memory=sb.labels.get(MEMORY_LABEL, ""),
            created_at=sb.create_time,
            ready=sb.state is SandboxState.READY,
            status=SANDBOX_STATUS[sb.state],
            status_message=sb.failure_reason,
        )

    async def create_sandbox(self, request: web.Request) -> web.Response:
        """Create and answer once ready (local creates take ~0.1 s): status is "ready", and /wait returns at once."""
        body = await m.parse_body(request, m.CreateSandboxBody)
        cpu, memory = body.cpu or DEFAULT_CPU, body.memory or DEFAULT_MEMORY
        try:
            sandbox = await self.manager.create_sandbox(
                CreateRequest(
                    image=body.image,
                    env={},
                    labels={CPU_LABEL: cpu, MEMORY_LABEL: memory},
                    egress=() if body.block_network else OPEN_EGRESS,
                    sandbox_id=body.sandbox_id or "",
                )
            )
        except FailedPrecondition as err:
            if body.block_network:
                raise
            raise FailedPrecondition(
                f"{err.message} (this request had block_network=false; send "
                "block_network=true for a sandbox without network)",
                field=err.field,
            ) from err
        return m.respond(
            m.CreateSandboxResponse(
                sandbox_id=sandbox.sandbox_id,
                namespace=self.manager.backend.name,
                image=sandbox.image,
                block_network=not sandbox.egress,
                cpu=cpu,
                memory=memory,
                timeout=body.timeout or DEFAULT_READY_TIMEOUT_S,
                status=SANDBOX_STATUS[sandbox.state],
            )
        )

    async def get_sandbox(self, request: web.Request) -> web.Response:
        return m.respond(self._sandbox(self.manager.get_sandbox(request.match_info["sandbox_id"])))

    async def wait_sandbox(self, request: web.Request) -> web.Response:
        query = m.parse_query(request, m.SandboxWaitQuery)
        sandbox = self.manager.get_sandbox(request.match_info["sandbox_id"])
        try:
            async with asyncio.timeout(query.timeout):
                await sandbox.ready.wait()
        except TimeoutError:
            raise DeadlineExceeded(
                f"sandbox {sandbox.sandbox_id!r} is still {SANDBOX_STATUS[sandbox.state]} after "
                f"{query.timeout:g}s; wait again"
            ) from None
        return m.respond(self._sandbox(sandbox))

    async def delete_sandbox(self, request: web.Request) -> web.Response:
        sandbox = await self.manager.delete_sandbox(request.match_info["sandbox_id"])
        return web.json_response({"status": "deleted", "sandbox_id": sandbox.sandbox_id})

    async def heartbeat(self, request: web.Request) -> web.Response:
        sandbox = self.manager.heartbeat(request.match_info["sandbox_id"])
        if sandbox.heartbeat_timeout_s == 0:
            # Upstream reaps only sandboxes whose heartbeats *stopped*: clients that never send one (its SDK
            # by default) live out their TTL. So the first heartbeat arms the timeout.
            sandbox.heartbeat_timeout_s = HEARTBEAT_TIMEOUT_S
        return web.json_response({"status": "ok", "sandbox_id": sandbox.sandbox_id})

    # ---- commands (jobs) ----

    async def _job(self, ex: Exec) -> m.JobResponse:
        error: str | None = ex.error or None
        if ex.state is ExecState.CANCELLED and "cancel" not in ex.error:
            error = f"cancelled: {ex.error}"
        return m.JobResponse(
            job_id=ex.exec_id,
            sandbox_id=ex.sandbox_id,
            command=ex.command,
            status=JOB_STATUS[ex.state],
            stdout=(await ex.output(1)).decode(errors="replace"),
            stderr=(await ex.output(2)).decode(errors="replace"),
            exit_code=ex.exit_code if ex.state.done and ex.exit_code != -1 else None,
            created_at=ex.create_time,
            started_at=ex.start_time,
            completed_at=ex.end_time,
            error=error,
            stdout_truncated=ex.truncated(1),
            stderr_truncated=ex.truncated(2),
        )

    async def _wait(self, exec_id: str, seconds: float) -> Exec:
        """Wait up to seconds for the exec to end, as manager waits of at most max_wait_s each."""
        deadline = time.monotonic() + seconds
        ex = self.manager.commands.get_exec(exec_id)
        while not ex.state.done and (remaining := deadline - time.monotonic()) > 0:
            ex = await self.manager.commands.wait_exec(exec_id, remaining)
        return ex

    async def exec(self, request: web.Request) -> web.Response:
        body = await m.parse_body(request, m.ExecBody)
        argv = body.command if isinstance(body.command, list) else None
        ex = self.manager.commands.start_exec(
            ExecRequest(
                sandbox_id=request.match_info["sandbox_id"],
                argv=argv,
                shell=None if argv is not None else body.command,
                cwd=body.cwd or "",
                env=body.env or {},
                timeout_s=body.timeout_seconds or 0.0,
                login_shell=body.login_shell,
            )
        )
        if not body.wait:
            return m.respond(m.ExecResponse(job_id=ex.exec_id, status=JOB_STATUS[ex.state]))
        # Not done in time: the job as it stands ("queued"/"running"); upstream clients then poll it.
        return m.respond(await self._job(await self._wait(ex.exec_id, ex.timeout_s + EXEC_WAIT_SLACK_S)))

    async def get_job(self, request: web.Request) -> web.Response:
        return m.respond(await self._job(self.manager.commands.get_exec(request.match_info["job_id"])))

    async def wait_job(self, request: web.Request) -> web.Response:
        query = m.parse_query(request, m.WaitQuery)
        ex = await self._wait(request.match_info["job_id"], query.timeout)
        if not ex.state.done:
            raise DeadlineExceeded(
                f"job {ex.exec_id!r} is still {JOB_STATUS[ex.state]} after {query.timeout:g}s; "
                f"wait again or poll GET /jobs/{ex.exec_id}"
            )
        return m.respond(await self._job(ex))

    async def pty(self, request: web.Request) -> web.WebSocketResponse:
        return await serve_pty(request, self.manager, http_status)

    # ---- patches and files ----

    async def apply_patch(self, request: web.Request) -> web.Response:
        body = await m.parse_body(request, m.ApplyPatchBody)
        try:
            _, output = await self.manager.commands.apply_patch(
                request.match_info["sandbox_id"], body.patch, "", body.timeout_seconds
            )
        except FailedPrecondition as err:
            if err.field != "patch":
                raise
            # A patch that does not apply is data, as upstream: nothing was changed, and git says why.
            return m.respond(m.ApplyPatchResponse(success=False, stderr=err.message, error=err.message))
        return m.respond(m.ApplyPatchResponse(success=True, stderr=output, exit_code=0))

    async def upload(self, request: web.Request) -> web.Response:
        body = await m.parse_body(request, m.UploadBody)
        try:  # off the event loop: a body may be tens of MiB
            data = await asyncio.to_thread(lambda: base64.b64decode("".join(body.content.split()), validate=True))
        except binascii.Error as err:
            raise InvalidArgument(f"content is not valid base64 ({err})", field="content") from None

        async def chunks() -> AsyncIterator[bytes]:
            for start in range(0, len(data), CHUNK):
                yield data[start : start + CHUNK]

        path, size = await self.manager.files.upload(request.match_info["sandbox_id"], body.path, 0, chunks())
        return m.respond(m.UploadFileResponse(success=True, path=path, size=size))

    async def download(self, request: web.Request) -> web.Response:
        query = m.parse_query(request, m.DownloadQuery)
        info, content = await self.manager.files.download(request.match_info["sandbox_id"], query.path)
        data = bytearray()
        if info.size <= self._max_download:
            async for chunk in content:
                data += chunk
                if len(data) > self._max_download:
                    break
        if len(data) > self._max_download or info.size > self._max_download:
            raise FailedPrecondition(
                f"{info.path} is {max(info.size, len(data))} bytes; downloads through the REST "
                f"gateway stop at {self._max_download} (use the gRPC DownloadFile stream)",
                field="path",
            )
        return await asyncio.to_thread(
            lambda: m.respond(
                m.DownloadFileResponse(path=info.path, content=base64.b64encode(data).decode(), size=len(data))
            )
        )

    async def list_files(self, request: web.Request) -> web.Response:
        query = m.parse_query(request, m.PathQuery)
        path, files = await self.manager.files.list(request.match_info["sandbox_id"], query.path)
        return m.respond(
            m.ListFilesResponse(
                path=path,
                files=[
                    m.FileEntry(
                        name=f.name,
                        type="directory" if f.type == "directory" else "file",
                        size=f.size,
                        modified=_iso(f.mtime),
                    )
                    for f in files
                ],
            )
        )
