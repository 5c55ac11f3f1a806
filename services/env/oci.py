"""Unpacking a container image archive into a root filesystem: `docker save` / `podman save` archives (a
manifest.json naming layer tars) and OCI image layouts (index.json, blobs/sha256/...), tar or gzip layers, with
the whiteouts of each layer applied to the ones below (`.wh.NAME` deletes NAME, `.wh..wh..opq` empties a folder).

Nothing in a layer may reach outside the root: absolute names, `..`, and links whose target lies outside are
refused with InvalidArgument (an image is input like any other).

Unpacked by an ordinary user (a rootless env service's images), every file becomes that user's (root inside its
sandboxes), device nodes are left out (sandboxes get their /dev from bubblewrap), and folders stay writable to
their owner until the last layer is in, then take their own modes."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import stat
import tarfile
from pathlib import Path, PurePosixPath
from typing import IO

from orchard.errors import InvalidArgument
from orchard.services.env.backends.rootless import rootless

WHITEOUT = ".wh."
OPAQUE = ".wh..wh..opq"


def layers_of(archive: tarfile.TarFile) -> list[str]:
    """The member names of the image's layers, bottom first."""
    names = set(archive.getnames())
    if "manifest.json" in names:  # docker save
        manifest = json.load(_member(archive, "manifest.json"))
        if not manifest or "Layers" not in manifest[0]:
            raise InvalidArgument("manifest.json of the archive names no layers")
        return list(manifest[0]["Layers"])
    if "index.json" in names:  # OCI layout
        index = json.load(_member(archive, "index.json"))
        manifest = json.load(_member(archive, _blob(index["manifests"][0]["digest"])))
        if "layers" not in manifest:  # an index of indexes (multi-platform): take the first platform
            manifest = json.load(_member(archive, _blob(manifest["manifests"][0]["digest"])))
        return [_blob(layer["digest"]) for layer in manifest["layers"]]
    raise InvalidArgument(
        "not a container image archive: it has neither manifest.json (docker/podman save) nor "
        "index.json (an OCI layout)"
    )


def image_config(archive: tarfile.TarFile) -> dict[str, object]:
    """The image's config (Env, WorkingDir, Cmd ...), {} when the archive has none."""
    names = set(archive.getnames())
    if "manifest.json" in names:
        manifest = json.load(_member(archive, "manifest.json"))
        data = json.load(_member(archive, manifest[0]["Config"]))
    elif "index.json" in names:
        index = json.load(_member(archive, "index.json"))
        manifest = json.load(_member(archive, _blob(index["manifests"][0]["digest"])))
        if "config" not in manifest:
            manifest = json.load(_member(archive, _blob(manifest["manifests"][0]["digest"])))
        data = json.load(_member(archive, _blob(manifest["config"]["digest"])))
    else:
        return {}
    config = data.get("config") or data.get("Config") or {}
    return config if isinstance(config, dict) else {}


def unpack(archive_path: Path, rootfs: Path) -> dict[str, object]:
    """Unpack the image's layers into rootfs (which must exist, empty); returns the image's config."""
    try:
        archive = tarfile.open(archive_path)
    except (tarfile.TarError, OSError) as err:
        raise InvalidArgument(f"{archive_path} is not a tar archive of an image: {err}") from None
    folder_modes: dict[Path, int] = {}  # rootless: the modes folders get once every layer is in
    with archive:
        for name in layers_of(archive):
            with _opened(_member(archive, name)) as layer:
                _apply(layer, rootfs, folder_modes)
        config = image_config(archive)
    for folder, mode in sorted(folder_modes.items(), key=lambda item: len(item[0].parts), reverse=True):
        if folder.is_dir() and not folder.is_symlink():
            os.chmod(folder, mode)
    return config


def _blob(digest: str) -> str:
    algorithm, _, hex_ = digest.partition(":")
    return f"blobs/{algorithm}/{hex_}"


def _member(archive: tarfile.TarFile, name: str) -> IO[bytes]:
    try:
        f = archive.extractfile(name)
    except KeyError:
        f = None
    if f is None:
        raise InvalidArgument(f"the image archive lacks {name}")
    return f


def _opened(raw: IO[bytes]) -> tarfile.TarFile:
    head = raw.read(2)
    raw.seek(0)
    stream: IO[bytes] = gzip.GzipFile(fileobj=raw) if head == b"\x1f\x8b" else raw  # type: ignore[assignment]
    return tarfile.open(fileobj=stream, mode="r|")


def _inside(root: Path, name: str) -> Path:
    """Where member `name` goes: its folders resolved as inside a chroot (an absolute or `..` symlink a lower
    layer made is followed from the root, never out of it), its last part not followed."""
    path = PurePosixPath(name[2:] if name.startswith("./") else name)
    if path.is_absolute() or ".." in path.parts:
        raise InvalidArgument(f"an image layer holds {name!r}, a path outside its root")
    parts = [p for p in path.parts if p not in ("", ".")]
    if not parts:
        return root
    return _resolve(root, parts[:-1]) / parts[-1]


def _resolve(root: Path, parts: list[str], depth: int = 0) -> Path:
    if depth > 40:
        raise InvalidArgument("an image layer holds a symlink loop")
    current: list[str] = []
    for part in parts:
        candidate = root.joinpath(*current, part)
        if candidate.is_symlink():
            link = PurePosixPath(os.readlink(candidate))
            base = [] if link.is_absolute() else list(current)
            for piece in link.parts:
                if piece in ("/", "", "."):
                    continue
                if piece == "..":
                    base = base[:-1]  # never above the root
                else:
                    base.append(piece)
            resolved = _resolve(root, base, depth + 1)
            current = list(resolved.relative_to(root).parts)
        else:
            current.append(part)
    return root.joinpath(*current)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


def _apply(layer: tarfile.TarFile, root: Path, folder_modes: dict[Path, int]) -> None:
    """One layer over what the layers below left: its whiteouts first take effect, then its files."""
    as_root = not rootless()
    for member in layer:
        target = _inside(root, member.name)
        base = target.name
        if base == OPAQUE:
            for child in list(target.parent.iterdir()) if target.parent.is_dir() else []:
                _remove(child)
            continue
        if base.startswith(WHITEOUT):
            _remove(target.with_name(base[len(WHITEOUT) :]))
            continue
        if target.exists() or target.is_symlink():
            if not (member.isdir() and target.is_dir() and not target.is_symlink()):
                _remove(target)
        target.parent.mkdir(parents=True, exist_ok=True)
        if member.isdir():
            target.mkdir(exist_ok=True)
        elif member.issym():
            os.symlink(member.linkname, target)
        elif member.islnk():
            source = _inside(root, member.linkname)  # a hard link's target is a path in the image too
            os.link(source, target, follow_symlinks=False)
        elif member.isfile():
            with layer.extractfile(member) as src, open(target, "wb") as dst:  # type: ignore[union-attr]
                shutil.copyfileobj(src, dst)
        elif (member.ischr() or member.isblk()) and not as_root:
            continue  # only root may make device nodes
        elif member.ischr() or member.isblk():
            kind = stat.S_IFCHR if member.ischr() else stat.S_IFBLK
            os.mknod(target, kind | member.mode, os.makedev(member.devmajor, member.devminor))
        elif member.isfifo():
            os.mkfifo(target, member.mode)
        else:
            continue
        if as_root:
            os.chown(target, member.uid, member.gid, follow_symlinks=False)
        if member.isdir() and not as_root:
            folder_modes[target] = member.mode
            os.chmod(target, member.mode | stat.S_IRWXU)
        elif not member.issym():
            os.chmod(target, member.mode)
        if not member.issym():
            os.utime(target, (member.mtime, member.mtime))
