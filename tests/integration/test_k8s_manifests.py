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
TARGETS = ("base", "overlays/dev", "overlays/prod", "overlays/single-node")
POD_PER_SANDBOX = ("base", "overlays/dev", "overlays/prod")  # the kubernetes backend; single-node runs local
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
    out = subprocess.run(
        [KUBECTL, "kustomize", str(K8S / target)], capture_output=True, text=True, timeout=30, check=False
    )
    return out.returncode, out.stdout, out.stderr


def docs(target: str) -> list[dict[str, Any]]:
    rc, stdout, stderr = _render(target)
    assert rc == 0, stderr
    return [d for d in yaml.safe_load_all(stdout) if d]


def find(target: str, kind: str, name: str, namespace: str | None = NAMESPACE) -> dict[str, Any]:
    hits = [
        d
        for d in docs(target)
        if d["kind"] == kind and d["metadata"]["name"] == name and d["metadata"].get("namespace") == namespace
    ]
    assert len(hits) == 1, f"{target}: expected one {kind} {namespace}/{name}, found {len(hits)}"
    return hits[0]


def container(workload: dict[str, Any], name: str) -> dict[str, Any]:
    (c,) = [c for c in workload["spec"]["template"]["spec"]["containers"] if c["name"] == name]
    return c


def env_workload(target: str) -> dict[str, Any]:
    """env's StatefulSet (a state claim per replica)."""
    return find(target, "StatefulSet", "orchard-env")


def inference_deployment(target: str) -> dict[str, Any]:
    return find(target, "Deployment", "orchard-inference")


def env_vars(c: dict[str, Any]) -> dict[str, Any]:
    """A container's env as name -> value (or the valueFrom source)."""
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in c["env"]}


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
    """A workload with a bad type and an unknown field fails validation (so the check above can fail)."""
    dep = env_workload("base")
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
    c = container(env_workload(target), "env")
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == {"grpc": 50051, "metrics": 9100}
    for probe in ("readinessProbe", "livenessProbe"):
        assert c[probe]["grpc"]["port"] == ports["grpc"], probe


@pytest.mark.parametrize("target", TARGETS)
def test_env_requests_equal_limits(target: str) -> None:
    """Every Orchard service's and NATS's resource requests equal their limits (Guaranteed QoS)."""
    for workload, name in (
        (env_workload(target), "env"),
        (inference_deployment(target), "inference"),
        (find(target, "Deployment", "orchard-experience"), "experience"),
        (find(target, "Deployment", "orchard-reward"), "reward"),
        (find(target, "Deployment", "orchard-trainer"), "trainer"),
        (find(target, "StatefulSet", "nats"), "nats"),
    ):
        res = container(workload, name)["resources"]
        assert res["requests"] and res["requests"] == res["limits"], name


@pytest.mark.parametrize("target", TARGETS)
def test_env_settings_are_real_env_settings(target: str) -> None:
    """env runs `serve env` with the kubernetes backend as a non-root, read-only container (the local backend,
    privileged, in single-node), and every ORCHARD_ENV_* var names an EnvSettings field."""
    from orchard.services.env.settings import EnvSettings

    deployment = env_workload(target)
    c = container(deployment, "env")
    assert c["args"] == ["serve", "env"]
    env = env_vars(c)
    if target in POD_PER_SANDBOX:
        assert env["ORCHARD_ENV_BACKEND"] == "kubernetes"
        assert env["ORCHARD_ENV_K8S_NAMESPACE"] == SANDBOX_NAMESPACE
        assert env["ORCHARD_ENV_K8S_SERVICE_ID"] == {"fieldRef": {"fieldPath": "metadata.name"}}  # one per replica
        assert env["ORCHARD_ENV_K8S_AGENT_IMAGE"].startswith("orchard-agent:")
        assert deployment["spec"]["template"]["spec"]["automountServiceAccountToken"] is True
        assert "privileged" not in c["securityContext"]
    else:
        assert env["ORCHARD_ENV_BACKEND"] == "local"
        assert c["securityContext"]["privileged"] is True  # the local backend needs it (components/local-backend)
    assert env["ORCHARD_ENV_METRICS_PORT"] == "9100" and env["ORCHARD_ENV_PORT"] == "50051"
    # extra="forbid": an unknown ORCHARD_ENV_* var would stop the service at start.
    fields = {f.upper() for f in EnvSettings.model_fields}
    assert {k.removeprefix("ORCHARD_ENV_") for k in env if k.startswith("ORCHARD_ENV_")} <= fields


@pytest.mark.parametrize("target", TARGETS)
def test_pod_security_of_the_orchard_namespace(target: str) -> None:
    """Pod Security "restricted" where every pod qualifies (non-root, RuntimeDefault seccomp, no privilege
    escalation, every capability dropped, read-only root FS); "privileged" only with the local backend."""
    namespace = find(target, "Namespace", NAMESPACE, namespace=None)
    restricted = target in POD_PER_SANDBOX
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == (
        "restricted" if restricted else "privileged"
    )
    if not restricted:
        return
    for workload in [d for d in docs(target) if d["kind"] in ("Deployment", "StatefulSet")]:
        pod = workload["spec"]["template"]["spec"]
        for c in pod["containers"]:
            sc = c["securityContext"]
            where = f"{workload['metadata']['name']}/{c['name']}"
            assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] != 0, where
            assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}, where
            assert sc["allowPrivilegeEscalation"] is False and sc["capabilities"]["drop"] == ["ALL"], where
            assert sc["readOnlyRootFilesystem"] is True, where


@pytest.mark.parametrize("target", TARGETS)
def test_inference_serves_grpc_http_and_metrics(target: str) -> None:
    """inference runs `serve inference` with gRPC probes (a startup probe for the first model conversion), its
    Service exposes grpc, http (OpenAI API) and metrics, it reads checkpoints read-only (a ReadWriteMany claim; one
    node's ReadWriteOnce in single-node), and every ORCHARD_INFERENCE_* var names an InferenceSettings field."""
    from orchard.services.inference.settings import InferenceSettings

    deployment = inference_deployment(target)
    c = container(deployment, "inference")
    assert c["args"] == ["serve", "inference"] and c["image"].startswith("orchard-inference:")
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == {"grpc": 50052, "http": 8000, "metrics": 9100}
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert c[probe]["grpc"]["port"] == ports["grpc"], probe
    env = env_vars(c)
    assert (env["ORCHARD_INFERENCE_PORT"], env["ORCHARD_INFERENCE_HTTP_PORT"]) == ("50052", "8000")
    fields = {f.upper() for f in InferenceSettings.model_fields}
    assert {k.removeprefix("ORCHARD_INFERENCE_") for k in env if k.startswith("ORCHARD_INFERENCE_")} <= fields
    assert {"name": "checkpoints", "mountPath": "/checkpoints", "readOnly": True} in c["volumeMounts"]
    (claim,) = [v for v in deployment["spec"]["template"]["spec"]["volumes"] if v["name"] == "checkpoints"]
    pvc = find(target, "PersistentVolumeClaim", claim["persistentVolumeClaim"]["claimName"])
    assert pvc["spec"]["accessModes"] == ["ReadWriteOnce" if target == "overlays/single-node" else "ReadWriteMany"]
    svc = find(target, "Service", "orchard-inference")
    assert {p["name"]: (p["port"], p["targetPort"]) for p in svc["spec"]["ports"]} == {
        "grpc": (50052, "grpc"),
        "http": (8000, "http"),
        "metrics": (9100, "metrics"),
    }
    assert svc["spec"]["selector"].items() <= deployment["spec"]["template"]["metadata"]["labels"].items()


@pytest.mark.parametrize("target", TARGETS)
def test_env_service_exposes_grpc_and_metrics(target: str) -> None:
    """The env Service selects the env pods and exposes the named `grpc` and `metrics` ports."""
    svc = find(target, "Service", "orchard-env")
    ports = {p["name"]: (p["port"], p["targetPort"]) for p in svc["spec"]["ports"]}
    assert ports == {"grpc": (50051, "grpc"), "metrics": (9100, "metrics")}
    labels = env_workload(target)["spec"]["template"]["metadata"]["labels"]
    assert svc["spec"]["selector"].items() <= labels.items()
    assert env_workload(target)["spec"]["template"]["spec"]["serviceAccountName"] == "orchard-env"


@pytest.mark.parametrize("target", TARGETS)
def test_env_state_dir_is_a_claim_per_replica(target: str) -> None:
    """env's state dir (snapshots of the kubernetes backend; the local backend's sandboxes) is each replica's own
    ReadWriteOnce claim from volumeClaimTemplates, not an emptyDir: it outlives the pod, kept on scale-down, and the
    service's group may write it (fsGroup)."""
    sts = env_workload(target)
    pod = sts["spec"]["template"]["spec"]
    c = container(sts, "env")
    state = env_vars(c)["ORCHARD_ENV_STATE_DIR"]
    (mount,) = [m for m in c["volumeMounts"] if m["mountPath"] == state]
    assert mount["name"] not in {v["name"] for v in pod["volumes"]}  # not a pod volume: a claim template
    (claim,) = [t for t in sts["spec"]["volumeClaimTemplates"] if t["metadata"]["name"] == mount["name"]]
    assert claim["spec"]["accessModes"] == ["ReadWriteOnce"] and claim["spec"]["resources"]["requests"]["storage"]
    assert sts["spec"]["serviceName"] == "orchard-env" and sts["spec"]["podManagementPolicy"] == "Parallel"
    assert "persistentVolumeClaimRetentionPolicy" not in sts["spec"]  # Retain: a replica scaled away keeps its claim
    if target in POD_PER_SANDBOX:
        assert pod["securityContext"]["fsGroup"] == pod["securityContext"]["runAsGroup"]
    assert not [d for d in docs(target) if d["kind"] == "Deployment" and d["metadata"]["name"] == "orchard-env"]


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
    """The orchard-sandboxes Role allows what the kubernetes backend does to pods and networkpolicies (watch,
    patch included) and no more (no exec: commands go to the agent at the Pod IP), bound to env's SA."""
    find(target, "Namespace", SANDBOX_NAMESPACE, namespace=None)
    role = find(target, "Role", "orchard-env-sandboxes", namespace=SANDBOX_NAMESPACE)
    allowed: dict[tuple[str, str], set[str]] = {}
    for rule in role["rules"]:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                allowed.setdefault((group, resource), set()).update(rule["verbs"])
    assert {"create", "delete", "get", "list", "watch", "patch"} <= allowed[("", "pods")]
    assert {"create", "delete", "get", "list", "patch"} <= allowed[("networking.k8s.io", "networkpolicies")]
    assert set(allowed) == {("", "pods"), ("networking.k8s.io", "networkpolicies")}
    binding = find(target, "RoleBinding", "orchard-env-sandboxes", namespace=SANDBOX_NAMESPACE)
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": "orchard-env-sandboxes",
    }
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "orchard-env", "namespace": NAMESPACE}]


@pytest.mark.parametrize("target", ("base", "overlays/prod"))
@pytest.mark.parametrize("service", ("orchard-env", "orchard-inference"))
def test_hpa_scales_env_and_inference_on_cpu(target: str, service: str) -> None:
    """autoscaling/v2 HPAs target the env StatefulSet and the inference Deployment on CPU utilization (dev has
    none)."""
    hpa = find(target, "HorizontalPodAutoscaler", service)
    assert hpa["apiVersion"] == "autoscaling/v2"
    kind = "StatefulSet" if service == "orchard-env" else "Deployment"
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": kind, "name": service}
    assert hpa["spec"]["minReplicas"] <= hpa["spec"]["maxReplicas"]
    assert [m["resource"]["name"] for m in hpa["spec"]["metrics"]] == ["cpu"]
    for small in ("overlays/dev", "overlays/single-node"):
        assert not [d for d in docs(small) if d["kind"] == "HorizontalPodAutoscaler"], small


@pytest.mark.parametrize("target", TARGETS)
def test_experience_stores_on_a_claim_and_reads_nats(target: str) -> None:
    """experience runs `serve experience` with gRPC probes, one replica recreated on its ReadWriteOnce claim
    (SQLite), NATS by its Service name, and every ORCHARD_EXPERIENCE_* var names an ExperienceSettings field."""
    from orchard.services.experience.settings import ExperienceSettings

    deployment = find(target, "Deployment", "orchard-experience")
    c = container(deployment, "experience")
    assert c["args"] == ["serve", "experience"] and c["image"].startswith("orchard-experience:")
    for probe in ("readinessProbe", "livenessProbe"):
        assert c[probe]["grpc"]["port"] == 50055, probe
    env = env_vars(c)
    fields = {f.upper() for f in ExperienceSettings.model_fields}
    assert {k.removeprefix("ORCHARD_EXPERIENCE_") for k in env if k.startswith("ORCHARD_EXPERIENCE_")} <= fields
    nats = find(target, "Service", "nats")
    assert env["ORCHARD_EXPERIENCE_NATS_URL"] == f"nats://{nats['metadata']['name']}:4222"
    assert env["ORCHARD_EXPERIENCE_STORE_URL"].startswith("sqlite:////data/")
    assert deployment["spec"]["replicas"] == 1 and deployment["spec"]["strategy"]["type"] == "Recreate"
    (data,) = [v for v in deployment["spec"]["template"]["spec"]["volumes"] if v["name"] == "data"]
    pvc = find(target, "PersistentVolumeClaim", data["persistentVolumeClaim"]["claimName"])
    assert pvc["spec"]["accessModes"] == ["ReadWriteOnce"]
    assert {"name": "data", "mountPath": "/data"} in c["volumeMounts"]


@pytest.mark.parametrize("target", TARGETS)
def test_reward_reaches_env_and_inference_through_their_services(target: str) -> None:
    """reward runs `serve reward` with gRPC probes, reaches env and inference by their Service names and gRPC
    ports, carries the client labels the prod network policies admit, and its settings are real."""
    from orchard.services.reward.settings import RewardSettings

    deployment = find(target, "Deployment", "orchard-reward")
    c = container(deployment, "reward")
    assert c["args"] == ["serve", "reward"] and c["image"].startswith("orchard-reward:")
    for probe in ("readinessProbe", "livenessProbe"):
        assert c[probe]["grpc"]["port"] == 50053, probe
    env = env_vars(c)
    fields = {f.upper() for f in RewardSettings.model_fields}
    assert {k.removeprefix("ORCHARD_REWARD_") for k in env if k.startswith("ORCHARD_REWARD_")} <= fields
    for var, service in (
        ("ORCHARD_REWARD_ENV_ADDRESS", "orchard-env"),
        ("ORCHARD_REWARD_INFERENCE_ADDRESS", "orchard-inference"),
    ):
        grpc_port = {p["name"]: p["port"] for p in find(target, "Service", service)["spec"]["ports"]}["grpc"]
        assert env[var] == f"{service}:{grpc_port}", var
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert labels["orchard.dev/env-client"] == labels["orchard.dev/inference-client"] == "true"


@pytest.mark.parametrize("target", TARGETS)
def test_trainer_writes_the_checkpoints_inference_reads(target: str) -> None:
    """trainer runs `serve trainer` with gRPC probes, one replica recreated, its jobs dir on the checkpoints claim
    mounted read-write at the path where inference mounts the same claim read-only (so a reported checkpoint path
    loads there), reaches inference, experience, env and reward by their Service names and gRPC ports, carries
    the client labels the prod network policies admit, and its settings are real."""
    from orchard.services.trainer.settings import TrainerSettings

    deployment = find(target, "Deployment", "orchard-trainer")
    pod = deployment["spec"]["template"]["spec"]
    c = container(deployment, "trainer")
    assert c["args"] == ["serve", "trainer"] and c["image"].startswith("orchard-trainer:")
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == {"grpc": 50056, "metrics": 9100}
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert c[probe]["grpc"]["port"] == ports["grpc"], probe
    env = env_vars(c)
    fields = {f.upper() for f in TrainerSettings.model_fields}
    assert {k.removeprefix("ORCHARD_TRAINER_") for k in env if k.startswith("ORCHARD_TRAINER_")} <= fields
    assert env["ORCHARD_TRAINER_PORT"] == "50056" and env["ORCHARD_TRAINER_METRICS_PORT"] == "9100"
    for var, service in (
        ("ORCHARD_TRAINER_INFERENCE_ADDRESS", "orchard-inference"),
        ("ORCHARD_TRAINER_EXPERIENCE_ADDRESS", "orchard-experience"),
        ("ORCHARD_TRAINER_ENV_ADDRESS", "orchard-env"),
        ("ORCHARD_TRAINER_REWARD_ADDRESS", "orchard-reward"),
    ):
        grpc_port = {p["name"]: p["port"] for p in find(target, "Service", service)["spec"]["ports"]}["grpc"]
        assert env[var] == f"{service}:{grpc_port}", var
    # One owner of the jobs at a time: a second pod would resume every running job again.
    assert deployment["spec"]["replicas"] == 1 and deployment["spec"]["strategy"]["type"] == "Recreate"
    assert not [
        d
        for d in docs(target)
        if d["kind"] == "HorizontalPodAutoscaler" and d["spec"]["scaleTargetRef"]["name"] == "orchard-trainer"
    ]

    (jobs,) = [m for m in c["volumeMounts"] if m["mountPath"] == env["ORCHARD_TRAINER_JOBS_DIR"]]
    assert not jobs.get("readOnly", False)
    (claim,) = [v for v in pod["volumes"] if v["name"] == jobs["name"]]
    inference = inference_deployment(target)
    (inference_claim,) = [
        v
        for v in inference["spec"]["template"]["spec"]["volumes"]
        if v.get("persistentVolumeClaim", {}).get("claimName") == claim["persistentVolumeClaim"]["claimName"]
    ]
    (inference_mount,) = [
        m for m in container(inference, "inference")["volumeMounts"] if m["name"] == inference_claim["name"]
    ]
    assert inference_mount["mountPath"] == jobs["mountPath"] and inference_mount["readOnly"] is True
    pvc = find(target, "PersistentVolumeClaim", claim["persistentVolumeClaim"]["claimName"])
    assert pvc["spec"]["accessModes"] == ["ReadWriteOnce" if target == "overlays/single-node" else "ReadWriteMany"]
    assert {"name": "tmp", "mountPath": "/tmp"} in c["volumeMounts"]
    assert env["HOME"] == "/tmp" and env["OMP_NUM_THREADS"] == c["resources"]["limits"]["cpu"]

    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert labels["orchard.dev/env-client"] == labels["orchard.dev/inference-client"] == "true"
    svc = find(target, "Service", "orchard-trainer")
    assert {p["name"]: (p["port"], p["targetPort"]) for p in svc["spec"]["ports"]} == {
        "grpc": (50056, "grpc"),
        "metrics": (9100, "metrics"),
    }
    assert svc["spec"]["selector"].items() <= labels.items()
    assert pod["serviceAccountName"] == "orchard-trainer" and pod["automountServiceAccountToken"] is False


def test_prod_is_bigger_than_dev() -> None:
    """Prod runs more and bigger env replicas than dev; dev uses the `dev` image tag."""
    dev, prod = env_workload("overlays/dev"), env_workload("overlays/prod")
    assert dev["spec"]["replicas"] == 1 < prod["spec"]["replicas"]
    assert (
        prod["spec"]["replicas"]
        <= find("overlays/prod", "HorizontalPodAutoscaler", "orchard-env")["spec"]["minReplicas"]
    )
    assert container(dev, "env")["image"] == "orchard-env:dev"
    assert container(inference_deployment("overlays/dev"), "inference")["image"] == "orchard-inference:dev"
    dev_res, prod_res = container(dev, "env")["resources"]["limits"], container(prod, "env")["resources"]["limits"]
    assert _cpu(prod_res["cpu"]) > _cpu(dev_res["cpu"])


def _cpu(q: str) -> float:
    return float(q[:-1]) / 1000 if q.endswith("m") else float(q)


def test_prod_network_policy_limits_env_grpc_to_labelled_clients() -> None:
    """Only prod has NetworkPolicies; env's grpc port admits only pods/namespaces labelled as env clients."""
    for target in ("base", "overlays/dev", "overlays/single-node"):
        assert not [d for d in docs(target) if d["kind"] == "NetworkPolicy"], target
    pol = find("overlays/prod", "NetworkPolicy", "orchard-env-ingress")
    labels = env_workload("overlays/prod")["spec"]["template"]["metadata"]["labels"]
    assert pol["spec"]["podSelector"]["matchLabels"].items() <= labels.items()
    assert pol["spec"]["policyTypes"] == ["Ingress"]
    grpc_rules = [r for r in pol["spec"]["ingress"] if {"port": "grpc", "protocol": "TCP"} in r["ports"]]
    assert len(grpc_rules) == 1 and grpc_rules[0]["ports"] == [{"port": "grpc", "protocol": "TCP"}]
    client = {"orchard.dev/env-client": "true"}
    assert {"podSelector": {"matchLabels": client}} in grpc_rules[0]["from"]
    for rule in pol["spec"]["ingress"]:
        assert rule.get("from"), "every rule names its sources (an empty `from` admits everyone)"
    find("overlays/prod", "NetworkPolicy", "nats-ingress")


def test_prod_network_policies_for_inference_and_sandbox_agents() -> None:
    """In prod, inference's grpc/http ports admit only labelled clients, and sandbox pods admit only the env
    service's pods, only on the agent port the env service is configured with."""
    pol = find("overlays/prod", "NetworkPolicy", "orchard-inference-ingress")
    rule = next(r for r in pol["spec"]["ingress"] if {"port": "http", "protocol": "TCP"} in r["ports"])
    assert {"podSelector": {"matchLabels": {"orchard.dev/inference-client": "true"}}} in rule["from"]
    sandboxes = find("overlays/prod", "NetworkPolicy", "orchard-sandbox-ingress", namespace=SANDBOX_NAMESPACE)
    assert sandboxes["spec"]["podSelector"] == {"matchLabels": {"orchard.dev/role": "sandbox"}}
    (only,) = sandboxes["spec"]["ingress"]
    (source,) = only["from"]
    assert source["namespaceSelector"] == {"matchLabels": {"kubernetes.io/metadata.name": NAMESPACE}}
    assert (
        source["podSelector"]["matchLabels"].items()
        <= env_workload("overlays/prod")["spec"]["template"]["metadata"]["labels"].items()
    )
    from orchard.services.env.settings import EnvSettings

    assert only["ports"] == [{"port": EnvSettings.model_fields["k8s_agent_port"].default, "protocol": "TCP"}]


def _admits(policy: dict[str, Any], labels: dict[str, str], port: str) -> bool:
    """Whether a NetworkPolicy lets a pod of its own namespace with `labels` in on the named `port`."""
    for rule in policy["spec"]["ingress"]:
        if {"port": port, "protocol": "TCP"} not in rule["ports"]:
            continue
        for source in rule["from"]:
            if (
                "podSelector" in source
                and "namespaceSelector" not in source
                and source["podSelector"].get("matchLabels", {}).items() <= labels.items()
            ):
                return True
    return False


def test_prod_network_policies_for_the_trainer() -> None:
    """In prod, the trainer's grpc port admits only pods of the orchard namespace, its metrics only labelled
    scrapers, and the trainer may reach inference, experience, env and reward on their grpc ports."""
    trainer = find("overlays/prod", "Deployment", "orchard-trainer")["spec"]["template"]["metadata"]["labels"]
    pol = find("overlays/prod", "NetworkPolicy", "orchard-trainer-ingress")
    assert pol["spec"]["podSelector"]["matchLabels"].items() <= trainer.items()
    assert pol["spec"]["policyTypes"] == ["Ingress"]
    (grpc,) = [r for r in pol["spec"]["ingress"] if {"port": "grpc", "protocol": "TCP"} in r["ports"]]
    assert grpc["from"] == [{"podSelector": {}}]  # the policy's own namespace, every pod of it, nothing else
    (metrics,) = [r for r in pol["spec"]["ingress"] if {"port": "metrics", "protocol": "TCP"} in r["ports"]]
    assert {"podSelector": {"matchLabels": {"orchard.dev/metrics-scraper": "true"}}} in metrics["from"]
    for rule in pol["spec"]["ingress"]:
        assert rule.get("from"), "every rule names its sources (an empty `from` admits everyone)"
    policies = [
        d for d in docs("overlays/prod") if d["kind"] == "NetworkPolicy" and d["metadata"]["namespace"] == NAMESPACE
    ]
    for service in ("orchard-inference", "orchard-experience", "orchard-env", "orchard-reward"):
        workload = (
            env_workload("overlays/prod") if service == "orchard-env" else find("overlays/prod", "Deployment", service)
        )
        pods = workload["spec"]["template"]["metadata"]["labels"]
        for policy in policies:
            if policy["spec"]["podSelector"].get("matchLabels", {}).items() <= pods.items():
                assert _admits(policy, trainer, "grpc"), (service, policy["metadata"]["name"])
