"""Wire shapes of the upstream-compatible REST gateway (rest.py): the public Orchard Env HTTP API's
request and response bodies, field for field, so code written for the upstream `orchard_env` SDK works,
and their parsing (a mismatch is 422 with pydantic's errors, as FastAPI answers).

Unknown request fields are ignored (as upstream's FastAPI models do), so newer clients keep working.
"""

from __future__ import annotations

import asyncio
import re
from typing import TypeVar

from aiohttp import web
from pydantic import AliasChoices, BaseModel, ConfigDict, Field, ValidationError, field_validator

M = TypeVar("M", bound=BaseModel)
BIG_BODY = 1 << 20


class Unprocessable(Exception):
    """A body or query that does not match its model: 422 with pydantic's errors, as FastAPI answers."""

    def __init__(self, err: ValidationError, where: str) -> None:
        # No "input": it could echo a whole base64 upload back (and bytes that are not UTF-8 do not serialize).
        self.errors = [
            {"type": e["type"], "loc": [where, *e["loc"]], "msg": e["msg"]}
            for e in err.errors(include_url=False, include_input=False, include_context=False)
        ]
        super().__init__("; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in self.errors))


async def parse_body(request: web.Request, model: type[M]) -> M:
    """The request's JSON body as model; Unprocessable when it does not match."""
    raw = await request.read()  # over client_max_size: aiohttp raises 413
    try:
        if len(raw) > BIG_BODY:  # an upload of some size parses off the event loop
            return await asyncio.to_thread(model.model_validate_json, raw)
        return model.model_validate_json(raw)
    except ValidationError as err:
        raise Unprocessable(err, "body") from None


def parse_query(request: web.Request, model: type[M]) -> M:
    """The request's query parameters as model; Unprocessable when they do not match."""
    try:
        return model.model_validate(dict(request.query))
    except ValidationError as err:
        raise Unprocessable(err, "query") from None


def respond(model: BaseModel) -> web.Response:
    """A 200 JSON response of model."""
    return web.Response(body=model.model_dump_json(), content_type="application/json")


class _Request(BaseModel):
    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)


CPU = re.compile(r"^(?:\d+(?:\.\d+)?|\d+m)$")
"""A Kubernetes CPU quantity: cores ('4', '0.5') or millicores ('2000m')."""
MEMORY = re.compile(r"^\d+(?:\.\d+)?(?:[KMGTPE]i?|k)?$")
"""A Kubernetes memory quantity: bytes, or with a suffix ('16Gi', '512M')."""


def _quantity(value: str | None, pattern: re.Pattern[str], example: str) -> str | None:
    if value is not None and (not pattern.match(value) or float(re.sub(r"[a-zA-Z]+$", "", value)) <= 0):
        raise ValueError(f"{value!r} is not a positive quantity, e.g. {example}")
    return value


# ---- requests ----


class CreateSandboxBody(_Request):
    """POST /sandboxes."""

    image: str
    """Image to run, e.g. 'python:3.11-slim' or 'host'."""
    block_network: bool = True
    """No network egress; false asks the backend for IPv4 egress."""
    sandbox_id: str | None = None
    """Id to use instead of a generated one."""
    cpu: str | None = None
    """Requested CPU ('4', '2000m'); recorded and echoed, not passed on as a limit."""
    memory: str | None = None
    """Requested memory ('16Gi'); recorded and echoed, not passed on as a limit."""
    timeout: int | None = Field(default=None, ge=0)
    """Seconds the sandbox may take to become ready (upstream default 3600); echoed."""

    @field_validator("cpu")
    @classmethod
    def _cpu(cls, value: str | None) -> str | None:
        return _quantity(value, CPU, "'4' or '2000m'")

    @field_validator("memory")
    @classmethod
    def _memory(cls, value: str | None) -> str | None:
        return _quantity(value, MEMORY, "'16Gi' or '512Mi'")


class ExecBody(_Request):
    """POST /sandboxes/{id}/exec."""

    command: str | list[str]
    """A bash line (run under `bash -c`), or an argv (run with no shell; as `bash -c` of it, quoted, when it cannot
    start, so a missing program says "command not found" and exits 127)."""
    timeout_seconds: float | None = Field(
        default=None, ge=0, validation_alias=AliasChoices("timeout_seconds", "timeout")
    )
    """Command timeout; unset means the service default (300 s). `timeout` is taken as the same field (the
    create body's name for its timeout), so a bad value there is refused rather than ignored."""
    cwd: str | None = None
    """Working directory; relative paths start at the sandbox's workdir."""
    env: dict[str, str] | None = None
    """Extra environment variables."""
    login_shell: bool = False
    """Run under `bash -lc` instead of `bash -c`."""
    wait: bool = False
    """Block until the command ends (up to its timeout + 30 s) and answer with the whole job."""


class ApplyPatchBody(_Request):
    """POST /sandboxes/{id}/apply_patch."""

    patch: str
    """A unified diff, applied with `git apply` in the sandbox's workdir (all or nothing)."""
    timeout_seconds: float = Field(default=30, ge=0)
    """How long `git apply` may take."""


class UploadBody(_Request):
    """POST /sandboxes/{id}/files."""

    path: str
    """Destination path in the sandbox (parents are created)."""
    content: str
    """The file's bytes, base64-encoded."""


class PathQuery(_Request):
    """?path= of the file routes."""

    path: str = ""
    """A path in the sandbox; empty means the sandbox's workdir."""


class DownloadQuery(_Request):
    """?path= of GET /sandboxes/{id}/files (required, as upstream)."""

    path: str


class WaitQuery(_Request):
    """?timeout= of the wait routes."""

    timeout: float = Field(default=300, ge=0)
    """Seconds to block before answering 408."""


class SandboxWaitQuery(WaitQuery):
    """?timeout= of GET /sandboxes/{id}/wait (upstream default 3600)."""

    timeout: float = Field(default=3600, ge=0)


# ---- responses ----


class CreateSandboxResponse(BaseModel):
    sandbox_id: str
    namespace: str
    image: str
    block_network: bool
    cpu: str
    memory: str
    timeout: int
    status: str
    """pending | ready | failed | deleting | deleted."""


class SandboxResponse(BaseModel):
    """GET /sandboxes/{id} and its /wait."""

    sandbox_id: str
    namespace: str
    image: str
    block_network: bool
    cpu: str
    memory: str
    created_at: float
    ready: bool
    status: str
    status_message: str = ""


class ExecResponse(BaseModel):
    """POST /sandboxes/{id}/exec with wait=false."""

    job_id: str
    status: str = "queued"


class JobResponse(BaseModel):
    """One command; status is queued → running → succeeded | failed; times are epoch seconds."""

    job_id: str
    sandbox_id: str
    command: str
    status: str
    stdout: str = ""
    stderr: str = ""
    exit_code: int | None = None
    created_at: float
    started_at: float | None = None
    completed_at: float | None = None
    error: str | None = None
    stdout_truncated: bool = False
    """Orchard addition: stdout passed the per-stream cap (16 MiB by default) and the rest was dropped."""
    stderr_truncated: bool = False
    """Orchard addition: the same for stderr."""


class ApplyPatchResponse(BaseModel):
    """A patch that does not apply is success=false with git's message, not an HTTP error."""

    success: bool
    stdout: str = ""
    stderr: str = ""
    exit_code: int | None = None
    error: str | None = None


class UploadFileResponse(BaseModel):
    success: bool
    path: str
    size: int


class DownloadFileResponse(BaseModel):
    path: str
    content: str
    """Base64-encoded bytes."""
    size: int


class FileEntry(BaseModel):
    name: str
    type: str
    """file | directory."""
    size: int
    modified: str | None = None
    """ISO 8601 modification time, UTC."""


class ListFilesResponse(BaseModel):
    path: str
    files: list[FileEntry]
