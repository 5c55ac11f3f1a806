"""The Orchard Env Python SDK: sandboxes, commands, files and patches over the env service's gRPC API.

    from orchard import SandboxClient
    with SandboxClient() as client:
        with client.create_sandbox("python:3.11-slim") as sandbox:
            print(sandbox.exec("python -V").stdout)

Names follow the public Orchard Env SDK (`orchard_env`), so code written for it switches by import.
"""

from orchard.sdk.aio import AsyncSandboxClient, AsyncSandboxPager
from orchard.sdk.results import (
    ActResult,
    FileEntry,
    JobResult,
    PageContent,
    PatchError,
    PatchResult,
    SandboxInfo,
    Screenshot,
    SnapshotInfo,
    UploadResult,
)
from orchard.sdk.sandbox import AsyncExecHandle, AsyncPtySession, AsyncSandbox
from orchard.sdk.sync import ExecHandle, PtySession, Sandbox, SandboxClient

SandboxInstance = Sandbox
"""The public SDK's name for a sandbox."""
AsyncSandboxInstance = AsyncSandbox
"""The public SDK's name for an async sandbox."""

__all__ = [
    "ActResult",
    "AsyncExecHandle",
    "AsyncPtySession",
    "AsyncSandbox",
    "AsyncSandboxClient",
    "AsyncSandboxInstance",
    "AsyncSandboxPager",
    "ExecHandle",
    "FileEntry",
    "JobResult",
    "PageContent",
    "PatchError",
    "PatchResult",
    "PtySession",
    "Sandbox",
    "SandboxClient",
    "SandboxInfo",
    "SandboxInstance",
    "Screenshot",
    "SnapshotInfo",
    "UploadResult",
]
