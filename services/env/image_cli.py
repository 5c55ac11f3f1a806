"""`orchard image`: build, import and list the local backend's sandbox images (an entry point of the env service,
which the CLI starts as `orchard serve` starts services)."""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from orchard.errors import FailedPrecondition, InvalidArgument, OrchardError
from orchard.services.env.images import BuildProgressView, ImageStore, Recipe, default_images_dir


def parser() -> argparse.ArgumentParser:
    image = argparse.ArgumentParser(prog="orchard image", description="build, import and list local sandbox images")
    image.add_argument(
        "--images-dir", default=None, help="default: ORCHARD_ENV_IMAGES_DIR's default, ~/.cache/orchard/images"
    )
    isub = image.add_subparsers(dest="action", required=True)
    p = isub.add_parser("build", help="build an image from Debian packages (cached)")
    p.add_argument("name")
    p.add_argument("--force", action="store_true", help="rebuild even if built")
    p.add_argument(
        "--recipe",
        default=None,
        metavar="FILE",
        help="a new image's recipe: a JSON file with suite "
        "(bullseye, bookworm, trixie), packages (Debian; git required, python3-pip with pip), optionally pip and "
        "description; kept with the images, so later builds need only the name",
    )
    p.set_defaults(func=build)
    p = isub.add_parser("ls", help="list images")
    p.set_defaults(func=ls)
    p = isub.add_parser(
        "import",
        help="make a sandbox image of a container image archive (docker/podman save, or "
        "an OCI layout tar), or of an image in the local podman store (--from-podman REF)",
    )
    p.add_argument("name", help="the sandbox image name to give it")
    p.add_argument("archive", nargs="?", default=None, help="the archive file")
    p.add_argument(
        "--from-podman",
        default=None,
        metavar="REF",
        help="save this image of the local podman store first (e.g. localhost/myrepo:latest)",
    )
    p.set_defaults(func=import_)
    return image


def _images(args: argparse.Namespace) -> ImageStore:
    return ImageStore(Path(args.images_dir) if args.images_dir else default_images_dir())


def build(args: argparse.Namespace) -> int:
    store = _images(args)
    if args.recipe:
        try:
            data = json.loads(Path(args.recipe).read_text())
            recipe = Recipe(
                suite=data["suite"],
                variant=data.get("variant", "minbase"),
                packages=tuple(data["packages"]),
                pip=tuple(data.get("pip", ())),
                description=data.get("description", f"{args.name} ({data['suite']})"),
            )
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise InvalidArgument(f"{args.recipe} is not an image recipe (suite, packages ...): {err}") from None
        store.add_recipe(args.name, recipe)
    image = asyncio.run(store.build(args.name, force=args.force, progress=BuildProgressView()))
    print(f"built {image.name}: {image.size_bytes / 2**20:.0f} MiB at {image.rootfs}", file=sys.stderr)
    return 0


def import_(args: argparse.Namespace) -> int:
    if bool(args.archive) == bool(args.from_podman):
        raise InvalidArgument("give the archive, or --from-podman REF (not both)")
    with tempfile.TemporaryDirectory() as tmp:
        archive = Path(args.archive) if args.archive else Path(tmp) / "image.tar"
        if args.from_podman:
            saved = subprocess.run(
                ["podman", "image", "save", "--format", "docker-archive", "-o", str(archive), args.from_podman],
                capture_output=True,
                text=True,
                check=False,
            )
            if saved.returncode != 0:
                raise FailedPrecondition(f"podman image save {args.from_podman} failed: {saved.stderr.strip()}")
        image = asyncio.run(_images(args).import_archive(args.name, archive, progress=BuildProgressView()))
    print(f"imported {image.name}: {image.size_bytes / 2**20:.0f} MiB at {image.rootfs}", file=sys.stderr)
    return 0


def ls(args: argparse.Namespace) -> int:
    store = _images(args)
    built = {image.name: image for image in store.list()}
    print(f"{'IMAGE':<20} {'STATUS':<10} {'SIZE':>8}  DESCRIPTION")
    for name in ["host", *sorted(set(store.list_recipes()) | set(built) - {"host"})]:
        image = built.get(name)
        status = "built" if image else "not built"
        size = f"{image.size_bytes / 2**20:.0f} MiB" if image and image.size_bytes else "-"
        description = image.description if image else store.list_recipes()[name].description
        print(f"{name:<20} {status:<10} {size:>8}  {description}")
    return 0


def main(argv: Sequence[str] | None = None) -> None:
    args = parser().parse_args(argv)
    try:
        code = args.func(args)
    except OrchardError as err:
        print(f"orchard: {err.message}", file=sys.stderr)
        code = 1
    except KeyboardInterrupt:
        code = 130
    sys.exit(code)


if __name__ == "__main__":
    main()
