"""Alias of the Orchard Env SDK under the name the quick start uses: `from aks_modal import SandboxClient`."""

from orchard.sdk import (
    AsyncExecHandle,
    AsyncSandbox,
    AsyncSandboxClient,
    AsyncSandboxInstance,
    ExecHandle,
    FileEntry,
    JobResult,
    PatchError,
    PatchResult,
    Sandbox,
    SandboxClient,
    SandboxInfo,
    SandboxInstance,
    UploadResult,
)

__all__ = [
    "AsyncExecHandle",
    "AsyncSandbox",
    "AsyncSandboxClient",
    "AsyncSandboxInstance",
    "ExecHandle",
    "FileEntry",
    "JobResult",
    "PatchError",
    "PatchResult",
    "Sandbox",
    "SandboxClient",
    "SandboxInfo",
    "SandboxInstance",
    "UploadResult",
]
