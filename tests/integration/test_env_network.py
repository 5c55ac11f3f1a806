"""Egress allowlists of the env service with real sandboxes on the "host" image. Test servers live on link-local
addresses only: in a network namespace each test makes itself, or on the host's end of a sandbox's veth. The tests
marked LEGACY run once more with the rules in legacy iptables (egress_firewall="iptables"), the firewall of kernels
without nftables' inet family; "auto" is nftables on this host's kernel."""

from __future__ import annotations

import asyncio
import ipaddress
import random
import re
import shutil
import socket
import sys
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from env_helpers import EnvServer, StartEnv, create, delete_quietly, needs_sandboxes, run, start
from pytest import FixtureRequest

from orchard.env.v1 import env_pb2 as pb
from orchard.env.v1 import env_pb2_grpc
from orchard.services.env.backends.network import name_prefix

pytestmark = [needs_sandboxes, pytest.mark.timeout(30)]

Stub = env_pb2_grpc.EnvServiceStub
Code = grpc.StatusCode
REPO = Path(__file__).resolve().parents[2]
LEGACY = pytest.mark.parametrize("env", ["auto", "iptables"], indirect=True)
"""The test runs with the firewall this kernel gives ("auto") and with legacy iptables forced."""

# Connects to each host:port argument and prints "<host:port> <first line received or errno name> <seconds>".
PROBE = """
import errno, socket, sys, time
for target in sys.argv[1:]:
    host, port = target.rsplit(":", 1)
    began = time.monotonic()
    try:
        with socket.create_connection((host, int(port)), timeout=5) as conn:
            conn.settimeout(5)
            result = conn.recv(200).decode().strip().replace(" ", "_")
    except OSError as err:
        result = errno.errorcode.get(err.errno or 0, "timeout")
    print(target, result, f"{time.monotonic() - began:.2f}")
"""

# Keeps one connection open, sending a line every 0.1 s; prints "connected", then "cut" once an echo stops coming.
HOLD = """
import socket, sys, time
conn = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5)
conn.settimeout(1)
conn.recv(200)
print("connected", flush=True)
for i in range(100):
    try:
        conn.sendall(b"ping\\n")
        assert conn.recv(200) == b"ping\\n"
    except OSError:
        print("cut"); break
    time.sleep(0.1)
"""

# Echo servers on ports 8080 and 8081 of every address: a greeting naming the port and the peer, then echoes.
SERVER = """
import asyncio
async def main():
    async def serve(reader, writer, port):
        writer.write(f"hello {port} from {writer.get_extra_info('peername')[0]}\\n".encode())
        while line := await reader.readline():
            writer.write(line)
        writer.close()
    for port in (8080, 8081):
        await asyncio.start_server(lambda r, w, port=port: serve(r, w, port), "0.0.0.0", port)
    print("ready", flush=True)
    await asyncio.Event().wait()
asyncio.run(main())
"""


async def sh(*argv: str) -> str:
    """Run a command on the host; its stdout, or an AssertionError with its stderr."""
    proc = await asyncio.create_subprocess_exec(*argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await proc.communicate()
    assert proc.returncode == 0, f"{argv}: {err.decode()}"
    return out.decode()


async def network_objects(*state_dirs: Path) -> set[str]:
    """The namespaces, veths (by their alias) and nftables tables of this host that the env services with these
    state dirs made (other test runs may make their own meanwhile)."""
    names = {f"netns {line.split()[0]}" for line in (await sh("ip", "netns", "list")).splitlines()}
    names |= {f"veth {alias}" for alias in re.findall(r"\balias (\S+)", await sh("ip", "-o", "link"))}
    names |= {f"table {line.split()[-1]}" for line in (await sh("nft", "list", "tables")).splitlines()}
    for save in ("iptables-legacy-save", "ip6tables-legacy-save"):  # a sandbox's chains count as its one table
        saved = (await sh(save)) if shutil.which(save) else ""
        names |= {f"table {line[1:].split()[0].rsplit('-', 1)[0]}" for line in saved.splitlines() if line[:1] == ":"}
    prefixes = tuple(name_prefix(d) for d in state_dirs)
    return {name for name in names if name.split()[1].startswith(prefixes)}


@pytest.fixture
async def env(start_env: StartEnv, request: FixtureRequest) -> EnvServer:
    """One env server with default settings but egress_firewall, the test's parameter where it has one (LEGACY)."""
    return await start_env(egress_firewall=getattr(request, "param", "auto"))


@dataclass
class LinkLocalHost:
    """A host the sandboxes may be allowed to reach: two addresses, echo servers on ports 8080 and 8081."""

    allowed: str
    other: str
    router: str
    """This host's own address towards the test host: sandboxes' traffic arrives masqueraded from it."""


@pytest.fixture
async def test_host() -> AsyncIterator[LinkLocalHost]:
    """A test host in a network namespace of its own, linked to this host by a veth in 169.254.0.0/24 (never given
    to sandboxes); its servers, link and namespace are removed after the test."""
    ns = f"orchtest-{uuid.uuid4().hex[:8]}"
    await sh("ip", "netns", "add", ns)
    server = veth = None
    try:
        for block in random.sample(range(1, 31), 30):  # the veth's name holds the block against other test runs
            proc = await asyncio.create_subprocess_exec(
                "ip",
                "link",
                "add",
                f"orchtest-{block}",
                "type",
                "veth",
                "peer",
                "name",
                "eth0",
                "netns",
                ns,
                stderr=asyncio.subprocess.DEVNULL,
            )
            if await proc.wait() == 0:
                veth = f"orchtest-{block}"
                break
        assert veth is not None, "every test host block 169.254.0.8-247 is taken"
        net = ipaddress.IPv4Network(f"169.254.0.{8 * block}/29")
        router, allowed, other = (str(net[i]) for i in (1, 2, 3))
        await sh("ip", "addr", "add", f"{router}/29", "dev", veth)
        await sh("ip", "link", "set", veth, "up")
        # Answers to the sandboxes come back through here; forward them (this link only, ip_forward stays).
        Path(f"/proc/sys/net/ipv4/conf/{veth}/forwarding").write_text("1\n")
        for args in (
            ["addr", "add", f"{allowed}/29", "dev", "eth0"],
            ["addr", "add", f"{other}/29", "dev", "eth0"],
            ["link", "set", "eth0", "up"],
            ["link", "set", "lo", "up"],
        ):
            await sh("ip", "-n", ns, *args)
        server = await asyncio.create_subprocess_exec(
            "ip", "netns", "exec", ns, sys.executable, "-c", SERVER, stdout=asyncio.subprocess.PIPE
        )
        assert server.stdout is not None
        assert await asyncio.wait_for(server.stdout.readline(), 10) == b"ready\n"
        yield LinkLocalHost(allowed=allowed, other=other, router=router)
    finally:
        if server is not None and server.returncode is None:
            server.kill()
            await server.wait()
        # The pair goes at once with our end; the namespace may outlive its name for a while (a killed server's
        # orphaned sockets), and its address must not answer for the next test's host meanwhile.
        if veth is not None:
            await sh("ip", "link", "del", veth)
        await sh("ip", "netns", "del", ns)


async def probe(stub: Stub, sandbox_id: str, *targets: str) -> dict[str, str]:
    """Connect from the sandbox to each host:port; what came back (a greeting or an errno name), by target."""
    ex = await run(stub, sandbox_id, ["python3", "-c", PROBE, *targets], timeout=20)
    assert ex.state == pb.EXEC_STATE_SUCCEEDED, ex
    results = {}
    for line in ex.stdout.decode().splitlines():
        target, result, seconds = line.split()
        assert result.startswith("hello") or float(seconds) < 1, f"{target} took {seconds}s to fail: {result}"
        results[target] = result
    return results


def rule(cidr: str = "", port: int = 0, host: str = "") -> pb.EgressRule:
    """One EgressRule."""
    return pb.EgressRule(cidr=cidr, host=host, port=port)


async def set_policy(stub: Stub, sandbox_id: str, *rules: pb.EgressRule) -> pb.Sandbox:
    """SetNetworkPolicy; returns the sandbox as the response shows it."""
    request = pb.SetNetworkPolicyRequest(sandbox_id=sandbox_id, network_policy=pb.NetworkPolicy(allow=rules))
    return (await stub.SetNetworkPolicy(request, timeout=10)).sandbox


async def gateway(stub: Stub, sandbox_id: str) -> str:
    """The host's end of the sandbox's veth, as the sandbox's default route names it."""
    ex = await run(stub, sandbox_id, "ip -4 route show default")
    return ex.stdout.decode().split()[2]


@LEGACY
async def test_allowed_destination_is_reachable_and_nothing_else(stub: Stub, test_host: LinkLocalHost) -> None:
    """Only the allowed address and port answer (masqueraded); another port, address or the host itself fail fast."""
    allowed = f"{test_host.allowed}:8080"
    sb = await create(stub, network_policy=pb.NetworkPolicy(allow=[rule(f"{test_host.allowed}/32", 8080)]))
    gw = await gateway(stub, sb.sandbox_id)
    host_server = await asyncio.start_server(lambda r, w: w.close(), gw, 0)
    port = host_server.sockets[0].getsockname()[1]
    try:
        results = await probe(
            stub, sb.sandbox_id, allowed, f"{test_host.allowed}:8081", f"{test_host.other}:8080", f"{gw}:{port}"
        )
    finally:
        host_server.close()
    assert results == {
        allowed: f"hello_8080_from_{test_host.router}",
        f"{test_host.allowed}:8081": "EHOSTUNREACH",
        f"{test_host.other}:8080": "EHOSTUNREACH",
        f"{gw}:{port}": "EHOSTUNREACH",
    }
    assert list(sb.network_policy.allow) == [rule(f"{test_host.allowed}/32", 8080)]


@LEGACY
async def test_broad_rule_opens_the_world_but_not_this_host(stub: Stub, test_host: LinkLocalHost) -> None:
    """0.0.0.0/0 reaches outside hosts, but this host's own services (the env service among them) stay closed
    unless a rule names their one address."""
    sb = await create(stub, network_policy=pb.NetworkPolicy(allow=[rule("0.0.0.0/0")]))
    gw = await gateway(stub, sb.sandbox_id)

    async def greet(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"hello_host\n")
        await writer.drain()
        writer.close()

    host_server = await asyncio.start_server(greet, gw, 0)
    port = host_server.sockets[0].getsockname()[1]
    try:
        outside = f"{test_host.allowed}:8080"
        results = await probe(stub, sb.sandbox_id, outside, f"{gw}:{port}")
        assert results == {outside: f"hello_8080_from_{test_host.router}", f"{gw}:{port}": "EHOSTUNREACH"}
        await set_policy(stub, sb.sandbox_id, rule("0.0.0.0/0"), rule(f"{gw}/32", port))
        assert (await probe(stub, sb.sandbox_id, f"{gw}:{port}"))[f"{gw}:{port}"].startswith("hello_host")
    finally:
        host_server.close()


async def test_default_sandbox_has_only_loopback_at_no_cost(env: EnvServer, stub: Stub) -> None:
    """A sandbox without rules has only lo, and no namespace, veth or table is made for it."""
    sb = await create(stub)
    try:
        ex = await run(stub, sb.sandbox_id, "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '")
        assert ex.stdout == b"lo\n"
        assert await network_objects(env.settings.state_dir) == set()
    finally:
        await delete_quietly(stub, sb.sandbox_id)


async def test_set_network_policy_changes_a_live_sandbox(stub: Stub, test_host: LinkLocalHost) -> None:
    """SetNetworkPolicy replaces the allowlist whole, the change holds, and no rules means no egress again."""
    allowed = f"{test_host.allowed}:8080"
    sb = await create(stub, network_policy=pb.NetworkPolicy(allow=[rule(f"{test_host.allowed}/32", 8080)]))
    sid = sb.sandbox_id
    gw = await gateway(stub, sid)

    async def greet(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"hello host\n")
        writer.close()

    host_server = await asyncio.start_server(greet, gw, 0)
    on_host = f"{gw}:{host_server.sockets[0].getsockname()[1]}"
    try:
        assert await probe(stub, sid, allowed, on_host) == {
            allowed: f"hello_8080_from_{test_host.router}",
            on_host: "EHOSTUNREACH",
        }
        # A host name resolves now; an IPv6 cidr is kept but has nothing to reach (sandbox links are IPv4 only).
        new = [rule(f"{gw}/32", int(on_host.split(":")[1])), rule(host="localhost", port=1), rule("::/0")]
        assert list((await set_policy(stub, sid, *new)).network_policy.allow) == new
        for _ in range(2):  # the change holds
            assert await probe(stub, sid, allowed, on_host) == {allowed: "EHOSTUNREACH", on_host: "hello_host"}
        assert list((await set_policy(stub, sid)).network_policy.allow) == []
        assert await probe(stub, sid, allowed, on_host) == {allowed: "EHOSTUNREACH", on_host: "EHOSTUNREACH"}
        got = (await stub.GetSandbox(pb.GetSandboxRequest(sandbox_id=sid), timeout=5)).sandbox
        assert list(got.network_policy.allow) == []
        await set_policy(stub, sid, rule(f"{test_host.allowed}/32"))  # from no rules back to some
        assert await probe(stub, sid, allowed, on_host) == {
            allowed: f"hello_8080_from_{test_host.router}",
            on_host: "EHOSTUNREACH",
        }
    finally:
        host_server.close()


@LEGACY
async def test_taking_a_rule_away_cuts_open_connections(stub: Stub, test_host: LinkLocalHost) -> None:
    """A connection the old policy admitted stops working once the new policy no longer allows it."""
    sb = await create(stub, network_policy=pb.NetworkPolicy(allow=[rule(f"{test_host.allowed}/32", 8080)]))
    ex = await start(stub, sb.sandbox_id, ["python3", "-c", HOLD, test_host.allowed, "8080"], timeout=20)
    stream = stub.StreamExec(pb.StreamExecRequest(exec_id=ex.exec_id), timeout=20)
    assert (await stream.read()).stdout == b"connected\n"
    await set_policy(stub, sb.sandbox_id)
    rest = b""
    while (message := await stream.read()) is not grpc.aio.EOF:
        rest += message.stdout
    assert rest == b"cut\n"


async def test_sandbox_cannot_change_its_own_network(stub: Stub, test_host: LinkLocalHost) -> None:
    """Root in the sandbox cannot flush its rules (nftables' or iptables'), drop its route or take its link down; the
    policy still holds."""
    allowed = f"{test_host.allowed}:8080"
    sb = await create(stub, network_policy=pb.NetworkPolicy(allow=[rule(f"{test_host.allowed}/32", 8080)]))
    for command in ("nft flush ruleset", "iptables-legacy -F", "ip route del default", "ip link set eth0 down"):
        ex = await run(stub, sb.sandbox_id, command)
        assert ex.exit_code != 0, command
        assert b"not permitted" in ex.stderr or b"Permission denied" in ex.stderr, ex.stderr
    assert await probe(stub, sb.sandbox_id, allowed, f"{test_host.other}:8080") == {
        allowed: f"hello_8080_from_{test_host.router}",
        f"{test_host.other}:8080": "EHOSTUNREACH",
    }


BAD_RULES = [
    pytest.param(rule(), "exactly one", id="empty"),
    pytest.param(rule(cidr="169.254.0.0/16", host="localhost"), "exactly one", id="cidr-and-host"),
    pytest.param(rule(cidr="169.254.0.0/33"), "cidr", id="bad-cidr"),
    pytest.param(rule(cidr="localhost"), "cidr", id="name-as-cidr"),
    pytest.param(rule(cidr="169.254.0.2", port=-1), "port", id="negative-port"),
    pytest.param(rule(cidr="169.254.0.2", port=65536), "port", id="port-too-big"),
    pytest.param(rule(host="bad host!"), "host", id="bad-host-name"),
]


@pytest.mark.parametrize(("bad", "fragment"), BAD_RULES)
async def test_invalid_rules_are_invalid_argument(
    env: EnvServer, stub: Stub, bad: pb.EgressRule, fragment: str
) -> None:
    """A bad rule is INVALID_ARGUMENT naming the problem, at create and at SetNetworkPolicy, and changes nothing."""
    with pytest.raises(grpc.aio.AioRpcError) as created:
        await create(stub, network_policy=pb.NetworkPolicy(allow=[rule("169.254.0.2/32"), bad]))
    sb = await create(stub, network_policy=pb.NetworkPolicy(allow=[rule("169.254.0.2/32", 8080)]))
    with pytest.raises(grpc.aio.AioRpcError) as changed:
        await set_policy(stub, sb.sandbox_id, bad)
    for err in (created.value, changed.value):
        assert err.code() is Code.INVALID_ARGUMENT, err
        assert fragment.lower() in (err.details() or "").lower() and "rule" in (err.details() or ""), err
    got = (await stub.GetSandbox(pb.GetSandboxRequest(sandbox_id=sb.sandbox_id), timeout=5)).sandbox
    assert list(got.network_policy.allow) == [rule("169.254.0.2/32", 8080)]
    await delete_quietly(stub, sb.sandbox_id)
    listed = await stub.ListSandboxes(pb.ListSandboxesRequest(), timeout=5)
    assert list(listed.sandboxes) == []
    assert await network_objects(env.settings.state_dir) == set()


async def test_policy_of_a_sandbox_created_without_one(stub: Stub) -> None:
    """A sandbox made without rules has no network to open (FAILED_PRECONDITION); setting no rules is a no-op."""
    sb = await create(stub)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await set_policy(stub, sb.sandbox_id, rule("169.254.0.2/32"))
    assert err.value.code() is Code.FAILED_PRECONDITION
    assert "create the sandbox with a network policy" in (err.value.details() or "")
    assert list((await set_policy(stub, sb.sandbox_id)).network_policy.allow) == []


async def test_unresolvable_host_is_invalid_argument(tmp_path: Path) -> None:
    """A host name that does not resolve is INVALID_ARGUMENT (the resolver alone, /etc/hosts its only source)."""
    # A real DNS lookup would send a query off this machine: run it in a mount namespace whose nsswitch.conf knows
    # only /etc/hosts, which is why this test calls the resolver, not the service.
    nsswitch = tmp_path / "nsswitch.conf"
    nsswitch.write_text("hosts: files\n")
    script = (
        "import asyncio\n"
        "from orchard.services.env.backends.base import EgressRule\n"
        "from orchard.services.env.backends.network import resolve\n"
        "print(asyncio.run(resolve((EgressRule(host='localhost', port=80),)))[0].match())\n"
        "try:\n"
        "    asyncio.run(resolve((EgressRule(host='no-such-host.invalid'),)))\n"
        "except Exception as err:\n"
        "    print(type(err).__name__, err.code.name, err)\n"
    )
    out = await sh(
        "unshare",
        "--mount",
        "sh",
        "-c",
        'mount --bind "$0" /etc/nsswitch.conf && exec "$1" -c "$2"',
        str(nsswitch),
        sys.executable,
        script,
    )
    resolved, failed = out.splitlines()
    assert resolved == "ip daddr { 127.0.0.1 } meta l4proto { tcp, udp } th dport 80"
    assert failed.startswith(
        "InvalidArgument INVALID_ARGUMENT network_policy rule 0: host 'no-such-host.invalid' does not resolve"
    ), failed


@pytest.mark.parametrize("firewall", ["auto", "iptables"])
async def test_teardown_and_crash_leave_nothing(start_env: StartEnv, tmp_path: Path, firewall: str) -> None:
    """Delete and stop remove every namespace, veth and table (iptables: chains); a restart removes what a killed
    service left."""
    state_dir = tmp_path / "crashed"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with open(tmp_path / "crashed.log", "wb") as log:
        crashed = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "orchard.services.env.server",
            "--port",
            str(port),
            "--state-dir",
            str(state_dir),
            "--egress-firewall",
            firewall,
            cwd=REPO,
            stdout=log,
            stderr=log,
        )
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            await asyncio.wait_for(channel.channel_ready(), 15)
            for _ in range(2):
                await create(
                    env_pb2_grpc.EnvServiceStub(channel),
                    network_policy=pb.NetworkPolicy(allow=[rule("169.254.0.2/32")]),
                )
        left = await network_objects(state_dir)
    finally:
        crashed.kill()  # no clean-up: as if it crashed (its sandboxes die with it: --die-with-parent)
        await crashed.wait()
        env = await start_env(state_dir=state_dir, egress_firewall=firewall)  # removes what the crashed one left
    assert len(left) == 2 * 3, (tmp_path / "crashed.log").read_text()  # a namespace, a veth and a table each
    assert await network_objects(state_dir) == set()
    for _ in range(2):
        await create(env.stub, network_policy=pb.NetworkPolicy(allow=[rule("169.254.0.2/32")]))
    sb = (await env.stub.ListSandboxes(pb.ListSandboxesRequest(), timeout=5)).sandboxes[0]
    await env.stub.DeleteSandbox(pb.DeleteSandboxRequest(sandbox_id=sb.sandbox_id), timeout=10)
    assert len(await network_objects(state_dir)) == 3
    await env.channel.close()
    await env.server.stop()  # destroys the other one
    assert await network_objects(state_dir) == set()
