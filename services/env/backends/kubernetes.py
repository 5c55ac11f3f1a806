"""The `kubernetes` backend: each sandbox is a Pod in settings.k8s_namespace running the native agent (agent-rs/,
`--listen-tcp` with a per-pod token) on its Pod IP, installed by an init container from the agent image.

Egress: one namespace-wide NetworkPolicy denies sandbox pods all egress; a sandbox's CIDR rules become an allow
policy of its own. Readiness comes from one pod watch (k8s_watch.py), warm pools keep pods started ahead
(k8s_pool.py), and labels/annotations (k8s_manifests.py) let a restarted instance remove what it left and any
instance remove what expired. A pod whose container dies is reported to the manager (ReportingBackend). Snapshots
are what the pod's root filesystem became, saved by its agent to the service's disk and restored into a fork's
pod before it is ready (k8s_snapshots.py). Not supported: host-name egress rules (FailedPrecondition:
NetworkPolicy matches IP blocks only), and a per-sandbox process limit.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import shutil
import socket
import time
from dataclasses import dataclass
from typing import Any

from orchard.errors import (
    AlreadyExists,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    OrchardError,
    ResourceExhausted,
    Unavailable,
)
from orchard.runtime import tenancy
from orchard.services.env.agent_client import AgentClient, connect_tcp
from orchard.services.env.backends import k8s_manifests as m
from orchard.services.env.backends import k8s_snapshots as snapshots
from orchard.services.env.backends.base import (
    EgressRule,
    Resources,
    SandboxEnded,
    SandboxSpec,
    SnapshotFiles,
)
from orchard.services.env.backends.k8s_pool import WarmPod, WarmPools
from orchard.services.env.backends.k8s_watch import PodCache, PodState
from orchard.services.env.settings import EnvSettings

log = logging.getLogger(__name__)

API_TIMEOUT_S = 30.0
MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
WARM_WORKDIR = "/"  # warm pods start anywhere; a hand-out makes the sandbox's workdir
MEMORY_EVENTS = "/sys/fs/cgroup/memory.events"  # the pod's own cgroup (cgroup v2, private cgroup namespace)


def _kubernetes() -> Any:
    try:
        import kubernetes  # (an optional extra: pip install 'orchard[kubernetes]')
    except ImportError:
        raise FailedPrecondition(
            "the kubernetes backend needs the kubernetes Python package: "
            "pip install 'orchard[kubernetes]' (kubernetes==37.*)"
        ) from None
    return kubernetes


@dataclass
class _Pod:
    """The pod of one sandbox."""

    name: str
    token: str
    expire_s: float
    client: AgentClient | None = None
    has_policy: bool = False
    since: str = ""
    """When (the pod's clock, epoch seconds) its files began to differ from its image: what a snapshot saves."""


class KubernetesBackend:
    """Sandboxes as Pods of a Kubernetes cluster, reached by Pod IP."""

    name = "kubernetes"

    def __init__(self, settings: EnvSettings) -> None:
        self._settings = settings
        self._k8s = _kubernetes()
        s = settings
        service_id = m.label_value(s.k8s_service_id or socket.gethostname())
        self._cfg = m.PodConfig(
            namespace=s.k8s_namespace,
            service_id=service_id,
            agent_image=s.k8s_agent_image,
            agent_port=s.k8s_agent_port,
            runtime_class=s.k8s_runtime_class,
        )
        self._defaults = Resources(s.default_cpu_millis, s.default_memory_bytes, s.default_pids, s.default_disk_bytes)
        import urllib3  # the kubernetes client's HTTP layer: its connection errors are not all OSErrors

        self._transport_errors = (OSError, urllib3.exceptions.HTTPError)
        self._api: Any = None
        self._core: Any = None
        self._net: Any = None
        self._cache: PodCache | None = None
        self._pools: WarmPools | None = None
        self._pods: dict[str, _Pod] = {}
        self._snapshots = settings.state_dir / "snapshots"
        self._report: SandboxEnded = lambda sandbox_id, why: None
        self._closing: set[asyncio.Task[None]] = set()  # agent clients of pods that died, being closed

    def report_ended(self, callback: SandboxEnded) -> None:
        self._report = callback

    # ---- the API ----

    def _load_client(self) -> Any:
        k8s, path = self._k8s, self._settings.k8s_kubeconfig
        conf = k8s.client.Configuration()
        try:
            if path is not None:
                k8s.config.load_kube_config(config_file=str(path), client_configuration=conf)
            else:
                try:
                    k8s.config.load_incluster_config(client_configuration=conf)
                except k8s.config.ConfigException:
                    k8s.config.load_kube_config(client_configuration=conf)
        except (k8s.config.ConfigException, OSError) as err:
            raise FailedPrecondition(
                f"no usable Kubernetes credentials ({err}): set ORCHARD_ENV_K8S_KUBECONFIG or "
                "KUBECONFIG, or run the service in a pod with a service account"
            ) from None
        conf.connection_pool_maxsize = 64  # creates and deletes run in threads side by side
        return k8s.client.ApiClient(conf)

    async def _call(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """fn(*args) in a thread, its failures as OrchardErrors naming what was being done."""
        try:
            return await asyncio.to_thread(fn, *args, _request_timeout=API_TIMEOUT_S, **kwargs)
        except self._k8s.client.exceptions.ApiException as err:
            raise _api_error(what, err) from None
        except self._transport_errors as err:
            raise Unavailable(
                f"cannot {what}: the Kubernetes API at {self._api.configuration.host} is unreachable: {err}"
            ) from None

    async def _send(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> None:
        """_call for a write whose reply is not needed: the reply is not parsed into a model (that is slow)."""
        response = await self._call(what, fn, *args, _preload_content=False, **kwargs)
        try:
            await asyncio.to_thread(response.read)  # to the end, or the pooled connection is unusable
        finally:
            response.release_conn()

    async def _delete_pod(self, name: str) -> None:
        try:
            await self._send(
                f"delete pod {name}",
                self._core.delete_namespaced_pod,
                name,
                self._cfg.namespace,
                grace_period_seconds=0,
            )
        except NotFound:
            pass

    async def _delete_policy(self, name: str) -> None:
        try:
            await self._send(
                f"delete network policy {name}", self._net.delete_namespaced_network_policy, name, self._cfg.namespace
            )
        except NotFound:
            pass

    # ---- lifecycle ----

    async def start(self) -> None:
        """Connect, remove what a previous run of this instance left and what expired, set the namespace's
        deny-all policy, start watching this instance's pods, and start filling the warm pools."""
        k8s = self._k8s
        self._api = await asyncio.to_thread(self._load_client)
        self._core, self._net = k8s.client.CoreV1Api(self._api), k8s.client.NetworkingV1Api(self._api)
        await self._clean_up()
        deny = m.deny_egress_policy(self._cfg)  # the client sends plain dicts as they are
        try:
            await self._send(
                "create the deny-all egress policy",
                self._net.create_namespaced_network_policy,
                self._cfg.namespace,
                deny,
            )
        except AlreadyExists:
            await self._send(
                "replace the deny-all egress policy",
                self._net.patch_namespaced_network_policy,
                m.DENY_POLICY,
                self._cfg.namespace,
                _replace_spec(m.deny_egress_policy(self._cfg)),
                _content_type=JSON_PATCH,
            )
        self._cache = PodCache(
            self._core.list_namespaced_pod,
            namespace=self._cfg.namespace,
            selector=f"{m.MANAGED_BY}={m.MANAGER},{m.LABEL_SERVICE}={self._cfg.service_id}",
            on_ended=self._pod_ended,
        )
        await self._cache.start(API_TIMEOUT_S)
        self._pools = WarmPools(
            self._settings.k8s_warm_pools, self._cache, create=self._create_warm, delete=self._delete_pod
        )
        self._pools.start()

    async def _clean_up(self) -> None:
        """Delete pods and policies labelled as this instance's (it owns none yet: a previous run left them)
        and every orchard pod or policy in the namespace whose expiry annotation has passed."""
        ns, now, selector = self._cfg.namespace, time.time(), f"{m.MANAGED_BY}={m.MANAGER}"
        pods = await self._call("list pods", self._core.list_namespaced_pod, ns, label_selector=selector)
        policies = await self._call(
            "list network policies",
            self._net.list_namespaced_network_policy,
            ns,
            label_selector=f"{selector},{m.LABEL_SANDBOX}",
        )

        def stale(meta: Any) -> bool:
            mine = (meta.labels or {}).get(m.LABEL_SERVICE) == self._cfg.service_id
            return mine or m.expired({"annotations": meta.annotations}, now)

        doomed_pods = [p.metadata.name for p in pods.items if stale(p.metadata)]
        doomed_policies = [p.metadata.name for p in policies.items if stale(p.metadata)]
        await asyncio.gather(*map(self._delete_pod, doomed_pods), *map(self._delete_policy, doomed_policies))
        if doomed_pods or doomed_policies:
            log.info(
                "removed %d pods and %d network policies left by earlier runs or expired",
                len(doomed_pods),
                len(doomed_policies),
            )

    def _pod_ended(self, state: PodState) -> None:
        """A pod turned ended (the watch): if it serves a sandbox, tell the manager why and close its agent's
        connection, so commands in flight fail at once (a lost node's connection may never break by itself)."""
        sid = next((sid for sid, pod in self._pods.items() if pod.name == state.name), None)
        pod = self._pods.get(sid) if sid is not None else None
        if sid is None or pod is None or pod.client is None:
            return  # a warm pod (its pool replaces it), or one still starting (create's wait reports it)
        why = f"its pod {state.name} died: {state.ended}"
        log.warning("sandbox %s failed: %s", sid, why)
        self._report(sid, why)
        task = asyncio.create_task(pod.client.close(why), name=f"close-agent-{sid}")
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    async def close(self) -> None:
        if self._pools is not None:
            await self._pools.close()
        await asyncio.gather(*self._closing, return_exceptions=True)
        await asyncio.gather(*(self.destroy(sid) for sid in list(self._pods)), return_exceptions=True)
        if self._cache is not None:
            await self._cache.close()
        if self._api is not None:
            await asyncio.to_thread(self._api.close)

    # ---- sandboxes ----

    def container_image(self, image: str) -> str:
        """The container image of a sandbox image name."""
        return self._settings.k8s_images.get(image) or f"{self._settings.k8s_image_prefix}{image}"

    def _pod_manifest(
        self,
        name: str,
        token: str,
        *,
        image: str,
        workdir: str,
        env: dict[str, str],
        resources: Resources,
        sandbox_id: str | None,
        tenant: str,
        expire_s: float,
        isolation: str = "container",
    ) -> dict[str, Any]:
        return m.sandbox_pod(
            self._cfg,
            name=name,
            image=image,
            container_image=self.container_image(image),
            token=token,
            workdir=workdir,
            env=env,
            resources=resources,
            expire_s=expire_s,
            ttl_s=max(expire_s - time.time(), 1),
            tenant=tenant,
            sandbox_id=sandbox_id,
            runtime_class=self._runtime_class(isolation),
        )

    def _runtime_class(self, isolation: str) -> str | None:
        """The RuntimeClass of a sandbox's pod: gVisor's for isolation "gvisor", else the service's (if any)."""
        return self._settings.k8s_gvisor_runtime_class if isolation == "gvisor" else self._cfg.runtime_class

    async def _create_pod(self, manifest: dict[str, Any]) -> None:
        await self._send(
            f"create pod {manifest['metadata']['name']}",
            self._core.create_namespaced_pod,
            self._cfg.namespace,
            manifest,
        )

    async def _create_warm(self, image: str) -> WarmPod:
        pod = WarmPod(
            name=f"orchard-{secrets.token_hex(5)}", token=secrets.token_urlsafe(24), image=image, created_s=time.time()
        )
        # Until handed out it belongs to no tenant, and lives no longer than any sandbox may.
        await self._create_pod(
            self._pod_manifest(
                pod.name,
                pod.token,
                image=image,
                workdir=WARM_WORKDIR,
                env={},
                resources=self._defaults,
                sandbox_id=None,
                tenant="",
                expire_s=pod.created_s + self._settings.max_ttl_s,
            )
        )
        return pod

    def _fits_pool(self, spec: SandboxSpec) -> bool:
        return (
            not spec.env
            and spec.resources == self._defaults
            and self._runtime_class(spec.isolation) == self._cfg.runtime_class
        )

    async def create(self, spec: SandboxSpec) -> AgentClient:
        sid = spec.sandbox_id
        snapshot = snapshots.files_of(self._snapshots, spec.layers[0]) if spec.layers else None
        expire_s = spec.expire_time or time.time() + self._settings.max_ttl_s
        tenant = spec.tenant or tenancy.current_tenant()
        # Built first: a rule NetworkPolicy cannot express fails the create before any pod exists.
        policy = m.egress_policy(self._cfg, sid, spec.egress, expire_s=expire_s) if spec.egress else None
        assert self._pools is not None
        warm = self._pools.take(spec.image) if self._fits_pool(spec) else None
        pod = (
            _Pod(warm.name, warm.token, expire_s)
            if warm
            else _Pod(f"orchard-{secrets.token_hex(5)}", secrets.token_urlsafe(24), expire_s)
        )
        self._pods[sid] = pod  # from here on destroy() removes whatever was made
        try:
            if warm is not None:
                patch = m.handout_patch(sid, tenant=tenant, expire_s=expire_s, deadline_s=expire_s - warm.created_s)
                await self._send(
                    f"hand out warm pod {pod.name}",
                    self._core.patch_namespaced_pod,
                    pod.name,
                    self._cfg.namespace,
                    patch,
                    _content_type=MERGE_PATCH,
                )
            else:
                await self._create_pod(
                    self._pod_manifest(
                        pod.name,
                        pod.token,
                        image=spec.image,
                        workdir=spec.workdir,
                        env=spec.env,
                        resources=spec.resources,
                        sandbox_id=sid,
                        tenant=tenant,
                        expire_s=expire_s,
                        isolation=spec.isolation,
                    )
                )
            if policy is not None:
                await self._apply_policy(pod, policy)
            state = await self._started(pod.name, sid)
            pod.client = await connect_tcp(
                state.ip, self._cfg.agent_port, pod.token, label=sid, timeout=self._settings.agent_start_timeout_s
            )
            pod.since = await snapshots.pod_clock(pod.client)
            if snapshot is not None:
                await snapshots.restore(pod.client, snapshot)
            if warm is not None:
                await _make_dir(pod.client, spec.workdir)
        except BaseException:
            await self.destroy(sid)
            raise
        return pod.client

    async def _started(self, name: str, sandbox_id: str) -> PodState:
        assert self._cache is not None
        timeout = self._settings.k8s_start_timeout_s
        try:
            state = await self._cache.wait(name, lambda s: s.running, timeout)
        except TimeoutError:
            state = self._cache.get(name) or PodState(name)
            raise Unavailable(
                f"pod {name} of sandbox {sandbox_id} did not start within {timeout:.0f}s (phase "
                f"{state.phase}); see `kubectl -n {self._cfg.namespace} describe pod {name}`"
            ) from None
        if state.ended:
            raise Unavailable(
                f"pod {name} of sandbox {sandbox_id} cannot serve: {state.ended}; see "
                f"`kubectl -n {self._cfg.namespace} describe pod {name}`"
            )
        return state

    async def destroy(self, sandbox_id: str) -> None:
        pod = self._pods.pop(sandbox_id, None)
        if pod is None:
            return
        if pod.client is not None:
            await pod.client.close("the sandbox was deleted")
        await self._delete_pod(pod.name)
        if pod.has_policy:
            await self._delete_policy(m.egress_policy_name(sandbox_id))
        if self._cache is not None:
            self._cache.forget(pod.name)

    async def _apply_policy(self, pod: _Pod, policy: dict[str, Any]) -> None:
        """Create the sandbox's allow policy, or replace it in one step."""
        body = policy
        name, ns = policy["metadata"]["name"], self._cfg.namespace
        if not pod.has_policy:
            try:
                await self._send(f"create network policy {name}", self._net.create_namespaced_network_policy, ns, body)
                pod.has_policy = True
                return
            except AlreadyExists:
                pod.has_policy = True
        await self._send(
            f"replace network policy {name}",
            self._net.patch_namespaced_network_policy,
            name,
            ns,
            _replace_spec(policy),
            _content_type=JSON_PATCH,
        )

    async def set_egress(self, sandbox_id: str, rules: tuple[EgressRule, ...]) -> None:
        pod = self._pods.get(sandbox_id)
        if pod is None:
            raise NotFound(f"sandbox {sandbox_id!r} has no pod")
        if rules:
            policy = m.egress_policy(self._cfg, sandbox_id, rules, expire_s=pod.expire_s)
            await self._apply_policy(pod, policy)
        elif pod.has_policy:  # no rules: the deny-all policy alone is in force
            await self._delete_policy(m.egress_policy_name(sandbox_id))
            pod.has_policy = False

    async def snapshot(self, sandbox_id: str, snapshot_id: str) -> SnapshotFiles:
        """What the pod's files became since it started, saved by its agent to the service's disk: one layer
        (a fork's own snapshot holds what it restored too)."""
        pod = self._pods.get(sandbox_id)
        if pod is None or pod.client is None:
            raise NotFound(f"sandbox {sandbox_id!r} has no pod")
        if not pod.since:
            raise FailedPrecondition(f"{snapshots.NEEDS}: `date` did not run when the sandbox started")
        limit = self._settings.k8s_snapshot_max_bytes
        size = await snapshots.take(pod.client, pod.since, self._snapshots / snapshot_id, limit)
        return SnapshotFiles(layers=(snapshot_id,), size_bytes=size)

    async def stored_snapshots(self) -> set[str]:
        return await asyncio.to_thread(snapshots.stored, self._snapshots)

    async def delete_snapshot(self, snapshot_id: str) -> None:
        await asyncio.to_thread(shutil.rmtree, self._snapshots / snapshot_id, ignore_errors=True)

    async def oom_kills(self, sandbox_id: str) -> int:
        """The pod cgroup's oom_kill count, read by the agent; at least 1 once the container was OOMKilled."""
        pod = self._pods.get(sandbox_id)
        if pod is None or self._cache is None:
            return 0
        state = self._cache.get(pod.name)
        killed = 1 if state is not None and state.oom_killed else 0
        if pod.client is None or not pod.client.alive:
            return killed
        try:
            _, data = await pod.client.call("read", path=MEMORY_EVENTS, offset=0, length=4096)
        except OrchardError:  # no cgroup v2 file there (or the agent is going): nothing counted
            return killed
        counts = dict(line.split(" ", 1) for line in data.decode().splitlines() if " " in line)
        return max(killed, int(counts.get("oom_kill", "0")))

    def warm_pods(self, image: str) -> list[str]:
        """Names of the pods waiting in image's warm pool (started or not)."""
        return [p.name for p in self._pools.waiting(image)] if self._pools else []


async def _make_dir(client: AgentClient, path: str) -> None:
    """mkdir -p path in the sandbox (a warm pod was started before its workdir was known)."""
    if path == WARM_WORKDIR:
        return
    async for event in client.exec(
        ["mkdir", "-p", "--", path], cwd="/", env={}, stdin=b"", timeout=30, max_output=4096
    ):
        if event.kind == "exit" and event.exit_code != 0:
            raise FailedPrecondition(
                f"cannot make the workdir {path!r} in the sandbox (mkdir exited {event.exit_code})"
            )


def _replace_spec(manifest: dict[str, Any]) -> list[dict[str, Any]]:
    """A JSON patch that swaps an object's spec for manifest's whole, in one step. (A merge patch would merge the
    maps inside it, and PUT needs the "update" right, which deploy/k8s/base/env-rbac.yaml does not grant.)"""
    return [{"op": "replace", "path": "/spec", "value": manifest["spec"]}]


def _api_error(what: str, err: Any) -> OrchardError:
    """An ApiException as the OrchardError of the same meaning."""
    import json

    try:
        message = json.loads(err.body or "{}").get("message") or err.reason
    except ValueError:
        message = err.reason
    text = f"cannot {what}: Kubernetes API said {err.status}: {message}"
    if err.status == 403 and "exceeded quota" in message:
        return ResourceExhausted(f"{text}; delete sandboxes or raise the namespace's ResourceQuota", retry_after=5.0)
    if err.status in (401, 403):
        return FailedPrecondition(f"{text} (give the service's account the rights in deploy/k8s/base/env-rbac.yaml)")
    cls = {404: NotFound, 409: AlreadyExists, 422: InvalidArgument}.get(err.status, Unavailable)
    return cls(text)
