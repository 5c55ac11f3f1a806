"""The `kubernetes` backend end to end through the real gRPC API, against a FAKE Kubernetes API server
(k8s_fake_api.py): no cluster can run on this machine. The real `kubernetes` client, the real pod watch and
readiness cache, and the real native agent (started by the fake for each pod on a loopback address of its own, as
its Pod IP) are exercised; scheduling, images and NetworkPolicy enforcement are not (test_k8s_cluster.py does
those on a real cluster)."""

from __future__ import annotations

import asyncio
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from env_helpers import EnvServer, StartEnv, duration, run, start, wait
from k8s_fake_api import FakeKubernetes
from test_env_pty import open_term
from test_env_service import download, upload

from orchard.env.v1 import env_pb2 as pb
from orchard.services.env.backends import k8s_manifests as m

pytest.importorskip("kubernetes", reason="pip install 'orchard[kubernetes]'")
pytestmark = [pytest.mark.timeout(60)]

ROOT = Path(__file__).resolve().parents[2]
NS = "sandboxes"
SERVICE = "test-env"
IMAGE = "debian:12"


@pytest.fixture(scope="module")
def agent_bin() -> Path:
    built = subprocess.run([str(ROOT / "scripts" / "build_agent.sh")], capture_output=True, text=True, check=False)
    if built.returncode != 0:
        pytest.skip(f"cannot build the native agent (needs cargo): {built.stderr.strip()[-500:]}")
    return Path(built.stdout.strip())


@pytest.fixture
def fake(agent_bin: Path, tmp_path: Path) -> Iterator[FakeKubernetes]:
    (tmp_path / "pod-logs").mkdir()
    api = FakeKubernetes(agent_bin, tmp_path / "pod-logs")
    api.start()
    yield api
    api.stop()


async def start_k8s_env(start_env: StartEnv, fake: FakeKubernetes, tmp_path: Path, **overrides: Any) -> EnvServer:
    env = await start_env(
        backend="kubernetes",
        k8s_kubeconfig=fake.kubeconfig(tmp_path / "kubeconfig", NS),
        k8s_namespace=NS,
        k8s_service_id=SERVICE,
        **overrides,
    )
    (env.settings.state_dir / "sandboxes").mkdir(exist_ok=True)  # the start_env fixture checks it is empty
    return env


def sandbox_pod(fake: FakeKubernetes, sandbox_id: str) -> dict[str, Any]:
    (found,) = fake.pods(NS, f"{m.LABEL_SANDBOX}={sandbox_id}")
    return found


async def eventually(check: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


async def test_sandbox_pod_lifecycle(fake: FakeKubernetes, start_env: StartEnv, tmp_path: Path) -> None:
    """Create makes a labelled pod with requests = limits; exec, files, a patch and a terminal go over the Pod IP; the
    create waits on the watch (no pod GETs or lists); delete removes the pod and its agent."""
    env = await start_k8s_env(start_env, fake, tmp_path)
    stub = env.stub
    work = tmp_path / "ws1"
    began = time.perf_counter()
    requests_before = len(fake.requests)
    created = (
        await stub.CreateSandbox(
            pb.CreateSandboxRequest(
                image=IMAGE,
                workdir=str(work),
                env={"GREETING": "hello"},
                ttl=duration(600),
                resources=pb.Resources(cpu_millis=500, memory_bytes=256 << 20),
            ),
            timeout=30,
        )
    ).sandbox
    create_ms = (time.perf_counter() - began) * 1000
    sid = created.sandbox_id
    calls = [c for c in fake.requests[requests_before:] if c[0] != "GET" or "watch=true" not in c[1].lower()]
    assert [c[0] for c in calls] == ["POST"], calls  # one create; readiness came from the open watch

    pod = sandbox_pod(fake, sid)
    meta, container = pod["metadata"], pod["spec"]["containers"][0]
    assert meta["labels"][m.LABEL_SERVICE] == SERVICE and meta["labels"][m.LABEL_ROLE] == "sandbox"
    assert meta["annotations"][m.ANN_TENANT] == "default" and meta["annotations"][m.ANN_IMAGE] == IMAGE
    expire = m.expire_epoch(meta["annotations"])
    assert expire is not None and abs(expire - (created.create_time.seconds + 600)) <= 1
    assert (
        container["resources"]["requests"]
        == container["resources"]["limits"]
        == {"cpu": "500m", "memory": str(256 << 20)}
    )

    printed = await run(stub, sid, "echo $GREETING from $(pwd)")
    assert printed.state == pb.EXEC_STATE_SUCCEEDED, printed.stderr
    assert printed.stdout == f"hello from {work}\n".encode()
    began = time.perf_counter()
    for _ in range(10):
        await run(stub, sid, ["true"])
    exec_ms = (time.perf_counter() - began) / 10 * 1000

    await upload(stub, sid, "data/in.txt", b"over the pod IP\n")
    assert (work / "data" / "in.txt").read_bytes() == b"over the pod IP\n"
    assert b"".join((await download(stub, sid, "data/in.txt"))[1]) == b"over the pod IP\n"
    (work / "a.txt").write_text("one\ntwo\n")
    patch = "--- a/a.txt\n+++ b/a.txt\n@@ -1,2 +1,2 @@\n one\n-two\n+TWO\n"
    applied = await stub.ApplyPatch(pb.ApplyPatchRequest(sandbox_id=sid, patch=patch), timeout=30)
    assert list(applied.files) == ["a.txt"] and (work / "a.txt").read_text() == "one\nTWO\n"
    term = await open_term(stub, sid, argv=["sh", "-c", "stty size; read x; echo got-$x; exit 4"], rows=30, cols=90)
    await term.until(rb"30 90\r")
    await term.send(b"typed\n")
    await term.until(rb"got-typed")
    assert await term.until_end() == 4  # a terminal over the Pod IP

    agent = fake.procs[NS, meta["name"]]
    await stub.DeleteSandbox(pb.DeleteSandboxRequest(sandbox_id=sid), timeout=30)
    assert fake.pods(NS, f"{m.LABEL_SANDBOX}={sid}") == []
    assert agent.wait(5) == 0  # SIGTERM reached the agent
    print(f"create through the fake: {create_ms:.0f} ms; exec round trip over gRPC + TCP: {exec_ms:.1f} ms")


async def test_egress_policies(fake: FakeKubernetes, start_env: StartEnv, tmp_path: Path) -> None:
    """Deny-all for the namespace at start-up; CIDR rules become the sandbox's own allow policy, replaced and
    removed with SetNetworkPolicy; a host-name rule is FAILED_PRECONDITION before any pod is made."""
    env = await start_k8s_env(start_env, fake, tmp_path)
    stub = env.stub
    assert fake.policies(NS)[m.DENY_POLICY]["spec"]["podSelector"] == {"matchLabels": {m.LABEL_ROLE: "sandbox"}}

    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.CreateSandbox(
            pb.CreateSandboxRequest(
                image=IMAGE,
                workdir=str(tmp_path / "w0"),
                network_policy=pb.NetworkPolicy(allow=[pb.EgressRule(host="pypi.org", port=443)]),
            ),
            timeout=30,
        )
    assert err.value.code() is grpc.StatusCode.FAILED_PRECONDITION and "IP blocks only" in err.value.details()
    assert fake.pods(NS, m.LABEL_SANDBOX) == []

    sid = (
        await stub.CreateSandbox(
            pb.CreateSandboxRequest(
                image=IMAGE,
                workdir=str(tmp_path / "w1"),
                network_policy=pb.NetworkPolicy(allow=[pb.EgressRule(cidr="10.0.0.0/8", port=443)]),
            ),
            timeout=30,
        )
    ).sandbox.sandbox_id
    name = m.egress_policy_name(sid)
    policy = fake.policies(NS)[name]
    assert policy["spec"]["egress"] == [
        {
            "to": [{"ipBlock": {"cidr": "10.0.0.0/8"}}],
            "ports": [{"protocol": "TCP", "port": 443}, {"protocol": "UDP", "port": 443}],
        }
    ]

    await stub.SetNetworkPolicy(
        pb.SetNetworkPolicyRequest(
            sandbox_id=sid,
            network_policy=pb.NetworkPolicy(
                allow=[pb.EgressRule(cidr="192.0.2.1"), pb.EgressRule(cidr="2001:db8::/48", port=53)]
            ),
        ),
        timeout=30,
    )
    cidrs = [e["to"][0]["ipBlock"]["cidr"] for e in fake.policies(NS)[name]["spec"]["egress"]]
    assert cidrs == ["192.0.2.1/32", "2001:db8::/48"]

    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.SetNetworkPolicy(
            pb.SetNetworkPolicyRequest(
                sandbox_id=sid, network_policy=pb.NetworkPolicy(allow=[pb.EgressRule(host="example.com")])
            ),
            timeout=30,
        )
    assert err.value.code() is grpc.StatusCode.FAILED_PRECONDITION
    assert len(fake.policies(NS)[name]["spec"]["egress"]) == 2  # unchanged

    await stub.SetNetworkPolicy(pb.SetNetworkPolicyRequest(sandbox_id=sid), timeout=30)
    assert name not in fake.policies(NS)
    await stub.SetNetworkPolicy(
        pb.SetNetworkPolicyRequest(
            sandbox_id=sid, network_policy=pb.NetworkPolicy(allow=[pb.EgressRule(cidr="10.1.0.0/16")])
        ),
        timeout=30,
    )
    await stub.DeleteSandbox(pb.DeleteSandboxRequest(sandbox_id=sid), timeout=30)
    assert name not in fake.policies(NS) and m.DENY_POLICY in fake.policies(NS)


async def test_warm_pool_hands_out_and_refills(fake: FakeKubernetes, start_env: StartEnv, tmp_path: Path) -> None:
    """Started pods wait per image; a fitting create takes one (relabelled by patch, workdir made through the
    agent), the pool refills in the background, and a create that does not fit makes a pod of its own."""
    env = await start_k8s_env(start_env, fake, tmp_path, k8s_warm_pools={IMAGE: 2})
    stub = env.stub
    pool = f"{m.LABEL_POOL}={m.pool_label(IMAGE)}"

    def running(selector: str) -> list[str]:
        return [p["metadata"]["name"] for p in fake.pods(NS, selector) if p.get("status", {}).get("podIP")]

    await eventually(lambda: len(running(pool)) == 2)
    warm = set(running(pool))
    cold_began = time.perf_counter()
    cold = (
        await stub.CreateSandbox(
            pb.CreateSandboxRequest(image=IMAGE, workdir=str(tmp_path / "cold"), env={"X": "1"}), timeout=30
        )
    ).sandbox
    cold_ms = (time.perf_counter() - cold_began) * 1000
    assert sandbox_pod(fake, cold.sandbox_id)["metadata"]["name"] not in warm  # env does not fit a warm pod

    work = tmp_path / "handed"
    began = time.perf_counter()
    sid = (
        await stub.CreateSandbox(pb.CreateSandboxRequest(image=IMAGE, workdir=str(work), ttl=duration(300)), timeout=30)
    ).sandbox.sandbox_id
    warm_ms = (time.perf_counter() - began) * 1000
    pod = sandbox_pod(fake, sid)
    assert pod["metadata"]["name"] in warm
    assert m.LABEL_POOL not in pod["metadata"]["labels"] and pod["metadata"]["annotations"][m.ANN_TENANT] == "default"
    assert pod["spec"]["activeDeadlineSeconds"] >= 300 + m.DEADLINE_SLACK_S
    printed = await run(stub, sid, "pwd; echo $ORCHARD_SANDBOX_ID")
    assert printed.stdout.decode().split("\n")[0] == str(work)

    await eventually(lambda: len(running(pool)) == 2)  # refilled
    assert set(running(pool)).isdisjoint({pod["metadata"]["name"]})
    print(f"create: from the warm pool {warm_ms:.0f} ms, cold (pod made) {cold_ms:.0f} ms")
    await env.server.stop()
    assert fake.pods(NS) == []  # closing deletes sandboxes and waiting warm pods alike


async def test_start_up_removes_orphans_and_expired(fake: FakeKubernetes, start_env: StartEnv, tmp_path: Path) -> None:
    """What this instance left (its service label) goes, so does anything past its expiry annotation; another
    live instance's pods and policies stay; an existing deny-all policy is brought up to date."""
    cfg_mine = m.PodConfig(NS, SERVICE, "orchard-agent", 7070)
    cfg_other = m.PodConfig(NS, "other-env", "orchard-agent", 7070)
    now = time.time()

    def seed(cfg: m.PodConfig, name: str, expire_s: float) -> None:
        fake.seed(
            "pods",
            m.sandbox_pod(
                cfg,
                name=name,
                image=IMAGE,
                container_image=IMAGE,
                token="k" * 32,
                workdir="/",
                env={},
                resources=m.Resources(),
                expire_s=expire_s,
                ttl_s=60,
                tenant="t",
                sandbox_id=f"sb-{name}",
            ),
        )
        fake.seed(
            "networkpolicies", m.egress_policy(cfg, f"sb-{name}", (m.EgressRule(cidr="10.0.0.0/8"),), expire_s=expire_s)
        )

    seed(cfg_mine, "mine-left", now + 3600)
    seed(cfg_other, "other-expired", now - 5)
    seed(cfg_other, "other-live", now + 3600)
    stale_deny = m.deny_egress_policy(cfg_mine)
    stale_deny["spec"]["podSelector"] = {"matchLabels": {"outdated": "yes"}}
    fake.seed("networkpolicies", stale_deny)
    await start_k8s_env(start_env, fake, tmp_path)
    assert fake.policies(NS)[m.DENY_POLICY]["spec"] == m.deny_egress_policy(cfg_mine)["spec"]  # made current
    assert [p["metadata"]["name"] for p in fake.pods(NS)] == ["other-live"]
    assert sorted(fake.policies(NS)) == sorted([m.DENY_POLICY, m.egress_policy_name("sb-other-live")])


async def test_watch_resumes_and_relists(fake: FakeKubernetes, start_env: StartEnv, tmp_path: Path) -> None:
    """A watch the server ends is resumed from its resourceVersion; a version the server forgot (410) relists;
    creates keep working from the cache across both."""
    env = await start_k8s_env(start_env, fake, tmp_path)
    for i, disturb in enumerate((fake.end_watches, fake.compact)):
        disturb()
        sid = (
            await env.stub.CreateSandbox(
                pb.CreateSandboxRequest(image=IMAGE, workdir=str(tmp_path / f"w{i}")), timeout=30
            )
        ).sandbox.sandbox_id
        assert (await run(env.stub, sid, ["true"])).state == pb.EXEC_STATE_SUCCEEDED
    watches = [path for method, path in fake.requests if method == "GET" and "watch=true" in path.lower()]
    assert len(watches) >= 3 and any("resourceVersion=" in w for w in watches[1:])


async def test_pod_deaths_fail_their_sandboxes(fake: FakeKubernetes, start_env: StartEnv, tmp_path: Path) -> None:
    """A pod OOM-killed, evicted, or deleted behind the service's back: the watch tells the manager, so GetSandbox
    says FAILED and why (the pod's reason, message, exit code) with no command run, a command in flight ends, and
    the next one is FAILED_PRECONDITION naming the cause, as on the local backend for a sandbox whose agent died."""
    env = await start_k8s_env(start_env, fake, tmp_path)
    stub = env.stub
    deaths = {
        "oom": (lambda name: fake.kill_container(NS, name), ["OOMKilled (exit code 137)"]),
        "evicted": (
            lambda name: fake.evict(NS, name, "The node was low on resource: memory."),
            ["pod failed: Evicted: The node was low on resource: memory.", "Error (exit code 137)"],
        ),
        "deleted": (lambda name: fake.delete_pod(NS, name), ["the pod was deleted"]),
    }
    sids = {}
    for case in deaths:
        created = await stub.CreateSandbox(
            pb.CreateSandboxRequest(image=IMAGE, workdir=str(tmp_path / case)), timeout=30
        )
        sids[case] = created.sandbox.sandbox_id
    in_flight = await start(stub, sids["evicted"], "sleep 30")
    for case, (kill, _) in deaths.items():
        kill(sandbox_pod(fake, sids[case])["metadata"]["name"])
    for case, (_, fragments) in deaths.items():
        sid = sids[case]
        deadline = time.monotonic() + 10
        while (got := (await stub.GetSandbox(pb.GetSandboxRequest(sandbox_id=sid), timeout=5)).sandbox).state != (
            pb.SANDBOX_STATE_FAILED
        ):
            assert time.monotonic() < deadline, f"{case}: still {got.state}"
            await asyncio.sleep(0.02)
        assert "its pod orchard-" in got.failure_reason and all(f in got.failure_reason for f in fragments), got
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await start(stub, sid, "true")
        assert err.value.code() is grpc.StatusCode.FAILED_PRECONDITION and "died" in err.value.details(), err.value
    assert await env.manager.backend.oom_kills(sids["oom"]) == 1
    ended = await wait(stub, in_flight.exec_id)
    assert ended.state != pb.EXEC_STATE_SUCCEEDED, ended
    for sid in sids.values():
        await stub.DeleteSandbox(pb.DeleteSandboxRequest(sandbox_id=sid), timeout=30)
    assert fake.pods(NS, m.LABEL_SANDBOX) == []
