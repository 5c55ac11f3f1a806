"""Settings of the env service: env vars ORCHARD_ENV_<FIELD>, overridden by flags."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from orchard.runtime.settings import ServiceSettings
from orchard.services.env.images import default_images_dir


def default_state_dir() -> Path:
    return Path.home() / ".local" / "state" / "orchard" / "env"


class EnvSettings(ServiceSettings):
    """Orchard Env service settings."""

    model_config = SettingsConfigDict(env_prefix="ORCHARD_ENV_", extra="forbid")

    port: int = 50051
    """TCP port to listen on (0 picks a free one)."""
    http_port: int | None = Field(default=None, ge=0, le=65535)
    """Port of the REST gateway speaking the public Orchard Env HTTP API (0 picks a free one); unset = none."""
    backend: str = "local"
    """Sandbox backend: local, or docker (a Docker-compatible engine: Docker, or `podman system service`)."""
    state_dir: Path = Field(default_factory=default_state_dir)
    """Where sandboxes' writable layers live."""
    images_dir: Path = Field(default_factory=default_images_dir)
    """Where built images live (`orchard image build`)."""
    max_sandboxes: int = Field(default=2000, ge=1)
    """Most sandboxes alive at once; creates beyond it get RESOURCE_EXHAUSTED."""
    max_snapshots: int = Field(default=1000, ge=1)
    """Most snapshots kept at once; SnapshotSandbox beyond it gets RESOURCE_EXHAUSTED."""
    max_concurrent_creates: int = Field(default=32, ge=1)
    """Most sandbox creations in progress at once; more wait in line."""
    max_concurrent_execs: int = Field(default=400, ge=1)
    """Most commands running at once across all sandboxes; more wait in line."""
    max_queued_execs: int = Field(default=10000, ge=1)
    """Most commands waiting in line; StartExec beyond it gets RESOURCE_EXHAUSTED."""
    max_pty_sessions: int = Field(default=256, ge=1)
    """Most interactive terminal sessions open at once (they take no command slot); more get RESOURCE_EXHAUSTED."""
    default_exec_timeout_s: float = Field(default=300.0, gt=0)
    """Timeout of a command that sets none."""
    max_exec_timeout_s: float = Field(default=24 * 3600.0, gt=0)
    """Longest timeout a command may ask for."""
    default_output_bytes: int = Field(default=16 << 20, ge=1)
    """Per-stream output cap of a command that sets none; the rest is dropped and reported."""
    max_output_bytes: int = Field(default=256 << 20, ge=1)
    """Largest per-stream output cap a command may ask for."""
    default_ttl_s: float = Field(default=2 * 3600.0, gt=0)
    """Lifetime of a sandbox that sets none."""
    max_ttl_s: float = Field(default=7 * 24 * 3600.0, gt=0)
    """Longest lifetime a sandbox may ask for."""
    max_wait_s: float = Field(default=60.0, gt=0)
    """Longest a WaitExec call blocks."""
    exec_retention_s: float = Field(default=3600.0, ge=0)
    """How long finished commands stay readable."""
    exec_output_memory_bytes: int = Field(default=16 << 10, ge=0)
    """Bytes of each command's output held in memory; the rest spools to a file under <state_dir>/execs, deleted
    with the command's record."""
    max_retained_output_bytes: int = Field(default=8 << 30, ge=0)
    """Most bytes of finished commands' spooled output kept on disk; past it the oldest finished records are
    forgotten before their retention ends."""
    sweep_interval_s: float = Field(default=1.0, gt=0)
    """How often expired sandboxes and old commands are swept."""
    agent_start_timeout_s: float = Field(default=15.0, gt=0)
    """How long a new sandbox's agent may take to start."""
    bwrap_path: str = "bwrap"
    """The bubblewrap binary."""
    docker_host: str | None = None
    """docker backend: the engine's API address (e.g. unix:///run/podman/podman.sock); unset = DOCKER_HOST & co."""
    docker_image_prefix: str = "localhost/orchard-"
    """docker backend: engine image of sandbox image NAME is PREFIX+NAME (python:3.11-slim →
    localhost/orchard-python:3.11-slim)."""
    default_isolation: Literal["container", "gvisor"] = "container"
    """Isolation of a sandbox that asks for none: "container" (namespaces, seccomp; every backend) or "gvisor"
    (a user-space kernel; the docker and kubernetes backends)."""
    docker_gvisor_runtime: str = "runsc"
    """docker backend: the engine's name for its gVisor OCI runtime, asked for per container (Docker honours it)."""
    docker_gvisor_host: str | None = None
    """docker backend: an engine whose containers all run on gVisor, for ISOLATION_GVISOR sandboxes (podman's
    compat API ignores a per-container runtime: start `podman --runtime runsc system service` on the same
    storage and give its address here). Unset: the main engine with docker_gvisor_runtime."""
    k8s_gvisor_runtime_class: str = "gvisor"
    """kubernetes backend: the RuntimeClass that runs pods on gVisor."""
    agent_path: Path | None = None
    """local and docker backends: the native agent binary (agent-rs/) bound read-only into every sandbox; unset =
    scripts/build_agent.sh's output."""
    default_cpu_millis: int = Field(default=0, ge=0)
    """CPU limit (1000 = one core) of a sandbox that sets none; 0 = unlimited."""
    default_memory_bytes: int = Field(default=0, ge=0)
    """Memory limit of a sandbox that sets none; 0 = unlimited."""
    default_pids: int = Field(default=4096, ge=0)
    """Process (and thread) limit of a sandbox that sets none, so a fork bomb stays inside; 0 = unlimited."""
    default_disk_bytes: int = Field(default=0, ge=0)
    """Size cap of the writable layer of a sandbox that sets none; 0 = unlimited."""
    cgroup_root: Path | None = None
    """local backend on cgroup v2: the delegated subtree (a directory under /sys/fs/cgroup with the memory, cpu and
    pids controllers) to make sandboxes' groups in; unset = the service's own cgroup (systemd's Delegate=yes)."""
    egress_firewall: Literal["auto", "nftables", "iptables"] = "auto"
    """local backend: the firewall that carries egress allowlists: "nftables" (its inet family), "iptables" (legacy
    iptables, iptables-legacy, the same rules for kernels without that family, such as Debian's user-mode Linux), or
    "auto": nftables where the kernel gives it, else iptables; decided once per service, at its first allowlist."""
    k8s_namespace: str = "orchard-sandboxes"
    """kubernetes backend: the namespace of sandbox pods and their network policies (deploy/k8s/base/env-rbac.yaml)."""
    k8s_kubeconfig: Path | None = None
    """kubernetes backend: the kubeconfig file to use; unset = the pod's service account when in a cluster,
    else KUBECONFIG or ~/.kube/config."""
    k8s_service_id: str = ""
    """kubernetes backend: the orchard.dev/service label of this instance's pods (what it owns and cleans up at
    start-up); unset = this host's name (a pod's name in a cluster). Give each replica its own."""
    k8s_agent_image: str = "orchard-agent"
    """kubernetes backend: the image whose /orchard-agent an init container installs into each sandbox pod
    (deploy/Dockerfile --target agent)."""
    k8s_agent_port: int = Field(default=7070, ge=1, le=65535)
    """kubernetes backend: the TCP port the agent serves on each sandbox's Pod IP."""
    k8s_start_timeout_s: float = Field(default=300.0, gt=0)
    """kubernetes backend: how long a new sandbox's pod may take to be scheduled and started (image pulls
    included) before the create fails with UNAVAILABLE."""
    k8s_image_prefix: str = ""
    """kubernetes backend: the container image of sandbox image NAME is PREFIX+NAME unless k8s_images maps it."""
    k8s_images: dict[str, str] = Field(default_factory=dict)
    """kubernetes backend: container images of sandbox image names, e.g. {"python:3.11-slim":
    "registry.example/orchard/python:3.11-slim"}."""
    k8s_runtime_class: str | None = None
    """kubernetes backend: runtimeClassName of sandbox pods (e.g. gvisor); unset = the cluster's default."""
    k8s_warm_pools: dict[str, int] = Field(default_factory=dict)
    """kubernetes backend: pods kept started per sandbox image, e.g. {"python:3.11-slim": 4}, handed out to
    creates with the default resources and no env (forks too: the snapshot is restored into the pod handed out);
    refilled in the background."""
    k8s_snapshot_max_bytes: int = Field(default=8 << 30, ge=1)
    """kubernetes backend: the largest tar of what a sandbox changed that a snapshot keeps (on the service's disk,
    <state_dir>/snapshots); a larger one is RESOURCE_EXHAUSTED."""
    browser_path: str = "/usr/bin/chromium"
    """Chromium binary that browser sandboxes run (Playwright drives it; never `playwright install`)."""
    max_browser_sandboxes: int = Field(default=32, ge=0)
    """Most browser sandboxes alive at once (~70 MiB each); creates beyond it get RESOURCE_EXHAUSTED."""
    browser_contexts_per_process: int = Field(default=16, ge=1)
    """Browser sandboxes (contexts) sharing one Chromium process; one more starts another process."""
    browser_viewport_width: int = Field(default=1024, ge=64, le=8192)
    """Viewport width of a browser sandbox's page, in CSS pixels."""
    browser_viewport_height: int = Field(default=768, ge=64, le=8192)
    """Viewport height of a browser sandbox's page, in CSS pixels."""
    browser_action_timeout_s: float = Field(default=10.0, gt=0)
    """Timeout of a browser action (Act), Screenshot or GetPageContent that sets none."""
    max_browser_action_timeout_s: float = Field(default=120.0, gt=0)
    """Longest timeout a browser action may have; longer ones are cut to it."""
    browser_launch_timeout_s: float = Field(default=30.0, gt=0)
    """How long starting a Chromium process may take."""
