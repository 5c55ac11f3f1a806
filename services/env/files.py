"""File transfer in and out of sandboxes, chunked through the sandbox's agent so any size streams."""

from __future__ import annotations

import asyncio
import contextlib
import posixpath
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from orchard.errors import FailedPrecondition, InvalidArgument, OrchardError
from orchard.services.env.agent_client import AgentClient

if TYPE_CHECKING:
    from orchard.services.env.manager import SandboxManager

CHUNK = 1 << 20


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
    return posixpath.normpath(posixpath.join(workdir, path or "."))


def _info(raw: dict[str, Any]) -> FileInfo:
    return FileInfo(name=raw["name"], path=raw["path"], type=raw["type"], size=int(raw["size"]),
                    mode=int(raw["mode"]), mtime=float(raw["mtime"]))


class FileOps:
    """Upload, download and list, for the manager's sandboxes."""

    def __init__(self, manager: SandboxManager) -> None:
        self._manager = manager

    def _target(self, sandbox_id: str, path: str) -> tuple[AgentClient, str]:
        sandbox = self._manager.ready_sandbox(sandbox_id)
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
                    await client.call("write", pending[:CHUNK], path=target, upload=token, offset=offset,
                                      mode=mode or 0o644, last=False)
                    offset += CHUNK
                    pending = pending[CHUNK:]
            await client.call("write", pending, path=target, upload=token, offset=offset, mode=mode or 0o644,
                              last=True)
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

        async def content() -> AsyncIterator[bytes]:
            offset = 0
            while True:
                _, data = await client.call("read", path=target, offset=offset, length=CHUNK)
                if not data:
                    return
                offset += len(data)
                yield data

        return info, content()

    async def list(self, sandbox_id: str, path: str) -> tuple[str, list[FileInfo]]:
        client, target = self._target(sandbox_id, path)
        head, _ = await client.call("list", path=target)
        return target, [_info(raw) for raw in head["files"]]
