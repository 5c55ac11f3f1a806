"""Unit tests of egress allowlists' pure logic: rule validation, the address pool and the nftables rule sets."""

import ipaddress

import pytest

from orchard.errors import InvalidArgument
from orchard.services.env.backends.base import EgressRule
from orchard.services.env.backends.network import POOL, RESERVED, SLOTS, Allowed, Link, host_ruleset, inner_ruleset
from orchard.services.env.manager import MAX_EGRESS_RULES, check_egress

pytestmark = pytest.mark.timeout(10)


def test_valid_rules_pass() -> None:
    """CIDRs (v4 and v6, host bits allowed), single addresses and host names with ports 0..65535 are valid."""
    check_egress(
        (
            EgressRule(cidr="169.254.0.0/16"),
            EgressRule(cidr="169.254.1.7/24", port=443),
            EgressRule(cidr="::/0"),
            EgressRule(host="pypi.org", port=65535),
            EgressRule(host="localhost."),
        )
    )


@pytest.mark.parametrize(
    ("rule", "fragment"),
    [
        (EgressRule(), "exactly one"),
        (EgressRule(cidr="169.254.0.0/16", host="x.org"), "exactly one"),
        (EgressRule(cidr="169.254.0.0/33"), "cidr"),
        (EgressRule(host="under_score.org"), "host"),
        (EgressRule(host="a" * 64 + ".org"), "host"),
        (EgressRule(cidr="169.254.0.1", port=70000), "port"),
        (EgressRule(host="x.org", port=-1), "port"),
    ],
)
def test_invalid_rules(rule: EgressRule, fragment: str) -> None:
    """Each malformed rule is an invalid argument naming the rule and what is wrong with it."""
    with pytest.raises(InvalidArgument) as info:
        check_egress((EgressRule(cidr="169.254.0.1"), rule))
    assert fragment in info.value.message and "rule 1" in info.value.message
    assert info.value.field == "network_policy"


def test_rule_count_is_bounded() -> None:
    """More than MAX_EGRESS_RULES rules is an invalid argument."""
    with pytest.raises(InvalidArgument, match="at most"):
        check_egress(tuple(EgressRule(cidr="169.254.0.1") for _ in range(MAX_EGRESS_RULES + 1)))


def test_pool_skips_reserved_ranges() -> None:
    """Slots are /30s of 169.254.0.0/16 outside the RFC 3927 reserved /24s and the metadata service's /24."""
    assert len(SLOTS) == 253 * 64
    link = Link("n", SLOTS[0])
    assert (link.host_addr, link.sandbox_addr) == ("169.254.1.1", "169.254.1.2")
    for slot in SLOTS:
        network = ipaddress.IPv4Network((int(POOL[4 * slot]), 30))
        assert not any(network.overlaps(r) for r in RESERVED)


def test_inner_ruleset_replaces_the_table_in_one_transaction() -> None:
    """The sandbox's rules: drop by default, lo, answers, one accept per rule, then a fast reject."""
    rules = inner_ruleset([Allowed("ip", "169.254.0.2/32", 8080), Allowed("ip", "{ 127.0.0.1 }", 0)])
    assert rules.splitlines()[:3] == ["table inet orchard", "flush table inet orchard", "table inet orchard {"]
    assert [line.strip() for line in rules.splitlines()[4:10]] == [
        "type filter hook output priority filter; policy drop;",
        'oif "lo" accept',
        "ct direction reply accept",
        "ip daddr 169.254.0.2/32 meta l4proto { tcp, udp } th dport 8080 accept",
        "ip daddr { 127.0.0.1 } accept",
        "reject with icmpx type admin-prohibited",
    ]


def test_host_ruleset_only_matches_the_sandbox_veth() -> None:
    """Every rule of the host's table names the sandbox's veth, and no chain drops by policy."""
    rules = host_ruleset(Link("orchard-t-sb-1", 64), [Allowed("ip", "169.254.0.2/32", 0)])
    lines = [line.strip() for line in rules.splitlines()]
    assert all("policy accept" in line for line in lines if line.startswith("type "))
    chain_rules = [line for line in lines if line and not line.startswith(("table", "flush", "chain", "type", "}"))]
    assert chain_rules and all('"orchard-64"' in line for line in chain_rules)
    assert 'iifname "orchard-64" ip daddr 169.254.0.2/32 accept' in chain_rules
    assert 'iifname "orchard-64" oifname != "orchard-64" masquerade' in chain_rules
