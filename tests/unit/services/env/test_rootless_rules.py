"""Unit tests of the rootless local backend's pure parts: the overlay's mount options and the allowlist rule set
loaded in a sandbox's pasta namespace."""

from pathlib import Path

import pytest

from orchard.services.env.backends.network import Allowed, inner_loads, inner_ruleset
from orchard.services.env.backends.rootless import overlay_options
from orchard.services.env.backends.rootless_network import net_script

pytestmark = pytest.mark.timeout(10)


def test_overlay_options_name_layers_relative_and_use_user_xattrs() -> None:
    """Snapshot layers are relative to the snapshots dir (short options), the image last, user.* xattrs on."""
    options = overlay_options(Path("/s/snapshots"), ("snap-b", "snap-a"), Path("/img/rootfs"), Path("/u"), Path("/w"))
    assert options == "lowerdir=snap-b/layer:snap-a/layer:/img/rootfs,upperdir=/u,workdir=/w,userxattr"


def test_host_addresses_stay_closed_unless_a_rule_names_one() -> None:
    """A broad rule comes after the guard on this host's addresses; a rule naming one host address comes before."""
    broad, one_host = Allowed("ip", "0.0.0.0/0", 0), Allowed("ip", "192.0.2.2/32", 22)
    lines = [
        line.strip() for line in inner_ruleset([broad, one_host], ["192.0.2.2", "10.88.0.1", "fd00::2"]).splitlines()
    ]
    assert lines[:2] == ["table inet orchard", "flush table inet orchard"]  # one transaction replaces the last
    guard4 = lines.index("ip daddr { 192.0.2.2, 10.88.0.1 } reject with icmpx type admin-prohibited")
    guard6 = lines.index("ip6 daddr { fd00::2 } reject with icmpx type admin-prohibited")
    single = lines.index("ip daddr 192.0.2.2/32 meta l4proto { tcp, udp } th dport 22 accept")
    assert single < guard4 < guard6 < lines.index("ip daddr 0.0.0.0/0 accept")
    assert lines.index('oif "lo" accept') < single and lines[-3] == "reject with icmpx type admin-prohibited"


def test_no_rules_reach_nothing() -> None:
    """Without rules only loopback and answers pass; with no host addresses there is no guard line."""
    text = inner_ruleset([], [])
    assert "accept" not in text.replace('oif "lo" accept', "").replace("ct direction reply accept", "")
    assert "daddr" not in text and "policy drop" in text


def test_net_script_loads_each_text_then_starts_the_sandbox_with_its_own_proc() -> None:
    """Inside pasta's namespaces: each rule text (an argument) piped to its command, exit 125 if one fails, then the
    sandbox behind a fresh /proc of pasta's PID namespace."""
    loads = inner_loads("iptables", [Allowed("ip", "192.0.2.2/32", 22)], ["192.0.2.9"], "/state/xtables.lock")
    args = net_script(loads)
    assert args[0] == "-c" and args[2:] == ["sh", loads[0][1], loads[1][1]]
    assert args[1] == (
        'printf "%s" "$1" | env XTABLES_LOCKFILE=/state/xtables.lock iptables-legacy-restore -w || exit 125; shift; '
        'printf "%s" "$1" | env XTABLES_LOCKFILE=/state/xtables.lock ip6tables-legacy-restore -w || exit 125; shift; '
        'exec unshare --mount --mount-proc "$@"'
    )
