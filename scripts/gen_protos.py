"""Generate the Python stubs for every proto under protos/ into libs/ (one command: `python scripts/gen_protos.py`).

The stubs are committed; tests/unit/test_protos.py fails when they are stale.
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import tempfile

import grpc_tools
from grpc_tools import protoc

ROOT = pathlib.Path(__file__).resolve().parent.parent
PROTOS = ROOT / "protos"
OUT = ROOT / "libs"


def proto_files() -> list[pathlib.Path]:
    return sorted(PROTOS.rglob("*.proto"))


def generate(out: pathlib.Path) -> None:
    """Run grpcio-tools' protoc over all protos, writing _pb2, _pb2_grpc and .pyi files under out."""
    include = pathlib.Path(grpc_tools.__file__).parent / "_proto"
    files = [str(p.relative_to(PROTOS)) for p in proto_files()]
    rc = protoc.main(
        [
            "protoc",
            f"-I{PROTOS}",
            f"-I{include}",
            f"--python_out={out}",
            f"--pyi_out={out}",
            f"--grpc_python_out={out}",
            *files,
        ]
    )
    if rc != 0:
        raise SystemExit(f"protoc failed with exit code {rc}")
    # Every generated folder is a regular package so setuptools and mypy find it.
    for proto in proto_files():
        pkg = out / proto.relative_to(PROTOS).parent
        while pkg != out:
            (pkg / "__init__.py").touch()
            pkg = pkg.parent


def generated_paths(root: pathlib.Path) -> dict[str, bytes]:
    """Map each generated file (relative to root) to its content."""
    found: dict[str, bytes] = {}
    for proto in proto_files():
        rel_dir = proto.relative_to(PROTOS).parent
        stem = proto.stem
        for suffix in ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py"):
            rel = rel_dir / f"{stem}{suffix}"
            path = root / rel
            found[str(rel)] = path.read_bytes() if path.exists() else b""
    return found


def check() -> list[str]:
    """Return the generated files that differ from a fresh generation."""
    with tempfile.TemporaryDirectory() as tmp:
        fresh = pathlib.Path(tmp)
        generate(fresh)
        want = generated_paths(fresh)
    have = generated_paths(OUT)
    return sorted(rel for rel, content in want.items() if have.get(rel) != content)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="exit 1 if the committed stubs are stale")
    args = parser.parse_args()
    if args.check:
        stale = check()
        if stale:
            print("stale generated stubs (run `python scripts/gen_protos.py`):", *stale, sep="\n  ")
            sys.exit(1)
        print("generated stubs are up to date")
        return
    generate(OUT)
    print(f"generated stubs for {len(proto_files())} proto files into {OUT.relative_to(ROOT)}/")


if __name__ == "__main__":
    main()
