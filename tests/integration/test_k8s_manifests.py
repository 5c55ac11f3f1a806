"""Offline checks of deploy/k8s: `kubectl kustomize` renders base and each overlay, every document passes
kubernetes-validate strict for Kubernetes 1.37, and what the documents say is checked (nothing is applied)."""

from __future__ import annotations

import shutil
import subprocess
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
TARGETS = ("base", "overlays/dev", "overlays/prod")
K8S_VERSION = "1.37.0"
NAMESPACE = "orchard"
SANDBOX_NAMESPACE = "orchard-sandboxes"


def _kubectl() -> str | None:
    path = shutil.which("kubectl")
    if path is None:
        return None
    try:
        out = subprocess.run([path, "version", "--client"], capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return path if out.returncode == 0 else None


KUBECTL = _kubectl()
try:
    import kubernetes_validate
except ImportError:  # pragma: no cover - the dev extras install it
    kubernetes_validate = None

pytestmark = [
    pytest.mark.skipif(KUBECTL is None, reason="needs kubectl on PATH (`kubectl kustomize` renders offline)"),
    pytest.mark.skipif(kubernetes_validate is None, reason="needs pip kubernetes-validate (in the dev extras)"),
]


@cache
def _render(target: str) -> tuple[int, str, str]:
    assert KUBECTL is not None
    out = subprocess.run([KUBECTL, "kustomize", str(K8S / target)], capture_output=True, text=True, timeout=30,
                         check=False)
    return out.returncode, out.stdout, out.stderr


def docs(target: str) -> list[dict[str, Any]]:
    rc, stdout, stderr = _render(target)
    assert rc == 0, stderr
    return [d for d in yaml.safe_load_all(stdout) if d]


def find(target: str, kind: str, name: str, namespace: str | None = NAMESPACE) -> dict[str, Any]:
    hits = [d for d in docs(target) if d["kind"] == kind and d["metadata"]["name"] == name
            and d["metadata"].get("namespace") == namespace]
    assert len(hits) == 1, f"{target}: expected one {kind} {namespace}/{name}, found {len(hits)}"
    return hits[0]


def container(workload: dict[str, Any], name: str) -> dict[str, Any]:
    (c,) = [c for c in workload["spec"]["template"]["spec"]["containers"] if c["name"] == name]
    return c


def env_deployment(target: str) -> dict[str, Any]:
    return find(target, "Deployment", "orchard-env")


@pytest.mark.parametrize("target", TARGETS)
def test_kustomize_renders(target: str) -> None:
    """`kubectl kustomize` renders the target with rc 0 and the expected kinds."""
    rc, _, stderr = _render(target)
    assert rc == 0, stderr
    kinds = {d["kind"] for d in docs(target)}
    assert {"Namespace", "ServiceAccount", "Deployment", "Service", "StatefulSet", "Role", "RoleBinding"} <= kinds


@pytest.mark.parametrize("target", TARGETS)
def test_every_document_validates_strictly(target: str) -> None:
    """Every rendered document passes kubernetes-validate strict (schema + no unknown fields) for 1.37."""
    for doc in docs(target):
        try:
            kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
        except kubernetes_validate.ValidationError as e:
            pytest.fail(f"{target}: {doc['kind']}/{doc['metadata']['name']} at {list(e.path)}: {e.message}")


def test_validator_rejects_a_broken_document(tmp_path: Path) -> None:
    """A Deployment with a bad type and an unknown field fails validation (so the check above can fail)."""
    dep = env_deployment("base")
    text = yaml.safe_dump(dep).replace("containerPort: 50051", "containerPort: fifty")
    (tmp_path / "bad.yaml").write_text(text)
    bad = yaml.safe_load((tmp_path / "bad.yaml").read_text())
    with pytest.raises(kubernetes_validate.ValidationError) as err:
        kubernetes_validate.validate(bad, K8S_VERSION, strict=True)
    assert "integer" in err.value.message
    unknown = yaml.safe_load(yaml.safe_dump(dep))
    unknown["spec"]["template"]["spec"]["bogusField"] = 1
    with pytest.raises(kubernetes_validate.ValidationError, match="bogusField"):
        kubernetes_validate.validate(unknown, K8S_VERSION, strict=True)


@pytest.mark.parametrize("target", TARGETS)
def test_env_has_grpc_probes_on_the_named_grpc_port(target: str) -> None:
    """env's readiness and liveness probes are gRPC probes on the port named `grpc` (50051)."""
    c = container(env_deployment(target), "env")
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == {"grpc": 50051, "metrics": 9100}
    for probe in ("readinessProbe", "livenessProbe"):
        assert c[probe]["grpc"]["port"] == ports["grpc"], probe


@pytest.mark.parametrize("target", TARGETS)
def test_env_requests_equal_limits(target: str) -> None:
    """env's (and NATS's) resource requests equal their limits (Guaranteed QoS)."""
    for workload, name in ((env_deployment(target), "env"), (find(target, "StatefulSet", "nats"), "nats")):
        res = container(workload, name)["resources"]
        assert res["requests"] and res["requests"] == res["limits"], name


@pytest.mark.parametrize("target", TARGETS)
def test_env_settings_are_real_env_settings(target: str) -> None:
    """env runs `serve env`, the local backend privileged, and every ORCHARD_ENV_* var names an EnvSettings field."""
    from orchard.services.env.settings import EnvSettings

    c = container(env_deployment(target), "env")
    assert c["args"] == ["serve", "env"]
    env = {e["name"]: e["value"] for e in c["env"]}
    assert env["ORCHARD_ENV_BACKEND"] == "local"
    assert c["securityContext"]["privileged"] is True  # the local backend needs it (see env.yaml)
    assert env["ORCHARD_ENV_METRICS_PORT"] == "9100" and env["ORCHARD_ENV_PORT"] == "50051"
    # extra="forbid": an unknown ORCHARD_ENV_* var would stop the service at start.
    fields = {f.upper() for f in EnvSettings.model_fields}
    assert {k.removeprefix("ORCHARD_ENV_") for k in env if k.startswith("ORCHARD_ENV_")} <= fields


@pytest.mark.parametrize("target", TARGETS)
def test_env_service_exposes_grpc_and_metrics(target: str) -> None:
    """The env Service selects the env pods and exposes the named `grpc` and `metrics` ports."""
    svc = find(target, "Service", "orchard-env")
    ports = {p["name"]: (p["port"], p["targetPort"]) for p in svc["spec"]["ports"]}
    assert ports == {"grpc": (50051, "grpc"), "metrics": (9100, "metrics")}
    labels = env_deployment(target)["spec"]["template"]["metadata"]["labels"]
    assert svc["spec"]["selector"].items() <= labels.items()
    assert env_deployment(target)["spec"]["template"]["spec"]["serviceAccountName"] == "orchard-env"


@pytest.mark.parametrize("target", TARGETS)
def test_nats_is_non_root_read_only_with_jetstream(target: str) -> None:
    """NATS runs JetStream on a claimed volume, as non-root with a read-only root FS, probed on /healthz at 8222."""
    sts = find(target, "StatefulSet", "nats")
    pod = sts["spec"]["template"]["spec"]
    c = container(sts, "nats")
    assert "--jetstream" in c["args"] and c["args"][c["args"].index("--store_dir") + 1] == "/data"
    sc = c["securityContext"]
    assert sc["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] != 0
    assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"]["drop"] == ["ALL"]
    assert {p["name"]: p["containerPort"] for p in c["ports"]} == {"client": 4222, "monitor": 8222}
    for probe in ("readinessProbe", "livenessProbe"):
        assert c[probe]["httpGet"]["path"].startswith("/healthz") and c[probe]["httpGet"]["port"] == "monitor"
    (claim,) = sts["spec"]["volumeClaimTemplates"]
    assert {"name": "data", "mountPath": "/data"} in c["volumeMounts"] and claim["metadata"]["name"] == "data"
    svc = find(target, "Service", "nats")
    assert svc["spec"]["clusterIP"] == "None" and sts["spec"]["serviceName"] == "nats"
    assert {p["port"] for p in svc["spec"]["ports"]} == {4222, 8222}


@pytest.mark.parametrize("target", TARGETS)
def test_rbac_lets_env_manage_sandbox_pods_and_network_policies(target: str) -> None:
    """The orchard-sandboxes Role allows create/delete on pods and networkpolicies, exec, bound to env's SA."""
    find(target, "Namespace", SANDBOX_NAMESPACE, namespace=None)
    role = find(target, "Role", "orchard-env-sandboxes", namespace=SANDBOX_NAMESPACE)
    allowed: dict[tuple[str, str], set[str]] = {}
    for rule in role["rules"]:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                allowed.setdefault((group, resource), set()).update(rule["verbs"])
    assert {"create", "delete", "get", "list", "watch"} <= allowed[("", "pods")]
    assert {"create", "delete", "get", "list", "watch"} <= allowed[("networking.k8s.io", "networkpolicies")]
    assert "create" in allowed[("", "pods/exec")]
    binding = find(target, "RoleBinding", "orchard-env-sandboxes", namespace=SANDBOX_NAMESPACE)
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                  "name": "orchard-env-sandboxes"}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "orchard-env", "namespace": NAMESPACE}]


@pytest.mark.parametrize("target", ("base", "overlays/prod"))
def test_hpa_scales_env_on_cpu(target: str) -> None:
    """The autoscaling/v2 HPA targets the env Deployment on CPU utilization (dev has none)."""
    hpa = find(target, "HorizontalPodAutoscaler", "orchard-env")
    assert hpa["apiVersion"] == "autoscaling/v2"
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "orchard-env"}
    assert hpa["spec"]["minReplicas"] <= hpa["spec"]["maxReplicas"]
    assert [m["resource"]["name"] for m in hpa["spec"]["metrics"]] == ["cpu"]
    assert not [d for d in docs("overlays/dev") if d["kind"] == "HorizontalPodAutoscaler"]


def test_prod_is_bigger_than_dev() -> None:
    """Prod runs more and bigger env replicas than dev; dev uses the `dev` image tag."""
    dev, prod = env_deployment("overlays/dev"), env_deployment("overlays/prod")
    assert dev["spec"]["replicas"] == 1 < prod["spec"]["replicas"]
    assert prod["spec"]["replicas"] <= find("overlays/prod", "HorizontalPodAutoscaler", "orchard-env")["spec"][
        "minReplicas"]
    assert container(dev, "env")["image"] == "orchard:dev"
    dev_res, prod_res = container(dev, "env")["resources"]["limits"], container(prod, "env")["resources"]["limits"]
    assert _cpu(prod_res["cpu"]) > _cpu(dev_res["cpu"])


def _cpu(q: str) -> float:
    return float(q[:-1]) / 1000 if q.endswith("m") else float(q)


def test_prod_network_policy_limits_env_grpc_to_labelled_clients() -> None:
    """Only prod has NetworkPolicies; env's grpc port admits only pods/namespaces labelled as env clients."""
    for target in ("base", "overlays/dev"):
        assert not [d for d in docs(target) if d["kind"] == "NetworkPolicy"], target
    pol = find("overlays/prod", "NetworkPolicy", "orchard-env-ingress")
    labels = env_deployment("overlays/prod")["spec"]["template"]["metadata"]["labels"]
    assert pol["spec"]["podSelector"]["matchLabels"].items() <= labels.items()
    assert pol["spec"]["policyTypes"] == ["Ingress"]
    grpc_rules = [r for r in pol["spec"]["ingress"] if {"port": "grpc", "protocol": "TCP"} in r["ports"]]
    assert len(grpc_rules) == 1 and grpc_rules[0]["ports"] == [{"port": "grpc", "protocol": "TCP"}]
    client = {"orchard.dev/env-client": "true"}
    assert {"podSelector": {"matchLabels": client}} in grpc_rules[0]["from"]
    for rule in pol["spec"]["ingress"]:
        assert rule.get("from"), "every rule names its sources (an empty `from` admits everyone)"
    find("overlays/prod", "NetworkPolicy", "nats-ingress")
