"""What the kubernetes backend sends to the API, as plain dicts: a sandbox's Pod (also a warm pool's), the patch
that hands a warm pod out, the namespace's deny-all-egress NetworkPolicy and a sandbox's allow policy, plus the
labels and annotations that say who owns an object and when it expires. Pure functions: no API calls."""

from __future__ import annotations

import hashlib
import ipaddress
import math
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from orchard.errors import FailedPrecondition
from orchard.services.env.backends.base import EgressRule, Resources

MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGER = "orchard-env"
LABEL_ROLE = "orchard.dev/role"  # "sandbox" on every sandbox pod, warm or handed out: what deny-all selects
LABEL_SERVICE = "orchard.dev/service"  # the instance that owns the object
LABEL_SANDBOX = "orchard.dev/sandbox-id"  # only once a pod is a sandbox: what its allow policy selects
LABEL_POOL = "orchard.dev/warm-pool"  # only while a pod waits in a warm pool: a hash of its image
ANN_EXPIRE = "orchard.dev/expire-time"  # RFC 3339; past it any instance may delete the object
ANN_TENANT = "orchard.dev/tenant"
ANN_IMAGE = "orchard.dev/image"  # the sandbox image name (label values cannot hold ':' or '/')
CONTAINER = "sandbox"
AGENT_DIR = "/.orchard/bin"
AGENT_PATH = f"{AGENT_DIR}/orchard-agent"
TOKEN_ENV = "ORCHARD_AGENT_TOKEN"
POD_IP_ENV = "ORCHARD_POD_IP"
DENY_POLICY = "orchard-sandboxes-deny-egress"
SANDBOX_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
DEADLINE_SLACK_S = 60  # the service deletes a sandbox at its TTL; the kubelet's deadline is only a backstop
INIT_RESOURCES = {"cpu": "100m", "memory": "32Mi"}
# Root in the sandbox (package installs), but without the capabilities that reach beyond it.
SANDBOX_CAPS = ["CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "SETGID", "SETUID"]


@dataclass(frozen=True)
class PodConfig:
    """The service-wide part of every sandbox pod (from EnvSettings)."""

    namespace: str
    service_id: str
    agent_image: str
    agent_port: int
    runtime_class: str | None = None


def label_value(text: str) -> str:
    """text as a label value (<= 63 of [A-Za-z0-9-_.], alphanumeric at both ends), or a hash of it."""
    ok = len(text) <= 63 and all(c.isascii() and (c.isalnum() or c in "-_.") for c in text)
    if ok and text[:1].isalnum() and text[-1:].isalnum():
        return text
    return "h-" + hashlib.sha256(text.encode()).hexdigest()[:16]


def pool_label(image: str) -> str:
    """The warm-pool label of an image's pods: a hash (image names hold ':' and '/', label values cannot)."""
    return "h-" + hashlib.sha256(image.encode()).hexdigest()[:16]


def rfc3339(epoch_s: float) -> str:
    return datetime.fromtimestamp(epoch_s, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def expire_epoch(annotations: dict[str, str] | None) -> float | None:
    """When an object expires by its annotation; None when it has none or an unreadable one."""
    text = (annotations or {}).get(ANN_EXPIRE, "")
    try:
        return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()
    except ValueError:
        return None


def expired(metadata: dict[str, Any], now: float) -> bool:
    """Whether an object's expiry annotation has passed (one without a readable annotation never expires)."""
    at = expire_epoch(metadata.get("annotations"))
    return at is not None and at <= now


def resource_list(res: Resources) -> dict[str, str]:
    """The set limits as Kubernetes quantities; 0 = unlimited = left out."""
    quantities = {
        "cpu": f"{res.cpu_millis}m" if res.cpu_millis else "",
        "memory": str(res.memory_bytes) if res.memory_bytes else "",
        "ephemeral-storage": str(res.disk_bytes) if res.disk_bytes else "",
    }
    return {k: v for k, v in quantities.items() if v}


def _labels(cfg: PodConfig, sandbox_id: str | None, image: str) -> dict[str, str]:
    labels = {MANAGED_BY: MANAGER, LABEL_SERVICE: cfg.service_id, LABEL_ROLE: "sandbox"}
    if sandbox_id is None:
        labels[LABEL_POOL] = pool_label(image)
    else:
        labels[LABEL_SANDBOX] = sandbox_id
    return labels


def sandbox_pod(
    cfg: PodConfig,
    *,
    name: str,
    image: str,
    container_image: str,
    token: str,
    workdir: str,
    env: dict[str, str],
    resources: Resources,
    expire_s: float,
    ttl_s: float,
    tenant: str,
    sandbox_id: str | None,
    runtime_class: str | None = None,
) -> dict[str, Any]:
    """The Pod of one sandbox (sandbox_id None: a warm pool's, handed out later with handout_patch).

    The init container installs the agent from its own image into an emptyDir; the sandbox container runs it on
    the Pod IP. Requests equal limits, so the scheduler reserves what the sandbox may use. Never privileged, the
    runtime's default seccomp profile, no privilege escalation: the runtime's masked and read-only /proc paths
    stay. `runtime_class` (e.g. gVisor's) overrides the service's.
    """
    limits = resource_list(resources)
    agent_env = [
        {"name": POD_IP_ENV, "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": TOKEN_ENV, "value": token},
    ]
    base_env = {"PATH": SANDBOX_PATH, "HOME": "/root", "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1"}
    if sandbox_id is not None:
        base_env["ORCHARD_SANDBOX_ID"] = sandbox_id
    spec: dict[str, Any] = {
        "restartPolicy": "Never",  # the agent's end is the sandbox's end
        "automountServiceAccountToken": False,  # sandbox code gets no API credentials
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": 5,
        "activeDeadlineSeconds": math.ceil(ttl_s) + DEADLINE_SLACK_S,
        "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
        "volumes": [{"name": "orchard-agent", "emptyDir": {"sizeLimit": "64Mi"}}],
        "initContainers": [
            {
                "name": "install-agent",
                "image": cfg.agent_image,
                "imagePullPolicy": "IfNotPresent",
                "command": ["/orchard-agent", "--install", AGENT_PATH],
                "resources": {"requests": INIT_RESOURCES, "limits": INIT_RESOURCES},
                "securityContext": {
                    "allowPrivilegeEscalation": False,
                    "readOnlyRootFilesystem": True,
                    "capabilities": {"drop": ["ALL"]},
                },
                "volumeMounts": [{"name": "orchard-agent", "mountPath": AGENT_DIR}],
            }
        ],
        "containers": [
            {
                "name": CONTAINER,
                "image": container_image,
                "imagePullPolicy": "IfNotPresent",
                # The kubelet expands $(ORCHARD_POD_IP): the agent listens on the Pod IP alone.
                "command": [AGENT_PATH, "--listen-tcp", f"$({POD_IP_ENV}):{cfg.agent_port}"],
                "workingDir": workdir,
                "env": agent_env + [{"name": k, "value": v} for k, v in {**base_env, **env}.items()],
                "ports": [{"name": "agent", "containerPort": cfg.agent_port, "protocol": "TCP"}],
                "readinessProbe": {"tcpSocket": {"port": "agent"}, "periodSeconds": 5},
                "resources": {"requests": limits, "limits": limits},
                "securityContext": {
                    "allowPrivilegeEscalation": False,
                    "capabilities": {"drop": ["ALL"], "add": SANDBOX_CAPS},
                },
                "volumeMounts": [{"name": "orchard-agent", "mountPath": AGENT_DIR, "readOnly": True}],
            }
        ],
    }
    if runtime_class or cfg.runtime_class:
        spec["runtimeClassName"] = runtime_class or cfg.runtime_class
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": cfg.namespace,
            "labels": _labels(cfg, sandbox_id, image),
            "annotations": {ANN_EXPIRE: rfc3339(expire_s), ANN_TENANT: tenant, ANN_IMAGE: image},
        },
        "spec": spec,
    }


def handout_patch(sandbox_id: str, *, tenant: str, expire_s: float, deadline_s: float) -> dict[str, Any]:
    """A JSON merge patch that makes a warm pod sandbox_id's: its label (so its allow policy selects it), the
    pool label gone (so no pool counts it), the tenant and expiry, and a kubelet deadline of deadline_s."""
    return {
        "metadata": {
            "labels": {LABEL_SANDBOX: sandbox_id, LABEL_POOL: None},
            "annotations": {ANN_TENANT: tenant, ANN_EXPIRE: rfc3339(expire_s)},
        },
        "spec": {"activeDeadlineSeconds": math.ceil(deadline_s) + DEADLINE_SLACK_S},
    }


def deny_egress_policy(cfg: PodConfig) -> dict[str, Any]:
    """The namespace's baseline: sandbox pods (warm ones too) may send nothing, unless an allow policy says so."""
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": DENY_POLICY, "namespace": cfg.namespace, "labels": {MANAGED_BY: MANAGER}},
        "spec": {"podSelector": {"matchLabels": {LABEL_ROLE: "sandbox"}}, "policyTypes": ["Egress"], "egress": []},
    }


def egress_policy_name(sandbox_id: str) -> str:
    return f"orchard-egress-{sandbox_id}"


def egress_policy(cfg: PodConfig, sandbox_id: str, rules: tuple[EgressRule, ...], *, expire_s: float) -> dict[str, Any]:
    """The policy that lets one sandbox reach its allowlist (policies add up: deny-all stays in force for the rest).

    NetworkPolicy matches IP blocks only, so a host-name rule is FailedPrecondition.
    """
    egress = []
    for i, rule in enumerate(rules):
        if rule.host:
            raise FailedPrecondition(
                f"network_policy rule {i}: host {rule.host!r} cannot be enforced by the kubernetes backend "
                "(a NetworkPolicy matches IP blocks only); give the host's addresses as cidr rules instead"
            )
        entry: dict[str, Any] = {"to": [{"ipBlock": {"cidr": str(ipaddress.ip_network(rule.cidr, strict=False))}}]}
        if rule.port:
            entry["ports"] = [{"protocol": proto, "port": rule.port} for proto in ("TCP", "UDP")]
        egress.append(entry)
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {
            "name": egress_policy_name(sandbox_id),
            "namespace": cfg.namespace,
            "labels": {MANAGED_BY: MANAGER, LABEL_SERVICE: cfg.service_id, LABEL_SANDBOX: sandbox_id},
            "annotations": {ANN_EXPIRE: rfc3339(expire_s)},
        },
        "spec": {
            "podSelector": {"matchLabels": {LABEL_SANDBOX: sandbox_id}},
            "policyTypes": ["Egress"],
            "egress": egress,
        },
    }
