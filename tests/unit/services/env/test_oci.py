"""Unpacking image archives: layers in order with their whiteouts, and nothing a layer holds reaching outside
the root (absolute names, `..`, symlinks a lower layer planted)."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest

from orchard.errors import InvalidArgument
from orchard.services.env.oci import unpack


def layer(*members: tuple[str, str, str]) -> bytes:
    """A layer tar of (kind, name, content or link target) members: kind file, dir or symlink."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for kind, name, value in members:
            info = tarfile.TarInfo(name)
            if kind == "dir":
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(info)
            elif kind == "symlink":
                info.type, info.linkname = tarfile.SYMTYPE, value
                tar.addfile(info)
            else:
                data = value.encode()
                info.size, info.mode = len(data), 0o644
                tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def docker_archive(path: Path, layers: list[bytes]) -> Path:
    with tarfile.open(path, "w") as tar:

        def add(name: str, data: bytes) -> None:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))

        names = []
        for i, data in enumerate(layers):
            names.append(f"l{i}/layer.tar")
            add(names[-1], data)
        add("config.json", json.dumps({"config": {"Env": ["PATH=/usr/bin"], "WorkingDir": "/testbed"}}).encode())
        add("manifest.json", json.dumps([{"Config": "config.json", "Layers": names}]).encode())
    return path


def test_layers_apply_in_order_with_whiteouts(tmp_path: Path) -> None:
    archive = docker_archive(
        tmp_path / "a.tar",
        [
            layer(
                ("dir", "etc", ""),
                ("file", "etc/a", "1"),
                ("file", "etc/b", "2"),
                ("dir", "data", ""),
                ("file", "data/x", "x"),
                ("symlink", "bin", "usr/bin"),
            ),
            layer(
                ("file", "etc/.wh.a", ""),
                ("file", "etc/b", "two"),
                ("file", "data/.wh..wh..opq", ""),
                ("file", "data/y", "y"),
            ),
        ],
    )
    root = tmp_path / "root"
    root.mkdir()
    config = unpack(archive, root)
    assert not (root / "etc/a").exists() and (root / "etc/b").read_text() == "two"
    assert sorted(p.name for p in (root / "data").iterdir()) == ["y"]
    assert (root / "bin").is_symlink() and config["WorkingDir"] == "/testbed"


@pytest.mark.parametrize(
    "members",
    [
        [("file", "/etc/evil", "x")],
        [("file", "../evil", "x")],
    ],
)
def test_names_outside_the_root_are_refused(tmp_path: Path, members: list[tuple[str, str, str]]) -> None:
    root = tmp_path / "root"
    root.mkdir()
    with pytest.raises(InvalidArgument, match="outside its root"):
        unpack(docker_archive(tmp_path / "a.tar", [layer(*members)]), root)


def test_a_planted_symlink_cannot_carry_a_later_file_out(tmp_path: Path) -> None:
    """Layer one links `etc` to an absolute path outside (and `up` to ../..); layer two writes through them: the
    files land inside the root, where those links point from the image's point of view."""
    outside = tmp_path / "outside"
    outside.mkdir()
    archive = docker_archive(
        tmp_path / "a.tar",
        [
            layer(("symlink", "etc", str(outside)), ("dir", "deep", ""), ("symlink", "deep/up", "../../..")),
            layer(("file", "etc/evil", "x"), ("file", "deep/up/evil2", "y")),
        ],
    )
    root = tmp_path / "root"
    root.mkdir()
    unpack(archive, root)
    assert list(outside.iterdir()) == [] and not (tmp_path / "evil2").exists()
    assert (root / outside.relative_to("/") / "evil").read_text() == "x" and (root / "evil2").read_text() == "y"
