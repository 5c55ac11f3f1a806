"""Egress allowlists of the local backend. A sandbox with rules gets a network namespace of its own, a veth pair to
this host's namespace with a link-local /30, a default route via the host's end, and firewall rules on both sides:
nftables' (inet family), or where the kernel lacks that family legacy iptables' (iptables.py renders the same rules),
chosen once per service (choose_firewall). A sandbox without rules never comes here and keeps bubblewrap's empty
namespace (only lo)."""

from __future__ import annotations

import asyncio
import hashlib
import ipaddress
import logging
import shutil
import socket
from collections.abc import Awaitable
from dataclasses import dataclass
from pathlib import Path

from orchard.errors import (
    FailedPrecondition,
    InvalidArgument,
    ResourceExhausted,
    Unavailable,
)
from orchard.services.env.backends import iptables
from orchard.services.env.backends.base import EgressRule

log = logging.getLogger(__name__)

POOL = ipaddress.IPv4Network("169.254.0.0/16")
# RFC 3927 reserves the first and last /24; 169.254.169.254 is the cloud metadata service, never to be shadowed.
RESERVED = tuple(ipaddress.IPv4Network(n) for n in ("169.254.0.0/24", "169.254.169.0/24", "169.254.255.0/24"))
SLOTS = tuple(s for s in range(POOL.num_addresses // 4) if not any(POOL[4 * s] in r for r in RESERVED))
VETH_PREFIX = "orchard-"  # the host end is orchard-<slot>: the kernel's unique names make the slot ours host-wide
INNER_TABLE = "orchard"
COMMAND_TIMEOUT_S = 10.0
RESOLVE_TIMEOUT_S = 10.0
SLOT_TRIES = 64
FIREWALLS = ("nftables", "iptables")
"""The firewalls that can carry an allowlist, in the order egress_firewall="auto" tries them."""


@dataclass(frozen=True)
class Allowed:
    """One rule as nftables sees it: the address family ("ip" or "ip6"), destinations, and a port (0 = any)."""

    family: str
    daddr: str
    port: int

    def match(self) -> str:
        ports = f" meta l4proto {{ tcp, udp }} th dport {self.port}" if self.port else ""
        return f"{self.family} daddr {self.daddr}{ports}"

    @property
    def addresses(self) -> list[str]:
        """The destinations one by one: a network, or the addresses a host name resolved to."""
        return [p.strip() for p in self.daddr.strip("{} ").split(",") if p.strip()]

    @property
    def single_address(self) -> bool:
        """True when the rule names one address, not a range."""
        parts = self.addresses
        return len(parts) == 1 and ipaddress.ip_network(parts[0], strict=False).num_addresses == 1


@dataclass(frozen=True)
class Link:
    """The network of one sandbox: its namespace (also the name of its table here) and its veth pair."""

    name: str
    slot: int

    @property
    def veth(self) -> str:
        return f"{VETH_PREFIX}{self.slot}"

    @property
    def host_addr(self) -> str:
        return str(POOL[4 * self.slot + 1])

    @property
    def sandbox_addr(self) -> str:
        return str(POOL[4 * self.slot + 2])

    @property
    def netns_path(self) -> str:
        return f"/run/netns/{self.name}"


async def resolve(rules: tuple[EgressRule, ...]) -> list[Allowed]:
    """The rules with host names resolved now, to IPv4 addresses: the sandbox's link has IPv4 only, so an IPv6
    cidr is kept in the rules (portable policies) but has nothing to reach."""

    async def one(index: int, rule: EgressRule) -> Allowed:
        if rule.cidr:
            network = ipaddress.ip_network(rule.cidr, strict=False)
            return Allowed("ip" if network.version == 4 else "ip6", str(network), rule.port)
        try:
            async with asyncio.timeout(RESOLVE_TIMEOUT_S):
                infos = await asyncio.get_running_loop().getaddrinfo(
                    rule.host, None, family=socket.AF_INET, type=socket.SOCK_STREAM
                )
        except TimeoutError:
            raise Unavailable(
                f"network_policy rule {index}: resolving host {rule.host!r} took over "
                f"{RESOLVE_TIMEOUT_S:g}s; retry later",
                retry_after=5.0,
            ) from None
        except socket.gaierror as err:
            if err.errno == socket.EAI_AGAIN:
                raise Unavailable(
                    f"network_policy rule {index}: cannot resolve host {rule.host!r} now ({err.strerror}); retry later",
                    retry_after=5.0,
                ) from None
            raise InvalidArgument(
                f"network_policy rule {index}: host {rule.host!r} does not resolve to an IPv4 "
                f"address ({err.strerror}); use a resolvable name or a cidr",
                field="network_policy",
            ) from None
        addresses = sorted({str(info[4][0]) for info in infos}, key=ipaddress.IPv4Address)
        return Allowed("ip", f"{{ {', '.join(addresses)} }}", rule.port)

    return list(await asyncio.gather(*(one(i, rule) for i, rule in enumerate(rules))))


def inner_ruleset(allowed: list[Allowed], protected: list[str] | tuple[()] = ()) -> str:
    """The sandbox's own rules, one transaction that replaces the last (a flush, not a delete of the table: that
    waits for an RCU grace period, ~12 ms): only the allowed destinations leave.

    Outgoing packets of a connection are matched against the rules every time (no blanket "established accept"),
    so taking a rule away also cuts the connections it had admitted; `ct direction reply` passes answers to
    connections opened into the sandbox from this host. Refused packets get an ICMP error: connects fail at once.
    `protected`: this host's own addresses, refused unless a rule names that one address (a rootless sandbox's
    guards: it has no host side to filter on).
    """
    first = ""
    if protected:
        first = "".join(f"    {a.match()} accept\n" for a in allowed if a.single_address)
        for family, version in (("ip", 4), ("ip6", 6)):
            if addresses := [a for a in protected if ipaddress.ip_address(a).version == version]:
                first += f"    {family} daddr {{ {', '.join(addresses)} }} reject with icmpx type admin-prohibited\n"
    accepts = "".join(f"    {a.match()} accept\n" for a in allowed)
    return (
        f"table inet {INNER_TABLE}\nflush table inet {INNER_TABLE}\n"
        f"table inet {INNER_TABLE} {{\n  chain output {{\n"
        "    type filter hook output priority filter; policy drop;\n"
        '    oif "lo" accept\n'
        "    ct direction reply accept\n"
        f"{first}{accepts}"
        "    reject with icmpx type admin-prohibited\n"
        "  }\n}\n"
    )


def host_ruleset(link: Link, allowed: list[Allowed]) -> str:
    """This host's rules for one sandbox's veth: the same allowlist again (should the sandbox ever get the rights to
    change its own rules), nothing may open connections into the sandbox, and forwarded traffic is masqueraded.
    No chain here drops by policy: every rule names the sandbox's veth, so other traffic never matches."""
    iif, oif = f'iifname "{link.veth}"', f'oifname "{link.veth}"'
    accepts = "".join(f"    {iif} {a.match()} accept\n" for a in allowed)
    # This host's own services (the env service itself among them) are reachable only through rules that name one
    # address: a range such as 0.0.0.0/0 opens the outside world, never the host the sandbox runs on.
    host_accepts = "".join(f"    {iif} {a.match()} accept\n" for a in allowed if a.single_address)
    return (
        f"table inet {link.name}\nflush table inet {link.name}\n"
        f"table inet {link.name} {{\n"
        "  chain input {\n    type filter hook input priority filter; policy accept;\n"
        f"    {iif} ct direction reply accept\n{host_accepts}"
        f"    {iif} reject with icmpx type admin-prohibited\n  }}\n"
        "  chain forward {\n    type filter hook forward priority filter; policy accept;\n"
        f"    {oif} ct direction reply accept\n    {oif} drop\n{accepts}"
        f"    {iif} reject with icmpx type admin-prohibited\n  }}\n"
        "  chain postrouting {\n    type nat hook postrouting priority srcnat; policy accept;\n"
        f'    {iif} oifname != "{link.veth}" masquerade\n  }}\n}}\n'
    )


def name_prefix(state_dir: Path) -> str:
    """How the names of the namespaces, tables and veth aliases of the service with this state dir begin."""
    return f"orchard-{hashlib.sha256(str(state_dir.resolve()).encode()).hexdigest()[:8]}-"


class CommandFailed(Exception):
    """An `ip` or `nft` command exited with an error (stderr in the message)."""


async def _run(*argv: str, stdin: str = "") -> str:
    """Run one `ip`/`nft` command and return its stdout; CommandFailed with its stderr when it fails."""
    if shutil.which(argv[0]) is None:
        raise FailedPrecondition(
            f"{argv[0]!r} is not installed; egress allowlists need iproute2, and nftables or iptables (run "
            "scripts/install.sh)"
        )
    proc = await asyncio.create_subprocess_exec(
        *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    try:
        async with asyncio.timeout(COMMAND_TIMEOUT_S):
            out, err = await proc.communicate(stdin.encode())
    except BaseException as exc:  # a timeout or a cancelled create: never leave the command running
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        if isinstance(exc, TimeoutError):
            raise CommandFailed(f"`{' '.join(argv)}` took over {COMMAND_TIMEOUT_S:g}s and was killed") from None
        raise
    if proc.returncode != 0:
        raise CommandFailed(f"`{' '.join(argv)}` failed: {err.decode(errors='replace').strip() or proc.returncode}")
    return out.decode()


async def _all(*steps: Awaitable[object]) -> None:
    """Run the steps side by side and wait for every one (no step left running); then raise the first error."""
    for result in await asyncio.gather(*steps, return_exceptions=True):
        if isinstance(result, BaseException):
            raise result


ROOTLESS_MODULES = (
    " (a rootless service cannot load kernel modules: root loads legacy iptables' for it, e.g. from "
    f"/etc/modules-load.d: {' '.join(iptables.MODULES)})"
)
Load = tuple[list[str], str]
"""A command that reads rules on its stdin, and those rules."""
TOOLS = {"nftables": ["nft"], "iptables": ["iptables-legacy-restore", "ip6tables-legacy-restore"]}


def inner_loads(
    firewall: str, allowed: list[Allowed], protected: list[str] | tuple[()] = (), lock: str = ""
) -> list[Load]:
    """What loads a sandbox's own rules (inner_ruleset's) with this firewall, run in its network namespace."""
    if firewall == "nftables":
        return [(["nft", "-f", "-"], inner_ruleset(allowed, protected))]
    return [
        (iptables.restore_argv(v, lock=lock), iptables.inner_rules(allowed, v, protected)) for v in iptables.VERSIONS
    ]


def host_loads(firewall: str, link: Link, chains: str, allowed: list[Allowed], *, hook: bool) -> list[Load]:
    """What loads this host's rules for a sandbox's veth (host_ruleset's) with this firewall; `chains` and `hook`:
    iptables.host_rules'."""
    if firewall == "nftables":
        return [(["nft", "-f", "-"], host_ruleset(link, allowed))]
    return [
        (iptables.restore_argv(v, noflush=True), iptables.host_rules(chains, link, allowed, v, hook=hook))
        for v in iptables.VERSIONS
    ]


async def choose_firewall(setting: str, netns: list[str], *, host: bool, lock: str = "") -> str:
    """The firewall that carries this service's allowlists: the one `setting` names, or with "auto" the first of
    FIREWALLS that works here, each tried by loading the rules a sandbox gets (`host`: and this host's for it) in a
    new network namespace (`netns`: the command that makes one; `lock`: iptables.restore_argv's). FailedPrecondition
    naming what each lacks when none does."""
    sample = [Allowed("ip", "192.0.2.1/32", 80), Allowed("ip6", "2001:db8::1/128", 0)]
    link = Link("orchard-probe", SLOTS[0])
    problems = []
    for name in FIREWALLS if setting == "auto" else (setting,):
        loads = inner_loads(name, sample, lock=lock) + (
            host_loads(name, link, "probe-", sample, hook=True) if host else []
        )
        if missing := [tool for tool in TOOLS[name] if shutil.which(tool) is None]:
            problems.append(f"{name}: {', '.join(missing)} not installed")
            continue
        try:
            await _all(*(_run(*netns, *argv, stdin=text) for argv, text in loads))
        except CommandFailed as err:
            problems.append(f"{name}: {str(err).splitlines()[0]}")  # nft repeats its error for every line
            continue
        if problems:
            log.info("egress allowlists through %s (%s)", name, "; ".join(problems))
        return name
    raise FailedPrecondition(
        "egress allowlists need nftables with its inet family (a kernel with CONFIG_NF_TABLES_INET) or legacy "
        f"iptables (iptables-legacy, with conntrack, REJECT{' and NAT' if host else ''}), and none works here "
        f"({'; '.join(problems)}); install nftables or iptables (scripts/install.sh){'' if host else ROOTLESS_MODULES}"
        f", or set the env service's egress_firewall (now {setting!r}); create the sandbox without a network policy "
        "meanwhile",
        field="network_policy",
    )


class FirewallChoice:
    """The firewall of one service's allowlists: its egress_firewall setting, resolved by choose_firewall at the
    first allowlist and kept (`name` is "" until then)."""

    def __init__(self, setting: str, netns: list[str], *, host: bool, lock: str = "") -> None:
        self._setting, self._netns, self._host, self._lock = setting, netns, host, lock
        self._choosing = asyncio.Lock()
        self.name = ""

    async def get(self) -> str:
        async with self._choosing:
            if not self.name:
                self.name = await choose_firewall(self._setting, self._netns, host=self._host, lock=self._lock)
        return self.name


async def _remove_chains(chains: str) -> set[str]:
    """Remove this host's iptables chains whose names begin with `chains`, and the jumps to them; their names."""
    found: set[str] = set()

    async def family(version: int) -> None:
        tables = Path(f"/proc/net/ip{'6' if version == 6 else ''}_tables_names")  # none loaded: no rules at all
        if not tables.exists() or not tables.read_text().strip():
            return
        saved = await _run("ip6tables-legacy-save" if version == 6 else "iptables-legacy-save")
        if text := iptables.removal(saved, chains):
            await _run(*iptables.restore_argv(version, noflush=True), stdin=text)
            found.update(line.split()[1] for line in text.splitlines() if line.startswith("-X "))

    await _all(*(family(v) for v in iptables.VERSIONS))
    return found


class SandboxNetworks:
    """The networks of one env service's sandboxes: allocation, set-up, rule changes and teardown.

    Names carry a tag of the service's state dir (`orchard-<tag>-<sandbox id>` for the namespace, the host's table
    and the alias of the host's veth), so a service that starts again removes what its crashed predecessor left,
    and no other service's.
    """

    def __init__(self, state_dir: Path, firewall: str = "auto") -> None:
        self._prefix = name_prefix(state_dir)
        self._firewall = FirewallChoice(firewall, ["unshare", "--net"], host=True)
        self._links: dict[str, Link] = {}
        self._used: set[int] = set()
        self._cursor = 0  # allocation goes round the pool, so a freed slot is not reused at once

    def enter_argv(self, sandbox_id: str) -> list[str]:
        """The command prefix that starts a process in the sandbox's namespace ([] when it has none)."""
        link = self._links.get(sandbox_id)
        return [] if link is None else ["nsenter", f"--net={link.netns_path}"]

    async def remove_leftovers(self) -> int:
        """Remove the namespaces, veths, tables and chains a previous run of this service left; returns how many
        (whichever firewall it used)."""
        if shutil.which("ip") is None:
            return 0
        names = [
            line.split()[0]
            for line in (await _run("ip", "netns", "list")).splitlines()
            if line.startswith(self._prefix)
        ]
        tables = [
            line.split()[2]
            for line in (await _run("nft", "list", "tables", "inet") if shutil.which("nft") else "").splitlines()
            if line.split()[2:3] and line.split()[2].startswith(self._prefix)
        ]
        for name in names:
            await self._remove(Link(name, -1), netns=True, table=False)
        if tables:
            await _run("nft", "-f", "-", stdin="".join(f"delete table inet {t}\n" for t in tables))
        chains = await _remove_chains(self._prefix) if shutil.which("iptables-legacy-save") else set()
        return len(set(names) | set(tables)) + len({c.rsplit("-", 1)[0] for c in chains})

    async def create(self, sandbox_id: str, rules: tuple[EgressRule, ...]) -> None:
        """Make the sandbox's namespace, link and rules; the sandbox's processes start in it (enter_argv)."""
        allowed = await resolve(rules)  # first: a bad host name must not leave anything behind
        await self._firewall.get()
        name = f"{self._prefix}{sandbox_id}"
        self._links[sandbox_id] = link = Link(name, -1)  # destroy() finds whatever exists from here on
        try:
            await _run("ip", "netns", "add", name)
            for _ in range(SLOT_TRIES):
                self._links[sandbox_id] = link = Link(name, self._allocate())
                try:
                    await _run("ip", "link", "add", link.veth, "type", "veth", "peer", "name", "eth0", "netns", name)
                    break
                except CommandFailed as err:
                    self._used.discard(link.slot)
                    if "File exists" not in str(err):  # anything but a slot another service holds
                        raise
            else:
                raise ResourceExhausted(
                    f"no free link-local /30 for sandbox {sandbox_id!r} after {SLOT_TRIES} "
                    f"tries (veths {VETH_PREFIX}* are taken); delete sandboxes or retry later",
                    retry_after=5.0,
                )
            await _all(
                _run(
                    "ip",
                    "-batch",
                    "-",
                    stdin=(
                        f"link set dev {link.veth} addrgenmode none alias {name}\n"
                        f"addr add {link.host_addr}/30 dev {link.veth}\n"
                        f"link set dev {link.veth} up\n"
                    ),
                ),
                _run(
                    "ip",
                    "-n",
                    name,
                    "-batch",
                    "-",
                    stdin=(
                        "link set dev lo up\n"
                        "link set dev eth0 addrgenmode none\n"
                        f"addr add {link.sandbox_addr}/30 dev eth0\n"
                        "link set dev eth0 up\n"
                        f"route add default via {link.host_addr}\n"
                    ),
                ),
                self._apply(link, allowed, hook=True),
            )
            # Forward what comes in on this veth only (the host-wide ip_forward stays as it is).
            Path(f"/proc/sys/net/ipv4/conf/{link.veth}/forwarding").write_text("1\n")
        except CommandFailed as err:
            raise FailedPrecondition(
                f"cannot set up the network of sandbox {sandbox_id!r} through {self._firewall.name}: {err} (egress "
                "allowlists need root, iproute2, and nftables with its inet family or legacy iptables)"
            ) from None

    async def apply(self, sandbox_id: str, rules: tuple[EgressRule, ...]) -> None:
        """Replace the sandbox's allowlist (no rules: it may reach nothing)."""
        link = self._links.get(sandbox_id)
        if link is None:
            if rules:
                raise FailedPrecondition(
                    f"sandbox {sandbox_id!r} was created without a network policy, so it has no "
                    "network to open; create the sandbox with a network policy to change it "
                    "later",
                    field="network_policy",
                )
            return  # it has no network at all: "no rules" is already in force
        allowed = await resolve(rules)
        try:
            await self._apply(link, allowed)
        except CommandFailed as err:
            raise Unavailable(f"cannot change the network policy of sandbox {sandbox_id!r}: {err}") from None

    async def _apply(self, link: Link, allowed: list[Allowed], *, hook: bool = False) -> None:
        # The sandbox's own rules decide; the host's repeat them. Each swaps atomically (per IP version with
        # iptables), and a packet must pass both: while one is old and the other new, the sandbox reaches no more than
        # either policy allows. So they go side by side (taking rules away waits ~12 ms for an RCU grace period in
        # each). `hook`: the sandbox's first rules (iptables: the jumps to its chains come with them).
        inside = ["nsenter", f"--net={link.netns_path}"]
        loads = [([*inside, *argv], text) for argv, text in inner_loads(self._firewall.name, allowed)]
        loads += host_loads(self._firewall.name, link, self._chains(link), allowed, hook=hook)
        await _all(*(_run(*argv, stdin=text) for argv, text in loads))

    def _chains(self, link: Link) -> str:
        """How the names of the sandbox's iptables chains on this host begin (iptables.SUFFIXES end them)."""
        return f"{self._prefix}{link.slot}-"

    async def destroy(self, sandbox_id: str) -> None:
        """Remove the sandbox's veth pair, namespace and host table; idempotent."""
        link = self._links.pop(sandbox_id, None)
        if link is None:
            return
        await self._remove(link, netns=True, table=True)
        self._used.discard(link.slot)

    async def _remove(self, link: Link, *, netns: bool, table: bool) -> None:
        # Deleting the pair's end inside the namespace takes the host's end with it, and touches nothing of another
        # service; the namespace itself goes once its last process has exited. Each step is slow in the kernel
        # (~15 ms of RCU grace period), so the link and the table go side by side.
        async def step(*argv: str) -> None:
            try:
                await _run(*argv)
            except CommandFailed as err:
                if not any(gone in str(err) for gone in ("No such file", "Cannot find device", "does not exist")):
                    log.warning("sandbox network teardown: %s", err)

        async def namespace() -> None:
            await step("ip", "-n", link.name, "link", "del", "eth0")
            await step("ip", "netns", "del", link.name)

        async def chains() -> None:
            try:
                await _remove_chains(self._chains(link))
            except CommandFailed as err:
                log.warning("sandbox network teardown: %s", err)

        tables = []
        if table and self._firewall.name == "nftables":
            tables = [step("nft", "delete", "table", "inet", link.name)]
        elif table and self._firewall.name == "iptables" and link.slot >= 0:
            tables = [chains()]
        await _all(*([namespace()] if netns else []), *tables)

    def _allocate(self) -> int:
        for i in range(len(SLOTS)):
            slot = SLOTS[(self._cursor + i) % len(SLOTS)]
            if slot not in self._used:
                self._cursor = (self._cursor + i + 1) % len(SLOTS)
                self._used.add(slot)
                return slot
        raise ResourceExhausted(
            f"all {len(SLOTS)} link-local /30 networks are in use by sandboxes with a network "
            "policy; delete some or retry later",
            retry_after=5.0,
        )
