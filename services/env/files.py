"""File transfer in and out of sandboxes, chunked through the sandbox's agent so any size streams."""

from __future__ import annotations

import asyncio
import contextlib
import posixpath
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from orchard.errors import FailedPrecondition, InvalidArgument, OrchardError
from orchard.services.env.agent_client import AgentClient
from orchard.services.env.models import Sandbox

CHUNK = 1 << 20
MAX_PATH_BYTES = 4095
"""Longest path the file RPCs take (Linux's PATH_MAX, less the NUL)."""
MAX_NAME_BYTES = 255
"""Longest name of one path component (NAME_MAX)."""
MAX_DEPTH = 256
"""Most directories deep a path may go (uploads create the missing ones)."""


@dataclass(frozen=True)
class FileInfo:
    name: str
    path: str
    type: str  # file | directory | symlink | other
    size: int
    mode: int
    mtime: float


def resolve_path(workdir: str, path: str) -> str:
    """An absolute, normalized path inside the sandbox; relative paths start at workdir."""
    if "\x00" in path:
        raise InvalidArgument("path contains a NUL byte", field="path")
    resolved = posixpath.normpath(posixpath.join(workdir, path or "."))
    size = len(resolved.encode(errors="surrogateescape"))
    if size > MAX_PATH_BYTES:
        raise InvalidArgument(f"path is {size} bytes long; at most {MAX_PATH_BYTES} are allowed", field="path")
    parts = resolved.strip("/").split("/")
    if len(parts) > MAX_DEPTH:
        raise InvalidArgument(f"path is {len(parts)} directories deep; at most {MAX_DEPTH} are allowed", field="path")
    if any(len(part.encode(errors="surrogateescape")) > MAX_NAME_BYTES for part in parts):
        raise InvalidArgument(f"a name in the path is longer than {MAX_NAME_BYTES} bytes", field="path")
    return resolved


def _info(raw: dict[str, Any]) -> FileInfo:
    return FileInfo(
        name=raw["name"],
        path=raw["path"],
        type=raw["type"],
        size=int(raw["size"]),
        mode=int(raw["mode"]),
        mtime=float(raw["mtime"]),
    )


class FileOps:
    """Upload, download and list, in the sandboxes `ready_sandbox` finds (the manager's, tenant-checked)."""

    def __init__(self, ready_sandbox: Callable[[str], Sandbox]) -> None:
        self._ready_sandbox = ready_sandbox

    def _target(self, sandbox_id: str, path: str) -> tuple[AgentClient, str]:
        sandbox = self._ready_sandbox(sandbox_id)
        assert sandbox.client is not None
        return sandbox.client, resolve_path(sandbox.workdir, path)

    async def upload(self, sandbox_id: str, path: str, mode: int, chunks: AsyncIterator[bytes]) -> tuple[str, int]:
        """Write chunks to path (parents created); the file appears whole or not at all."""
        if not path:
            raise InvalidArgument("path is required", field="path")
        if mode < 0 or mode > 0o7777:
            raise InvalidArgument(f"mode {mode:o} is not a permission mode", field="mode")
        client, target = self._target(sandbox_id, path)
        if target == "/":
            raise InvalidArgument("path must name a file", field="path")
        token = uuid.uuid4().hex[:12]
        offset = 0
        pending = b""
        try:
            async for chunk in chunks:
                pending += chunk
                while len(pending) >= CHUNK:
                    await client.call(
                        "write",
                        pending[:CHUNK],
                        path=target,
                        upload=token,
                        offset=offset,
                        mode=mode or 0o644,
                        last=False,
                    )
                    offset += CHUNK
                    pending = pending[CHUNK:]
            await client.call("write", pending, path=target, upload=token, offset=offset, mode=mode or 0o644, last=True)
        except BaseException:  # a bad stream, a client gone, a full disk: no partial file may stay behind
            with contextlib.suppress(OrchardError):
                await asyncio.shield(client.call("write", path=target, upload=token, abort=True))
            raise
        return target, offset + len(pending)

    async def download(self, sandbox_id: str, path: str) -> tuple[FileInfo, AsyncIterator[bytes]]:
        """The file's info and an iterator over its content."""
        client, target = self._target(sandbox_id, path)
        head, _ = await client.call("stat", path=target)
        info = _info(head["info"])
        if info.type == "directory":
            raise FailedPrecondition(f"{target} is a directory; list it with ListFiles", field="path")
        if info.type == "other":
            raise FailedPrecondition(
                f"{target} is not a regular file (a device, FIFO or socket); only files can be downloaded", field="path"
            )
        try:  # a symlink's target is checked by its first read: the agent refuses what is not a regular file
            first, data = await client.call("read", path=target, offset=0, length=CHUNK)
        except FailedPrecondition as err:
            raise FailedPrecondition(
                f"{target} is not a regular file ({err.message}); only files can be downloaded", field="path"
            ) from None
        size = int(first["size"])  # what the file held when the download began: a growing file ends there

        async def content() -> AsyncIterator[bytes]:
            chunk, offset = data, 0
            while chunk:
                chunk = chunk[: size - offset]
                offset += len(chunk)
                if chunk:
                    yield chunk
                if offset >= size:
                    return
                _, chunk = await client.call("read", path=target, offset=offset, length=min(CHUNK, size - offset))

        return info, content()

    async def list(self, sandbox_id: str, path: str) -> tuple[str, list[FileInfo]]:
        client, target = self._target(sandbox_id, path)
        head, _ = await client.call("list", path=target)
        return target, [_info(raw) for raw in head["files"]]
