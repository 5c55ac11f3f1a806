"""Every manifest the kubernetes backend builds, validated offline against the Kubernetes 1.37 schemas
(kubernetes-validate, strict) and read back for what it must say: requests = limits, ownership labels, expiry."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from orchard.errors import FailedPrecondition
from orchard.services.env.backends import k8s_manifests as m
from orchard.services.env.backends.base import EgressRule, Resources
from orchard.services.env.backends.k8s_watch import PodState

kubernetes_validate = pytest.importorskip("kubernetes_validate", reason="pip install kubernetes-validate (dev extras)")
client = pytest.importorskip("kubernetes.client", reason="pip install 'orchard[kubernetes]'")

pytestmark = [pytest.mark.timeout(60)]

K8S_VERSION = "1.37.0"
CFG = m.PodConfig(namespace="orchard-sandboxes", service_id="env-0", agent_image="orchard-agent:1", agent_port=7070)
GVISOR = m.PodConfig(
    namespace="sb",
    service_id="env-1",
    agent_image="reg.example/agent@sha256:" + "a" * 64,
    agent_port=9000,
    runtime_class="gvisor",
)
NOW = 1_900_000_000.0


def validate(doc: dict[str, Any]) -> None:
    kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def pod(
    cfg: m.PodConfig = CFG,
    *,
    sandbox_id: str | None = "sb-1",
    resources: Resources | None = None,
    env: dict[str, str] | None = None,
    workdir: str = "/workspace",
    image: str = "python:3.11-slim",
) -> dict:
    return m.sandbox_pod(
        cfg,
        name="orchard-0123456789",
        image=image,
        container_image=f"reg/{image}",
        token="k" * 32,
        workdir=workdir,
        env=env or {},
        resources=resources or Resources(),
        expire_s=NOW + 600,
        ttl_s=600,
        tenant="team-a",
        sandbox_id=sandbox_id,
    )


SPECS = {
    "unlimited": {},
    "cpu+memory": {"resources": Resources(cpu_millis=1500, memory_bytes=512 << 20)},
    "all limits": {"resources": Resources(cpu_millis=250, memory_bytes=1 << 30, pids=100, disk_bytes=10 << 30)},
    "env+workdir": {"env": {"A": "1", "EMPTY": "", "WEIRD": "x=y $(NOT_EXPANDED)"}, "workdir": "/home/u/src"},
    "gvisor": {"cfg": GVISOR, "resources": Resources(cpu_millis=1000, memory_bytes=2 << 30)},
    "warm": {"sandbox_id": None, "resources": Resources(cpu_millis=500, memory_bytes=256 << 20), "workdir": "/"},
    "registry image": {"image": "ghcr.io/org/img:v1.2"},
}


class _Response:
    """What ApiClient.deserialize reads from an HTTP response."""

    def __init__(self, doc: dict[str, Any]) -> None:
        self.data = json.dumps(doc)


def roundtrip(doc: dict[str, Any], kind: str) -> Any:
    """The document through the client's own model of `kind` and back: unchanged iff every field is known to it."""
    api = client.ApiClient()
    return api.sanitize_for_serialization(api.deserialize(_Response(doc), kind))


@pytest.mark.parametrize("kw", SPECS.values(), ids=SPECS.keys())
def test_pods_are_valid_and_requests_equal_limits(kw: dict[str, Any]) -> None:
    doc = pod(**kw)
    validate(doc)
    spec = doc["spec"]
    for container in spec["containers"] + spec["initContainers"]:
        assert container["resources"]["requests"] == container["resources"]["limits"]
    assert spec["automountServiceAccountToken"] is False and spec["restartPolicy"] == "Never"
    main = spec["containers"][0]
    assert main["command"] == [m.AGENT_PATH, "--listen-tcp", f"$(ORCHARD_POD_IP):{(kw.get('cfg') or CFG).agent_port}"]
    env = {e["name"]: e for e in main["env"]}
    assert env["ORCHARD_POD_IP"]["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    assert env[m.TOKEN_ENV]["value"] == "k" * 32
    # The client's models carry the manifest unchanged (what the backend sends is what was validated).
    assert roundtrip(doc, "V1Pod") == doc


def test_resources_are_quantities() -> None:
    res = Resources(cpu_millis=1500, memory_bytes=512 << 20, pids=64, disk_bytes=3 << 30)
    assert m.resource_list(res) == {"cpu": "1500m", "memory": str(512 << 20), "ephemeral-storage": str(3 << 30)}
    assert m.resource_list(Resources()) == {}


def test_labels_say_owner_and_role() -> None:
    labels = pod()["metadata"]["labels"]
    assert labels == {
        m.MANAGED_BY: "orchard-env",
        m.LABEL_SERVICE: "env-0",
        m.LABEL_ROLE: "sandbox",
        m.LABEL_SANDBOX: "sb-1",
    }
    warm = pod(sandbox_id=None)["metadata"]["labels"]
    assert m.LABEL_SANDBOX not in warm and warm[m.LABEL_POOL] == m.pool_label("python:3.11-slim")
    assert warm[m.LABEL_ROLE] == "sandbox"  # so the deny-all policy holds a warm pod too
    assert "ORCHARD_SANDBOX_ID" not in {e["name"] for e in pod(sandbox_id=None)["spec"]["containers"][0]["env"]}
    annotations = pod()["metadata"]["annotations"]
    assert annotations == {
        m.ANN_EXPIRE: "2030-03-17T17:56:40Z",
        m.ANN_TENANT: "team-a",
        m.ANN_IMAGE: "python:3.11-slim",
    }
    assert pod()["spec"]["activeDeadlineSeconds"] == 600 + m.DEADLINE_SLACK_S


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386, as the API server applies application/merge-patch+json."""
    if not isinstance(patch, dict):
        return patch
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def test_handout_patch_makes_a_warm_pod_a_sandbox() -> None:
    patch = m.handout_patch("sb-9", tenant="team-b", expire_s=NOW + 60, deadline_s=75.2)
    handed = merge_patch(pod(sandbox_id=None), patch)
    validate(handed)
    assert handed["metadata"]["labels"][m.LABEL_SANDBOX] == "sb-9"
    assert m.LABEL_POOL not in handed["metadata"]["labels"]
    assert handed["metadata"]["annotations"][m.ANN_TENANT] == "team-b"
    assert m.expire_epoch(handed["metadata"]["annotations"]) == NOW + 60
    assert handed["spec"]["activeDeadlineSeconds"] == 76 + m.DEADLINE_SLACK_S


@pytest.mark.parametrize("text", ["sb-1", "a" * 63, "x.y_z"])
def test_label_value_keeps_valid_values(text: str) -> None:
    assert m.label_value(text) == text


@pytest.mark.parametrize("text", ["", "a" * 64, "-lead", "trail-", "has:colon", "ünïcode", "my host"])
def test_label_value_hashes_the_rest(text: str) -> None:
    value = m.label_value(text)
    assert value.startswith("h-") and len(value) == 18 and m.label_value(text) == value


def test_expiry_round_trips_and_bad_values_never_expire() -> None:
    assert m.expire_epoch({m.ANN_EXPIRE: m.rfc3339(NOW)}) == NOW
    assert m.expired({"annotations": {m.ANN_EXPIRE: m.rfc3339(NOW)}}, NOW + 1)
    assert not m.expired({"annotations": {m.ANN_EXPIRE: m.rfc3339(NOW)}}, NOW - 1)
    for bad in ({}, None, {m.ANN_EXPIRE: "tomorrow"}, {m.ANN_EXPIRE: "2030-03-17 17:46:40"}):
        assert m.expire_epoch(bad) is None
        assert not m.expired({"annotations": bad}, time.time())


RULES = {
    "one cidr any port": (EgressRule(cidr="10.0.0.0/8"),),
    "address and port": (EgressRule(cidr="203.0.113.7", port=443),),
    "host bits normalised": (EgressRule(cidr="192.168.1.77/24", port=53),),
    "ipv6": (EgressRule(cidr="2001:db8::/32", port=8443), EgressRule(cidr="::1")),
    "many": tuple(EgressRule(cidr=f"10.{i}.0.0/16", port=1000 + i) for i in range(20)),
}


@pytest.mark.parametrize("rules", RULES.values(), ids=RULES.keys())
def test_egress_policies_are_valid(rules: tuple[EgressRule, ...]) -> None:
    doc = m.egress_policy(CFG, "sb-1", rules, expire_s=NOW)
    validate(doc)
    assert doc["spec"]["podSelector"] == {"matchLabels": {m.LABEL_SANDBOX: "sb-1"}}
    assert doc["spec"]["policyTypes"] == ["Egress"] and len(doc["spec"]["egress"]) == len(rules)
    for rule, entry in zip(rules, doc["spec"]["egress"], strict=True):
        assert entry.get("ports", []) == (
            [{"protocol": p, "port": rule.port} for p in ("TCP", "UDP")] if rule.port else []
        )
    assert roundtrip(doc, "V1NetworkPolicy") == doc


def test_egress_cidrs_are_normalised() -> None:
    doc = m.egress_policy(CFG, "sb-1", RULES["address and port"] + RULES["host bits normalised"], expire_s=NOW)
    assert [e["to"][0]["ipBlock"]["cidr"] for e in doc["spec"]["egress"]] == ["203.0.113.7/32", "192.168.1.0/24"]


def test_host_rules_are_refused_clearly() -> None:
    rules = (EgressRule(cidr="10.0.0.0/8"), EgressRule(host="pypi.org", port=443))
    with pytest.raises(FailedPrecondition, match=r"rule 1: host 'pypi.org' .* IP blocks only.*cidr rules"):
        m.egress_policy(CFG, "sb-1", rules, expire_s=NOW)


def test_deny_all_policy_selects_every_sandbox_pod() -> None:
    doc = m.deny_egress_policy(CFG)
    validate(doc)
    assert doc["spec"] == {
        "podSelector": {"matchLabels": {m.LABEL_ROLE: "sandbox"}},
        "policyTypes": ["Egress"],
        "egress": [],
    }
    assert roundtrip(doc, "V1NetworkPolicy") == doc


def test_invalid_manifest_is_caught_by_the_validator() -> None:
    """The check has teeth: a misspelt field fails strict validation."""
    doc = pod()
    doc["spec"]["containers"][0]["workDir"] = doc["spec"]["containers"][0].pop("workingDir")
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(doc)


POD_STATUSES = {
    "pending": ({"phase": "Pending"}, {"running": False, "ended": "", "ip": ""}),
    "running": (
        {"phase": "Running", "podIP": "10.1.2.3", "containerStatuses": [{"name": "sandbox", "state": {"running": {}}}]},
        {"running": True, "ended": "", "ip": "10.1.2.3"},
    ),
    "pull error": (
        {
            "phase": "Pending",
            "containerStatuses": [
                {"name": "sandbox", "state": {"waiting": {"reason": "ImagePullBackOff", "message": "no such image"}}}
            ],
        },
        {"running": False, "ended": "its container cannot start: ImagePullBackOff: no such image"},
    ),
    "oom": (
        {
            "phase": "Failed",
            "podIP": "10.1.2.3",
            "containerStatuses": [
                {"name": "sandbox", "state": {"terminated": {"reason": "OOMKilled", "exitCode": 137}}}
            ],
        },
        {"running": False, "ended": "its container ended: OOMKilled (exit code 137)", "oom_killed": True},
    ),
    "evicted": (
        {
            "phase": "Failed",
            "reason": "Evicted",
            "message": "The node was low on resource: memory.",
            "containerStatuses": [{"name": "sandbox", "state": {"terminated": {"reason": "Error", "exitCode": 137}}}],
        },
        {
            "ended": "pod failed: Evicted: The node was low on resource: memory.; its container ended: Error "
            "(exit code 137)",
            "oom_killed": False,
        },
    ),
    "deadline": ({"phase": "Failed", "reason": "DeadlineExceeded"}, {"ended": "pod failed: DeadlineExceeded"}),
}


@pytest.mark.parametrize(("status", "expected"), POD_STATUSES.values(), ids=POD_STATUSES.keys())
def test_pod_state_from_status(status: dict[str, Any], expected: dict[str, Any]) -> None:
    state = PodState.of({"metadata": {"name": "p", "labels": {"a": "b"}}, "status": status})
    assert state.name == "p" and state.labels == {"a": "b"}
    assert {k: getattr(state, k) for k in expected} == expected


@pytest.mark.parametrize("kw", SPECS.values(), ids=SPECS.keys())
def test_pods_keep_the_runtime_defaults(kw: dict[str, Any]) -> None:
    """No pod is privileged, adds a dangerous capability, escalates privileges, or leaves the runtime's default
    seccomp profile (which is also what keeps its masked and read-only /proc paths: nothing sets procMount)."""
    spec = pod(**kw)["spec"]
    assert spec["securityContext"] == {"seccompProfile": {"type": "RuntimeDefault"}}
    assert "hostPID" not in spec and "hostNetwork" not in spec and "hostIPC" not in spec
    for container in spec["containers"] + spec["initContainers"]:
        ctx = container["securityContext"]
        assert ctx.get("privileged") is not True and ctx["allowPrivilegeEscalation"] is False
        assert "procMount" not in ctx and ctx["capabilities"]["drop"] == ["ALL"]
        assert not set(ctx["capabilities"].get("add", [])) & {
            "SYS_ADMIN",
            "NET_ADMIN",
            "SYS_PTRACE",
            "SYS_MODULE",
            "NET_RAW",
            "SYS_RAWIO",
            "MKNOD",
        }


def test_a_gvisor_sandbox_names_gvisors_runtime_class() -> None:
    plain = m.sandbox_pod(
        CFG,
        name="orchard-x",
        image="i",
        container_image="i",
        token="k" * 32,
        workdir="/w",
        env={},
        resources=Resources(),
        expire_s=NOW,
        ttl_s=60,
        tenant="t",
        sandbox_id="sb-2",
    )
    gvisor = m.sandbox_pod(
        CFG,
        name="orchard-x",
        image="i",
        container_image="i",
        token="k" * 32,
        workdir="/w",
        env={},
        resources=Resources(),
        expire_s=NOW,
        ttl_s=60,
        tenant="t",
        sandbox_id="sb-2",
        runtime_class="gvisor",
    )
    assert "runtimeClassName" not in plain["spec"] and gvisor["spec"]["runtimeClassName"] == "gvisor"
    validate(gvisor)
