"""The layers point one way (read by the import statements, not by running anything): libs/ never imports
services/ or trainers/ (the CLI starts services and their tools through entry points named by strings); no service
imports another; only the trainer service imports the recipes in trainers/; trainers/ imports libs/ only."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCES = {"libs/orchard": "orchard", "services": "orchard.services", "trainers": "orchard.trainers"}


def module_of(path: Path) -> str:
    for folder, package in SOURCES.items():
        base = ROOT / folder
        if path.is_relative_to(base):
            parts = list(path.relative_to(base).with_suffix("").parts)
            if parts and parts[-1] == "__init__":
                parts = parts[:-1]
            return ".".join([package, *parts])
    raise ValueError(f"{path} is not in a source folder")


def imports_of(path: Path) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
    return [(line, name) for line, name in found if name == "orchard" or name.startswith("orchard.")]


def forbidden(importer: str, imported: str) -> str | None:
    """Why `importer` may not import `imported`, or None when it may."""

    def service(module: str) -> str | None:
        parts = module.split(".")
        return parts[2] if len(parts) > 2 and parts[1] == "services" else None

    into_services = imported.startswith("orchard.services")
    into_trainers = imported.startswith("orchard.trainers")
    if importer.startswith("orchard.trainers"):
        return "trainers/ imports libs/ only" if into_services else None
    if importer.startswith("orchard.services"):
        mine = service(importer)
        if into_services and service(imported) not in (None, mine):
            return "a service never imports another service (they talk over gRPC through orchard.clients)"
        if into_trainers and mine != "trainer":
            return "only the trainer service runs the recipes of trainers/"
        return None
    if into_services or into_trainers:
        return "libs/ never imports services/ or trainers/ (start them through their entry points)"
    return None


def violations(paths: list[Path]) -> list[str]:
    out = []
    for path in paths:
        importer = module_of(path)
        for line, imported in imports_of(path):
            if (why := forbidden(importer, imported)) is not None:
                out.append(f"{path.relative_to(ROOT)}:{line}: {importer} imports {imported}: {why}")
    return out


def source_files() -> list[Path]:
    return [
        p
        for folder in SOURCES
        for p in (ROOT / folder).rglob("*.py")
        if not p.name.endswith(("_pb2.py", "_pb2_grpc.py")) and "/repos/" not in p.as_posix()
    ]


def test_the_layers_point_one_way() -> None:
    assert violations(source_files()) == []


def test_a_forbidden_import_is_found() -> None:
    """The check itself: a module of libs/ importing a service, and a service importing another, are caught."""
    bad_lib = ROOT / "libs" / "orchard" / "_layer_probe.py"
    bad_service = ROOT / "services" / "value" / "_layer_probe.py"
    try:
        bad_lib.write_text("from orchard.services.env import images\n")
        bad_service.write_text("import orchard.services.reward.judge\nfrom orchard.chat import render\n")
        found = violations([bad_lib, bad_service])
    finally:
        bad_lib.unlink(missing_ok=True)
        bad_service.unlink(missing_ok=True)
    assert len(found) == 2 and "libs/ never imports" in found[0] and "another service" in found[1]
    assert forbidden("orchard.services.trainer.jobs", "orchard.trainers.job") is None
    assert forbidden("orchard.trainers.data", "orchard.services.inference.servicer") is not None


CHANNEL_MAKERS = {"insecure_channel", "secure_channel"}
PROBES = {"libs/orchard/runtime/healthcheck.py", "libs/orchard/cli/stack.py"}
"""The gRPC health probes (a container's HEALTHCHECK, `orchard up` waiting for its children) ask the standard
health service of any server, not an Orchard API: they open their own channel."""


def test_every_client_goes_through_the_one_transport() -> None:
    """No module opens a gRPC channel of its own but the transport (orchard.sdk.transport, which orchard.clients
    builds on) and the health probes."""
    opened = []
    for path in source_files():
        rel = path.relative_to(ROOT).as_posix()
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Attribute)
                and node.attr in CHANNEL_MAKERS
                and rel not in PROBES
                and rel != "libs/orchard/sdk/transport.py"
            ):
                opened.append(f"{rel}:{node.lineno}")
    assert opened == []


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every cycle of a module graph, each once, as the path that closes it (depth-first search)."""
    cycles: list[list[str]] = []
    seen: set[frozenset[str]] = set()

    def walk(node: str, path: list[str]) -> None:
        for nxt in sorted(graph.get(node, ())):
            if nxt in path:
                cycle = path[path.index(nxt) :]
                if frozenset(cycle) not in seen:
                    seen.add(frozenset(cycle))
                    cycles.append([*cycle, nxt])
            elif len(path) < len(graph):
                walk(nxt, [*path, nxt])

    for start in sorted(graph):
        walk(start, [start])
    return cycles


def cli_graph() -> dict[str, set[str]]:
    """Which modules of the CLI import which others, counting imports inside functions (most of the CLI's)."""
    graph: dict[str, set[str]] = {}
    for path in (ROOT / "libs" / "orchard" / "cli").glob("*.py"):
        me = module_of(path)
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                if node.module == "orchard.cli":
                    names |= {f"orchard.cli.{a.name}" for a in node.names}
                elif node.module.startswith("orchard.cli."):
                    names.add(node.module)
            elif isinstance(node, ast.Import):
                names |= {a.name for a in node.names if a.name.startswith("orchard.cli.")}
        graph[me] = {n for n in names if n != me and n != "orchard.cli"}
    return graph


def test_the_cli_modules_import_no_circle() -> None:
    """One rollout path and one report path: no two CLI commands' modules lean on each other."""
    assert import_cycles(cli_graph()) == []
    assert import_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
