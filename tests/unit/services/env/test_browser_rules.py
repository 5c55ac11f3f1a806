"""The pure parts of browser sandboxes: egress admission, action checks, PNG sizes, and the SDK's allow items."""

from __future__ import annotations

import struct
import zlib
from typing import Any

import pytest

from orchard.env.v1 import env_pb2 as pb
from orchard.errors import InvalidArgument
from orchard.sdk.aio import egress_rule
from orchard.services.env.backends.base import EgressRule
from orchard.services.env.browser_actions import (
    Action,
    ActionKind,
    check_action,
    png_size,
)
from orchard.services.env.browser_policy import (
    Target,
    admits,
    admitted_addresses,
    authority_target,
    needs_addresses,
    url_target,
)

pytestmark = pytest.mark.timeout(10)

RULES = (
    EgressRule(host="example.com"),
    EgressRule(host="api.test", port=8443),
    EgressRule(cidr="10.0.0.0/8", port=443),
    EgressRule(cidr="127.0.0.1", port=8080),
    EgressRule(cidr="fd00::/8"),
)


@pytest.mark.parametrize(
    ("url", "target"),
    [
        ("http://Example.COM/x?y", Target("example.com", 80)),
        ("https://example.com./", Target("example.com", 443)),
        ("http://127.0.0.1:8080/", Target("127.0.0.1", 8080)),
        ("wss://[fd00::1]/socket", Target("fd00::1", 443)),
        ("about:blank", None),
        ("data:text/html,<p>x</p>", None),
        ("blob:http://example.com/uuid", None),
    ],
)
def test_url_target(url: str, target: Target | None) -> None:
    assert url_target(url) == target


@pytest.mark.parametrize(
    "url",
    [
        "file:///etc/passwd",
        "ftp://example.com/",
        "http:///nohost",
        "http://x:99999/",
        "chrome://crash",
        "javascript:alert(1)",
    ],
)
def test_url_target_rejects(url: str) -> None:
    with pytest.raises(ValueError):
        url_target(url)


def test_authority_target() -> None:
    assert authority_target("Example.com:443") == Target("example.com", 443)
    assert authority_target("[::1]:8080") == Target("::1", 8080)
    assert str(Target("::1", 8080)) == "[::1]:8080"
    for bad in ("example.com", ":443", "host:0", "host:http"):
        with pytest.raises(ValueError):
            authority_target(bad)


@pytest.mark.parametrize(
    ("target", "addresses", "admitted"),
    [
        (Target("example.com", 80), (), True),  # a host rule with port 0: any port
        (Target("example.com", 8443), (), True),
        (Target("www.example.com", 80), (), False),  # names match exactly, no subdomains
        (Target("api.test", 8443), (), True),
        (Target("api.test", 443), (), False),  # wrong port
        (Target("10.1.2.3", 443), (), True),  # a literal IP inside a CIDR
        (Target("10.1.2.3", 80), (), False),
        (Target("11.0.0.1", 443), (), False),
        (Target("127.0.0.1", 8080), (), True),  # a single address is a one-address CIDR
        (Target("127.0.0.1", 8081), (), False),
        (Target("fd00::5", 1234), (), True),
        (Target("internal.corp", 443), ("10.9.9.9",), True),  # a name, by what it resolved to
        (Target("internal.corp", 443), ("192.168.1.1",), False),
        (Target("10.1.2.3", 443), ("8.8.8.8",), True),  # addresses don't matter for a literal
        (Target("8.8.8.8", 443), ("10.1.1.1",), False),
    ],
)
def test_admits(target: Target, addresses: tuple[str, ...], admitted: bool) -> None:
    assert admits(RULES, target, addresses) is admitted


def test_no_rules_admit_nothing() -> None:
    assert not admits((), Target("127.0.0.1", 80))
    assert not needs_addresses((), Target("example.com", 80))


def test_resolution_only_when_a_cidr_rule_could_decide() -> None:
    assert needs_addresses(RULES, Target("internal.corp", 443))
    assert needs_addresses(RULES, Target("internal.corp", 80))  # fd00::/8 covers every port
    assert not needs_addresses(RULES[:4], Target("internal.corp", 80))  # no CIDR rule covers port 80
    assert not needs_addresses(RULES, Target("example.com", 443))  # a host rule admits it already
    assert not needs_addresses(RULES, Target("10.0.0.1", 80))  # a literal needs no lookup
    assert admitted_addresses(RULES, Target("internal.corp", 443), ["192.168.1.1", "10.2.3.4"]) == ["10.2.3.4"]


def action(kind: ActionKind | None, **fields: Any) -> Action:
    return check_action(Action(kind, **fields), default_timeout_s=10.0, max_timeout_s=60.0)


@pytest.mark.parametrize(
    ("kind", "fields", "field"),
    [
        (None, {}, "action"),
        (ActionKind.CLICK, {}, "selector"),
        (ActionKind.DOUBLE_CLICK, {"x": 0.0, "y": 0.0}, "selector"),
        (ActionKind.CLICK, {"x": float("nan"), "y": 3.0}, "x"),
        (ActionKind.CLICK, {"x": 5.0, "y": -1.0}, "y"),
        (ActionKind.TYPE, {"selector": "#a"}, "text"),
        (ActionKind.KEY_PRESS, {}, "key"),
        (ActionKind.SCROLL, {}, "delta_y"),
        (ActionKind.SCROLL, {"delta_y": float("inf")}, "delta_y"),
        (ActionKind.NAVIGATE, {}, "url"),
        (ActionKind.NAVIGATE, {"url": "file:///etc/passwd"}, "url"),
        (ActionKind.NAVIGATE, {"url": "chrome://settings"}, "url"),
        (ActionKind.NAVIGATE, {"url": "http://"}, "url"),
        (ActionKind.WAIT, {}, "selector"),
        (ActionKind.TYPE, {"text": "a\x00b"}, "text"),
    ],
)
def test_bad_actions_name_their_field(kind: ActionKind | None, fields: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidArgument) as info:
        action(kind, **fields)
    assert info.value.field == field


@pytest.mark.parametrize(
    ("kind", "fields"),
    [
        (ActionKind.CLICK, {"selector": "#go"}),
        (ActionKind.CLICK, {"x": 0.0, "y": 5.0}),
        (ActionKind.TYPE, {"text": "hello"}),
        (ActionKind.KEY_PRESS, {"key": "Control+A"}),
        (ActionKind.SCROLL, {"delta_x": -40.0}),
        (ActionKind.NAVIGATE, {"url": "https://example.com/"}),
        (ActionKind.NAVIGATE, {"url": "about:blank"}),
        (ActionKind.NAVIGATE, {"url": "data:text/html,hi"}),
        (ActionKind.BACK, {}),
        (ActionKind.WAIT, {"timeout_s": 0.5}),
        (ActionKind.WAIT, {"selector": "#late"}),
    ],
)
def test_good_actions_pass(kind: ActionKind, fields: dict[str, Any]) -> None:
    assert action(kind, **fields).kind is kind


def test_timeouts_default_and_cap() -> None:
    assert action(ActionKind.BACK).timeout_s == 10.0
    assert action(ActionKind.BACK, timeout_s=2.5).timeout_s == 2.5
    assert action(ActionKind.BACK, timeout_s=3600.0).timeout_s == 60.0


def test_describe() -> None:
    assert Action(ActionKind.CLICK, selector="#nope").describe() == "click on selector '#nope'"
    assert Action(ActionKind.DOUBLE_CLICK, x=3, y=4.5).describe() == "double_click at (3, 4.5)"


def test_png_size() -> None:
    ihdr = struct.pack(">IIBBBBB", 1024, 3000, 8, 6, 0, 0, 0)
    png = b"\x89PNG\r\n\x1a\n" + struct.pack(">I", 13) + b"IHDR" + ihdr + struct.pack(">I", zlib.crc32(b"IHDR" + ihdr))
    assert png_size(png) == (1024, 3000)
    for bad in (b"", b"GIF89a" + bytes(30), png[:20]):
        with pytest.raises(ValueError):
            png_size(bad)


@pytest.mark.parametrize(
    ("item", "rule"),
    [
        ("example.com", pb.EgressRule(host="example.com")),
        ("example.com:8080", pb.EgressRule(host="example.com", port=8080)),
        ("127.0.0.1:8080", pb.EgressRule(cidr="127.0.0.1", port=8080)),
        ("127.0.0.1", pb.EgressRule(cidr="127.0.0.1")),
        ("10.0.0.0/8:443", pb.EgressRule(cidr="10.0.0.0/8", port=443)),
        ("10.0.0.0/8", pb.EgressRule(cidr="10.0.0.0/8")),
        ("::1", pb.EgressRule(cidr="::1")),
        ("[::1]:9000", pb.EgressRule(cidr="::1", port=9000)),
        ("fd00::/8:443", pb.EgressRule(cidr="fd00::/8", port=443)),
    ],
)
def test_sdk_allow_items(item: str, rule: pb.EgressRule) -> None:
    assert egress_rule(item) == rule


@pytest.mark.parametrize(
    "item", ["", ":80", "example.com:0", "example.com:http", "10.0.0.0/99", "[::1]x", "host:70000"]
)
def test_sdk_rejects_bad_allow_items(item: str) -> None:
    with pytest.raises(ValueError):
        egress_rule(item)
