"""The `kubernetes` backend against a real cluster: runs when KUBECONFIG is set, else skips saying so.

The cluster must be able to pull the agent image (ORCHARD_ENV_K8S_AGENT_IMAGE, default `orchard-agent`:
`docker build -f deploy/Dockerfile --target agent -t orchard-agent .`, then load or push it) and
python:3.11-slim, and this machine must reach Pod IPs (run it in the cluster, or on a kind/minikube host with a
route to the pod network). Egress enforcement is checked only with ORCHARD_TEST_K8S_NETPOL=1 (a CNI that enforces
NetworkPolicy, e.g. Calico or Cilium); otherwise the policies are checked as API objects."""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from env_helpers import StartEnv, run
from test_env_service import download, upload

from orchard.env.v1 import env_pb2 as pb
from orchard.services.env.backends import k8s_manifests as m

pytestmark = [pytest.mark.timeout(600)]

IMAGE = "python:3.11-slim"
PROBE = "import socket; socket.create_connection(('1.1.1.1', 443), timeout=5); print('connected')"


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    """CoreV1Api and NetworkingV1Api of the KUBECONFIG cluster, with a namespace of our own."""
    if not os.environ.get("KUBECONFIG"):
        pytest.skip("needs a Kubernetes cluster: set KUBECONFIG")
    kubernetes = pytest.importorskip("kubernetes", reason="pip install 'orchard[kubernetes]'")
    api = kubernetes.config.new_client_from_config(config_file=os.environ["KUBECONFIG"])
    core, net = kubernetes.client.CoreV1Api(api), kubernetes.client.NetworkingV1Api(api)
    namespace = f"orchard-test-{uuid.uuid4().hex[:6]}"
    core.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    try:
        yield namespace, core, net
    finally:
        core.delete_namespace(namespace)
        api.close()


async def test_sandbox_on_a_cluster(cluster: Any, start_env: StartEnv) -> None:
    """Create (a pod with requests = limits), exec, files, egress policies, delete."""
    namespace, core, net = cluster
    env = await start_env(
        backend="kubernetes",
        k8s_namespace=namespace,
        k8s_kubeconfig=os.environ["KUBECONFIG"],
        k8s_service_id=f"test-{uuid.uuid4().hex[:6]}",
        agent_start_timeout_s=60,
    )
    (env.settings.state_dir / "sandboxes").mkdir(exist_ok=True)  # the start_env fixture checks it is empty
    stub = env.stub
    created = await stub.CreateSandbox(
        pb.CreateSandboxRequest(image=IMAGE, resources=pb.Resources(cpu_millis=500, memory_bytes=256 << 20)),
        timeout=600,
    )
    sid = created.sandbox.sandbox_id
    (pod,) = core.list_namespaced_pod(namespace, label_selector=f"{m.LABEL_SANDBOX}={sid}").items
    main = pod.spec.containers[0]
    assert main.resources.requests == main.resources.limits == {"cpu": "500m", "memory": str(256 << 20)}
    assert pod.status.qos_class == "Guaranteed"

    printed = await run(stub, sid, ["python3", "-c", "print(6 * 7)"])
    assert printed.state == pb.EXEC_STATE_SUCCEEDED and printed.stdout == b"42\n", printed.stderr
    await upload(stub, sid, "data/in.txt", b"hello from the host\n")
    assert b"".join((await download(stub, sid, "data/in.txt"))[1]) == b"hello from the host\n"

    policies = {p.metadata.name for p in net.list_namespaced_network_policy(namespace).items}
    assert m.DENY_POLICY in policies
    enforced = os.environ.get("ORCHARD_TEST_K8S_NETPOL") == "1"
    if enforced:
        assert (await run(stub, sid, ["python3", "-c", PROBE])).state == pb.EXEC_STATE_FAILED
    await stub.SetNetworkPolicy(
        pb.SetNetworkPolicyRequest(
            sandbox_id=sid, network_policy=pb.NetworkPolicy(allow=[pb.EgressRule(cidr="1.1.1.1/32", port=443)])
        ),
        timeout=30,
    )
    assert m.egress_policy_name(sid) in {p.metadata.name for p in net.list_namespaced_network_policy(namespace).items}
    if enforced:
        allowed = await run(stub, sid, ["python3", "-c", PROBE])
        assert allowed.stdout == b"connected\n", allowed.stderr

    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.SetNetworkPolicy(
            pb.SetNetworkPolicyRequest(
                sandbox_id=sid, network_policy=pb.NetworkPolicy(allow=[pb.EgressRule(host="pypi.org", port=443)])
            ),
            timeout=30,
        )
    assert err.value.code() is grpc.StatusCode.FAILED_PRECONDITION

    await stub.DeleteSandbox(pb.DeleteSandboxRequest(sandbox_id=sid), timeout=60)
    left = core.list_namespaced_pod(namespace, label_selector=f"{m.LABEL_SANDBOX}={sid}").items
    assert all(p.metadata.deletion_timestamp for p in left)  # gone, or going
    policies = {p.metadata.name for p in net.list_namespaced_network_policy(namespace).items}
    assert m.egress_policy_name(sid) not in policies


async def test_snapshots_forks_and_pod_deaths_on_a_cluster(cluster: Any, start_env: StartEnv) -> None:
    """A snapshot of a real container runtime's root filesystem forks into a new pod with the files, a deletion, a
    replaced directory and a mode restored; a pod deleted behind the service's back fails its sandbox, saying so."""
    namespace, core, _ = cluster
    env = await start_env(
        backend="kubernetes",
        k8s_namespace=namespace,
        k8s_kubeconfig=os.environ["KUBECONFIG"],
        k8s_service_id=f"test-{uuid.uuid4().hex[:6]}",
        agent_start_timeout_s=60,
    )
    (env.settings.state_dir / "sandboxes").mkdir(exist_ok=True)  # the start_env fixture checks it is empty
    stub = env.stub
    sid = (await stub.CreateSandbox(pb.CreateSandboxRequest(image=IMAGE), timeout=600)).sandbox.sandbox_id
    setup = "echo base > a.txt && chmod 640 a.txt && rm /etc/debian_version && rm -rf /etc/apt && mkdir /etc/apt"
    assert (await run(stub, sid, setup)).state == pb.EXEC_STATE_SUCCEEDED
    snap = (await stub.SnapshotSandbox(pb.SnapshotSandboxRequest(sandbox_id=sid), timeout=600)).snapshot
    fork = await stub.CreateSandbox(pb.CreateSandboxRequest(from_snapshot=snap.snapshot_id), timeout=600)
    check = "cat a.txt; stat -c %a a.txt; test -e /etc/debian_version || echo deleted; ls -A /etc/apt | wc -l"
    seen = await run(stub, fork.sandbox.sandbox_id, check)
    assert seen.stdout == b"base\n640\ndeleted\n0\n", (seen.stdout, seen.stderr)

    (pod,) = core.list_namespaced_pod(namespace, label_selector=f"{m.LABEL_SANDBOX}={sid}").items
    core.delete_namespaced_pod(pod.metadata.name, namespace, grace_period_seconds=0)
    for _ in range(600):
        got = (await stub.GetSandbox(pb.GetSandboxRequest(sandbox_id=sid), timeout=10)).sandbox
        if got.state == pb.SANDBOX_STATE_FAILED:
            break
        await asyncio.sleep(0.1)
    assert got.state == pb.SANDBOX_STATE_FAILED and pod.metadata.name in got.failure_reason, got
