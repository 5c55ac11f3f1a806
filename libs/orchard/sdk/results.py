"""What SDK calls return: command results, file entries, patch results, sandbox and snapshot info,
built from the env service's protos. Field names follow the public Orchard Env SDK."""

from __future__ import annotations

from dataclasses import dataclass, field

from google.protobuf.duration_pb2 import Duration
from google.protobuf.message import Message
from google.protobuf.timestamp_pb2 import Timestamp

from orchard.env.v1 import env_pb2 as pb
from orchard.errors import FailedPrecondition

EXEC_STATUS = {
    pb.EXEC_STATE_QUEUED: "queued",
    pb.EXEC_STATE_RUNNING: "running",
    pb.EXEC_STATE_SUCCEEDED: "succeeded",
    pb.EXEC_STATE_FAILED: "failed",
    pb.EXEC_STATE_TIMED_OUT: "timed_out",
    pb.EXEC_STATE_CANCELLED: "cancelled",
}
DONE = frozenset({"succeeded", "failed", "timed_out", "cancelled"})
SANDBOX_STATE = {
    pb.SANDBOX_STATE_PENDING: "pending",
    pb.SANDBOX_STATE_READY: "ready",
    pb.SANDBOX_STATE_FAILED: "failed",
    pb.SANDBOX_STATE_DELETING: "deleting",
    pb.SANDBOX_STATE_DELETED: "deleted",
}
SANDBOX_KIND = {pb.SANDBOX_KIND_CONTAINER: "container", pb.SANDBOX_KIND_BROWSER: "browser"}
FILE_TYPE = {pb.FILE_TYPE_FILE: "file", pb.FILE_TYPE_DIRECTORY: "directory", pb.FILE_TYPE_SYMLINK: "symlink"}


class PatchError(FailedPrecondition):
    """A patch did not apply; no file in the sandbox was changed. The message holds git's output."""


@dataclass(frozen=True)
class JobResult:
    """One command (a "job") in a sandbox: its status and, once it ends, its output and exit code."""

    job_id: str
    sandbox_id: str
    command: str
    status: str
    """"queued", "running", "succeeded", "failed", "timed_out" or "cancelled"."""
    stdout: str = ""
    """Standard output, decoded as UTF-8 (undecodable bytes become U+FFFD)."""
    stderr: str = ""
    exit_code: int | None = None
    """None until the command ends; 128+N when a signal N killed it."""
    error: str = ""
    """Why the command did not simply exit (timeout, cancel, OOM, start failure); empty otherwise."""
    stdout_truncated: bool = False
    """True when stdout passed the service's output cap and the rest was dropped."""
    stderr_truncated: bool = False
    duration: float | None = None
    """Seconds it ran, once it ended."""
    created_at: float | None = None
    """Epoch seconds when it was queued."""
    started_at: float | None = None
    completed_at: float | None = None

    @property
    def succeeded(self) -> bool:
        """True when the command exited with code 0."""
        return self.status == "succeeded"

    @property
    def failed(self) -> bool:
        """True when the command ended without succeeding (non-zero exit, timeout or cancel)."""
        return self.status in DONE and self.status != "succeeded"

    @property
    def timed_out(self) -> bool:
        """True when the command was killed for running past its timeout."""
        return self.status == "timed_out"

    @property
    def is_complete(self) -> bool:
        """True once the command has ended, whichever way."""
        return self.status in DONE

    def __repr__(self) -> str:
        return f"JobResult(job_id={self.job_id!r}, status={self.status!r}, exit_code={self.exit_code})"


@dataclass(frozen=True)
class FileEntry:
    """One entry of a sandbox directory."""

    name: str
    path: str
    """Absolute path inside the sandbox."""
    type: str
    """"file", "directory", "symlink" or "other"."""
    size: int
    modified: float | None
    """Epoch seconds of the last modification."""
    mode: int = 0
    """Permission bits."""


@dataclass(frozen=True)
class PatchResult:
    """A patch that applied."""

    files: list[str]
    """The files it touched, relative to the directory it was applied in."""
    output: str
    """What `git apply` printed."""


@dataclass(frozen=True)
class UploadResult:
    """A file written into a sandbox."""

    path: str
    """The absolute path written."""
    size: int
    """Bytes written."""


@dataclass(frozen=True)
class SandboxInfo:
    """A sandbox as the service last reported it."""

    sandbox_id: str
    image: str
    state: str
    """"pending", "ready", "failed", "deleting" or "deleted"."""
    workdir: str
    labels: dict[str, str] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    failure_reason: str = ""
    created_at: float | None = None
    expires_at: float | None = None
    """Epoch seconds when the service deletes it unless its lease is extended."""
    ttl: float | None = None
    """Its lifetime cap in seconds."""
    from_snapshot: str = ""
    """The id of the snapshot it was made from; empty when made from its image alone."""
    kind: str = "container"
    """"container" (commands, files, patches) or "browser" (screenshot, act, page_content)."""


@dataclass(frozen=True)
class Screenshot:
    """A PNG of a browser sandbox's page."""

    png: bytes
    width: int
    """Image width in pixels."""
    height: int
    """Image height in pixels."""
    url: str
    """The page's URL."""
    title: str
    """The page's title."""


@dataclass(frozen=True)
class ActResult:
    """The page after a browser action."""

    url: str
    title: str
    png: bytes = b""
    """A PNG taken after the action, when asked for (act(..., screenshot=True)); else empty."""


@dataclass(frozen=True)
class PageContent:
    """What a browser sandbox's page holds, as text."""

    url: str
    title: str
    accessibility_tree: str
    """The page's accessibility tree as indented YAML-like text (roles, names, states), e.g.
    '- button "Press me"'."""
    text: str
    """The visible text of the page (document.body.innerText)."""


@dataclass(frozen=True)
class ImageInfo:
    """A built sandbox image."""

    name: str
    size: int
    """Disk usage of its root filesystem, in bytes."""
    description: str = ""


@dataclass(frozen=True)
class SnapshotInfo:
    """A snapshot: a sandbox's files, frozen; `create_sandbox(from_snapshot=...)` starts sandboxes from it."""

    snapshot_id: str
    sandbox_id: str
    """The sandbox it was taken from."""
    image: str
    """The image sandboxes made from it run on."""
    size: int
    """Bytes of the files it holds over its image (and over the snapshot its sandbox was made from)."""
    labels: dict[str, str] = field(default_factory=dict)
    created_at: float | None = None
    keep: bool = False
    """It outlives restarts of the service (until deleted)."""


def _seconds(msg: Message, name: str) -> float | None:
    if not msg.HasField(name):
        return None
    value: Timestamp | Duration = getattr(msg, name)
    return float(value.ToNanoseconds() / 1e9)


def job_result(ex: pb.Exec) -> JobResult:
    status = EXEC_STATUS.get(ex.state, "unknown")
    return JobResult(
        job_id=ex.exec_id,
        sandbox_id=ex.sandbox_id,
        command=ex.command,
        status=status,
        stdout=ex.stdout.decode("utf-8", errors="replace"),
        stderr=ex.stderr.decode("utf-8", errors="replace"),
        exit_code=ex.exit_code if status in DONE else None,
        error=ex.error,
        stdout_truncated=ex.stdout_truncated,
        stderr_truncated=ex.stderr_truncated,
        duration=_seconds(ex, "duration"),
        created_at=_seconds(ex, "create_time"),
        started_at=_seconds(ex, "start_time"),
        completed_at=_seconds(ex, "end_time"),
    )


def file_entry(info: pb.FileInfo) -> FileEntry:
    return FileEntry(
        name=info.name,
        path=info.path,
        type=FILE_TYPE.get(info.type, "other"),
        size=info.size_bytes,
        modified=_seconds(info, "modify_time"),
        mode=info.mode,
    )


def sandbox_info(sb: pb.Sandbox) -> SandboxInfo:
    return SandboxInfo(
        sandbox_id=sb.sandbox_id,
        image=sb.image,
        state=SANDBOX_STATE.get(sb.state, "unknown"),
        workdir=sb.workdir,
        labels=dict(sb.labels),
        env=dict(sb.env),
        failure_reason=sb.failure_reason,
        created_at=_seconds(sb, "create_time"),
        expires_at=_seconds(sb, "expire_time"),
        ttl=_seconds(sb, "ttl"),
        from_snapshot=sb.from_snapshot,
        kind=SANDBOX_KIND.get(sb.kind, "container"),
    )


def snapshot_info(snap: pb.Snapshot) -> SnapshotInfo:
    return SnapshotInfo(
        snapshot_id=snap.snapshot_id,
        sandbox_id=snap.sandbox_id,
        image=snap.image,
        size=snap.size_bytes,
        labels=dict(snap.labels),
        created_at=_seconds(snap, "create_time"),
        keep=snap.keep,
    )
