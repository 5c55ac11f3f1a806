"""The `docker` backend: each sandbox is a container of a Docker-compatible engine (Docker, or podman's
`podman system service`), with no network (network_mode="none") and the native agent (agent-rs/) bound in
read-only. The agent serves the protocol on a unix socket in a per-sandbox host folder bound at /.orchard/run;
the service connects to it from the host side.

Images are the engine's: the sandbox image "python:3.11-slim" is the engine image
f"{docker_image_prefix}python:3.11-slim" (by default localhost/orchard-python:3.11-slim), e.g. imported from a
built rootfs with `tar -C <rootfs> -c . | podman import - localhost/orchard-python:3.11-slim`.

Containers carry labels (sandbox id, service, tenant, expiry) and outlive the service's process: after a crash
the next run takes back those still within their ttl (recover()) and removes the rest. A command killed for
memory is read off the container's own memory cgroup, through the agent, since the engine's API does not report
it (podman: State.OOMKilled stays False). A snapshot is the container committed to an engine image
(localhost/orchard-snapshot-<service>:<snapshot id>); sandboxes made from it run that image. Unlike the local
backend's, it also keeps the source sandbox's env vars (podman's commit ignores a config override), so a sandbox
made from it sees them unless it sets the same names.

Not supported: egress allowlists (FailedPrecondition: containers have no network at all), and disk caps where
the engine's storage cannot size a container (FailedPrecondition; overlay needs XFS with project quotas).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import shutil
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from orchard.errors import FailedPrecondition, NotFound, OrchardError, Unavailable
from orchard.services.env.agent_client import AgentClient
from orchard.services.env.backends.agent_binary import SANDBOX_AGENT_PATH, agent_binary
from orchard.services.env.backends.base import EgressRule, SandboxSpec, SnapshotFiles
from orchard.services.env.settings import EnvSettings

log = logging.getLogger(__name__)

SANDBOX_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
RUN_DIR = "/.orchard/run"
SOCKET_NAME = "agent.sock"
LABEL_SANDBOX = "orchard.sandbox_id"
LABEL_SERVICE = "orchard.service"
LABEL_TENANT = "orchard.tenant"
LABEL_EXPIRE = "orchard.expire_time"  # epoch seconds when the sandbox's ttl runs out
OOM_FILES = (
    "/sys/fs/cgroup/memory/memory.oom_control",  # cgroup v1: the container's memory group, as it sees it
    "/sys/fs/cgroup/memory.events",  # cgroup v2 with a private cgroup namespace (the engines' default)
)
NO_EGRESS = (
    "the docker backend gives sandboxes no network at all (network_mode none); egress allowlists need "
    "the local or kubernetes backend: create the sandbox without network_policy rules"
)
MAX_SUN_PATH = 100  # sockaddr_un.sun_path holds 108 bytes; longer paths are reached through /proc/self/fd


def service_label(state_dir: Path) -> str:
    """The value of the orchard.service label of this service's containers: a hash of its state dir."""
    return hashlib.sha256(str(state_dir.resolve()).encode()).hexdigest()[:16]


def _docker() -> Any:
    try:
        import docker  # (an optional extra: pip install 'orchard[docker]')
    except ImportError:
        raise FailedPrecondition(
            "the docker backend needs the docker Python package: pip install 'orchard[docker]' (docker==7.*)"
        ) from None
    return docker


class DockerBackend:
    """Sandboxes as containers of a Docker-compatible engine."""

    name = "docker"

    def __init__(self, settings: EnvSettings) -> None:
        self._settings = settings
        self._docker = _docker()
        self._root = settings.state_dir / "docker"
        self._service = service_label(settings.state_dir)
        self._snapshot_repo = f"localhost/orchard-snapshot-{self._service[:8]}"
        self._agent = agent_binary(settings)
        self._client: Any = None
        self._gvisor_client: Any = None
        self._containers: dict[str, Any] = {}
        self._clients: dict[str, AgentClient] = {}
        self._layers: dict[str, tuple[str, ...]] = {}  # sandbox id -> the snapshot layers it was made from

    def _connect(self) -> Any:
        if self._client is None:
            try:
                if self._settings.docker_host:
                    self._client = self._docker.DockerClient(base_url=self._settings.docker_host, timeout=60)
                else:
                    self._client = self._docker.from_env(timeout=60)
                self._client.ping()
            except self._docker.errors.DockerException as err:
                self._client = None
                raise FailedPrecondition(
                    f"cannot reach the container engine ({self._settings.docker_host or 'DOCKER_HOST'}): {err}"
                ) from None
        return self._client

    def _engine_for(self, isolation: str) -> tuple[Any, dict[str, str]]:
        """The engine client a sandbox of this isolation is created on, and the create() arguments it needs."""
        if isolation != "gvisor":
            return self._connect(), {}
        address = self._settings.docker_gvisor_host
        if address is None:
            return self._connect(), {"runtime": self._settings.docker_gvisor_runtime}
        if self._gvisor_client is None:
            try:
                self._gvisor_client = self._docker.DockerClient(base_url=address, timeout=60)
                self._gvisor_client.ping()
            except self._docker.errors.DockerException as err:
                self._gvisor_client = None
                raise FailedPrecondition(f"cannot reach the gVisor container engine ({address}): {err}") from None
        return self._gvisor_client, {}

    async def start(self) -> None:
        """Check the engine. (What a previous run left is for recover().)"""
        self._root.mkdir(parents=True, exist_ok=True)
        await asyncio.to_thread(self._connect)

    async def recover(self, alive: Mapping[str, SandboxSpec]) -> dict[str, AgentClient]:
        """Take back the running containers of `alive` a previous run left (their agents outlived it), and remove
        every other container labelled with this service: expired, failed, or never recorded."""
        leftovers = await asyncio.to_thread(
            self._connect().containers.list, all=True, filters={"label": f"{LABEL_SERVICE}={self._service}"}
        )
        taken: dict[str, AgentClient] = {}
        for container in leftovers:
            spec = alive.get(container.labels.get(LABEL_SANDBOX, ""))
            if spec is not None and container.status == "running":
                try:
                    taken[spec.sandbox_id] = await self._attach(spec, container)
                    continue
                except (OrchardError, OSError) as err:  # its agent does not answer: it goes like the rest
                    log.warning("cannot take back sandbox %s: %s", spec.sandbox_id, err)
            await asyncio.to_thread(self._remove_container, container)
        for path in self._root.iterdir():
            if path.is_dir() and path.name not in taken:
                await asyncio.to_thread(shutil.rmtree, path, ignore_errors=True)
        if leftovers:
            log.info("took back %d of %d containers a previous run left; removed the rest", len(taken), len(leftovers))
        return taken

    def _remove_container(self, container: Any) -> None:
        with contextlib.suppress(self._docker.errors.NotFound):
            container.remove(force=True)

    def image_ref(self, image: str) -> str:
        """The engine's image for a sandbox image name."""
        return f"{self._settings.docker_image_prefix}{image}"

    def _snapshot_ref(self, snapshot_id: str) -> str:
        return f"{self._snapshot_repo}:{snapshot_id}"

    def _create_container(self, spec: SandboxSpec, home: Path) -> Any:
        client, runtime = self._engine_for(spec.isolation)
        # A snapshot's image holds its whole stack of layers: the top one is all a sandbox needs.
        ref = self._snapshot_ref(spec.layers[0]) if spec.layers else self.image_ref(spec.image)
        try:
            client.images.get(ref)
        except self._docker.errors.ImageNotFound:
            raise FailedPrecondition(
                f"image {ref!r} (for {spec.image!r}) is not in the container engine; import a built rootfs: "
                f"`orchard image build {spec.image}` then `tar -C <images_dir>/<image>/rootfs -c . | "
                f"podman import - {ref}` (or `docker import`)"
            ) from None
        env = {
            "PATH": SANDBOX_PATH,
            "HOME": "/root",
            "LANG": "C.UTF-8",
            "ORCHARD_SANDBOX_ID": spec.sandbox_id,
            "PYTHONDONTWRITEBYTECODE": "1",
            **spec.env,
        }
        try:
            container = client.containers.create(
                ref,
                [SANDBOX_AGENT_PATH, "--listen", f"{RUN_DIR}/{SOCKET_NAME}"],
                name=f"orchard-{self._service[:8]}-{spec.sandbox_id}"[:128],
                hostname=spec.sandbox_id[:63],
                network_mode="none",
                labels={
                    LABEL_SANDBOX: spec.sandbox_id,
                    LABEL_SERVICE: self._service,
                    LABEL_TENANT: spec.tenant,
                    LABEL_EXPIRE: str(int(spec.expire_time)),
                },
                working_dir=spec.workdir,
                environment=env,
                volumes={
                    str(home): {"bind": RUN_DIR, "mode": "rw"},
                    str(self._agent): {"bind": SANDBOX_AGENT_PATH, "mode": "ro"},
                },
                # Never privileged, no added capabilities: the engine's default profile (seccomp, masked and
                # read-only /proc paths, dropped capabilities) applies.
                privileged=False,
                **runtime,
                **_limits(spec),
            )
        except self._docker.errors.APIError as err:
            if spec.resources.disk_bytes and "storage" in str(err.explanation):
                raise FailedPrecondition(
                    f"the container engine cannot cap this sandbox's disk use: {err.explanation}. Create it with "
                    "resources.disk_bytes 0, or give the engine storage that sizes containers (overlay on XFS "
                    "mounted with pquota)"
                ) from None
            raise
        self._containers[spec.sandbox_id] = container
        if runtime and container.attrs.get("HostConfig", {}).get("Runtime") != runtime["runtime"]:
            raise FailedPrecondition(
                f"the container engine ignored the {runtime['runtime']!r} runtime asked for (podman's compat API "
                "does): start an engine whose default runtime is gVisor (`podman --runtime runsc system service "
                "unix:///run/orchard-gvisor.sock`, same storage) and set ORCHARD_ENV_DOCKER_GVISOR_HOST to it",
                field="isolation",
            )
        container.start()
        return container

    async def _wait_socket(self, spec: SandboxSpec, container: Any, sock: Path) -> tuple[Any, Any]:
        deadline = time.monotonic() + self._settings.agent_start_timeout_s
        dir_fd: int | None = None
        try:
            while True:
                if sock.exists():
                    target = str(sock)
                    if len(target.encode()) > MAX_SUN_PATH:
                        if dir_fd is None:
                            dir_fd = os.open(sock.parent, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
                        target = f"/proc/self/fd/{dir_fd}/{SOCKET_NAME}"
                    try:
                        return await asyncio.open_unix_connection(target, limit=1 << 20)
                    except (ConnectionRefusedError, FileNotFoundError):
                        pass  # bound, not yet listening
                if time.monotonic() > deadline:
                    break
                await asyncio.to_thread(container.reload)
                if container.status not in ("created", "running"):
                    break
                await asyncio.sleep(0.02)
        finally:
            if dir_fd is not None:
                os.close(dir_fd)
        logs = await asyncio.to_thread(container.logs, tail=50)
        detail = logs.decode(errors="replace").strip()[-2000:]
        raise Unavailable(
            f"agent of {spec.sandbox_id} did not start within {self._settings.agent_start_timeout_s:.0f}s "
            f"(container {container.status}): {detail or 'no output'}"
        )

    async def create(self, spec: SandboxSpec) -> AgentClient:
        if spec.egress:
            raise FailedPrecondition(NO_EGRESS)
        home = self._root / spec.sandbox_id
        home.mkdir(parents=True, exist_ok=True)
        try:
            container = await asyncio.to_thread(self._create_container, spec, home)
            return await self._attach(spec, container)
        except BaseException:
            await self.destroy(spec.sandbox_id)
            raise

    async def _attach(self, spec: SandboxSpec, container: Any) -> AgentClient:
        """Connect to the agent of the sandbox's running container, and hold both."""
        reader, writer = await self._wait_socket(spec, container, self._root / spec.sandbox_id / SOCKET_NAME)
        client = AgentClient(reader, writer, label=spec.sandbox_id)
        try:
            await client.start(self._settings.agent_start_timeout_s)
        except BaseException:
            writer.close()
            raise
        self._containers[spec.sandbox_id] = container
        self._clients[spec.sandbox_id] = client
        self._layers[spec.sandbox_id] = spec.layers
        return client

    async def destroy(self, sandbox_id: str) -> None:
        client = self._clients.pop(sandbox_id, None)
        if client is not None:
            await client.close("the sandbox was deleted")
        self._layers.pop(sandbox_id, None)
        container = self._containers.pop(sandbox_id, None)
        if container is not None:
            await asyncio.to_thread(self._remove_container, container)
        await asyncio.to_thread(shutil.rmtree, self._root / sandbox_id, ignore_errors=True)

    async def set_egress(self, sandbox_id: str, rules: tuple[EgressRule, ...]) -> None:
        if rules:
            raise FailedPrecondition(NO_EGRESS)
        # No rules = no egress: the container has no network at all already.

    async def snapshot(self, sandbox_id: str, snapshot_id: str) -> SnapshotFiles:
        """Commit the container (paused meanwhile, so files being written are caught whole) to an image."""
        container = self._containers[sandbox_id]
        client = self._connect()
        # The size of the container's writable layer: only the engine's list call reports it.
        [listed] = await asyncio.to_thread(client.api.containers, all=True, size=True, filters={"id": container.id})
        await asyncio.to_thread(container.commit, repository=self._snapshot_repo, tag=snapshot_id, pause=True)
        return SnapshotFiles(layers=(snapshot_id, *self._layers[sandbox_id]), size_bytes=int(listed.get("SizeRw") or 0))

    async def delete_snapshot(self, snapshot_id: str) -> None:
        """Untag the snapshot's image; the engine keeps its layers while a later snapshot's image stacks them (and
        the image itself while a container taken back after a crash runs it)."""
        try:
            await asyncio.to_thread(self._connect().images.remove, self._snapshot_ref(snapshot_id))
        except self._docker.errors.NotFound:
            pass
        except self._docker.errors.APIError as err:
            log.warning("snapshot image %s stays: %s", self._snapshot_ref(snapshot_id), err.explanation)

    async def stored_snapshots(self) -> set[str]:
        images = await asyncio.to_thread(self._connect().images.list, name=self._snapshot_repo)
        return {
            tag.rsplit(":", 1)[1]
            for image in images
            for tag in image.tags
            if tag.rsplit(":", 1)[0] == self._snapshot_repo
        }

    async def oom_kills(self, sandbox_id: str) -> int:
        """The oom_kill count of the container's memory cgroup, read by its agent: the engine's API does not
        report OOM kills of exec'd commands, and only the container sees its group at a path every engine agrees
        on. 0 when the agent is gone or the kernel does not count them."""
        client = self._clients.get(sandbox_id)
        if client is None:
            return 0
        for path in OOM_FILES:
            try:
                _, data = await client.call("read", path=path, offset=0, length=4096)
            except NotFound:
                continue
            except OrchardError:
                return 0
            return oom_kill_count(data.decode(errors="replace"))
        return 0

    async def close(self) -> None:
        await asyncio.gather(*(self.destroy(sid) for sid in list(self._containers)))
        if self._client is not None:
            await asyncio.to_thread(self._client.close)
            self._client = None


def _limits(spec: SandboxSpec) -> dict[str, Any]:
    """Engine options for the sandbox's resources (swap counts against the memory limit)."""
    res = spec.resources
    limits: dict[str, Any] = {}
    if res.memory_bytes:
        limits.update(mem_limit=res.memory_bytes, memswap_limit=res.memory_bytes)
    if res.cpu_millis:
        limits["nano_cpus"] = res.cpu_millis * 1_000_000
    if res.pids:
        limits["pids_limit"] = res.pids
    if res.disk_bytes:
        limits["storage_opt"] = {"size": str(res.disk_bytes)}
    return limits


def oom_kill_count(text: str) -> int:
    """The "oom_kill N" line of a memory.oom_control (v1) or memory.events (v2) file; 0 without one."""
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key == "oom_kill":
            return int(value)
    return 0
