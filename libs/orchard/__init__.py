"""Orchard: an open framework for building LLM agents. `from orchard import SandboxClient` is the SDK."""

from orchard.sdk import (
    AsyncExecHandle,
    AsyncSandbox,
    AsyncSandboxClient,
    ExecHandle,
    FileEntry,
    JobResult,
    PatchError,
    PatchResult,
    Sandbox,
    SandboxClient,
    SandboxInfo,
)

__all__ = [
    "AsyncExecHandle",
    "AsyncSandbox",
    "AsyncSandboxClient",
    "ExecHandle",
    "FileEntry",
    "JobResult",
    "PatchError",
    "PatchResult",
    "Sandbox",
    "SandboxClient",
    "SandboxInfo",
]
