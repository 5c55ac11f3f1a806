"""File RPCs cannot reach outside a sandbox: `..` and symlinks resolve inside the sandbox's own mount namespace
(on a built image, whose root is not the host's)."""

from __future__ import annotations

import uuid
from pathlib import Path

import grpc
import pytest
from env_helpers import create, delete_quietly, needs_sandboxes, run

from orchard.env.v1 import env_pb2 as pb
from orchard.services.env.images import ImageStore, default_images_dir

pytestmark = [needs_sandboxes, pytest.mark.timeout(60)]
IMAGE = "python:3.11-slim"


@pytest.fixture
async def sandbox(stub):  # type: ignore[no-untyped-def]
    """A sandbox on the built image (the host image *is* the host's root, so it proves nothing here)."""
    try:
        ImageStore(default_images_dir()).resolve(IMAGE)
    except Exception:
        pytest.skip(f"image {IMAGE} is not built here; run `orchard image build {IMAGE}` (scripts/install.sh does)")
    sb = await create(stub, image=IMAGE)
    yield sb
    await delete_quietly(stub, sb.sandbox_id)


async def _download(stub, sandbox_id: str, path: str) -> bytes:  # type: ignore[no-untyped-def]
    parts = [m async for m in stub.DownloadFile(pb.DownloadFileRequest(sandbox_id=sandbox_id, path=path), timeout=10)]
    return b"".join(m.chunk for m in parts[1:])


async def test_symlinks_and_dotdot_stay_inside(stub, sandbox: pb.Sandbox) -> None:  # type: ignore[no-untyped-def]
    """Through a symlink to / or /etc, or a path full of `..`, the file RPCs see the sandbox's files, never the
    host's; writes land in the sandbox's layer."""
    sid = sandbox.sandbox_id
    await run(stub, sid, "ln -s / /workspace/root_link && ln -s /etc /workspace/etc_link")
    assert await _download(stub, sid, "etc_link/hostname") == b"sandbox\n"  # the image's, the host's is not
    assert await _download(stub, sid, "../../../../../etc/hostname") == b"sandbox\n"
    listed = await stub.ListFiles(pb.ListFilesRequest(sandbox_id=sid, path="root_link/"), timeout=10)
    names = {f.name for f in listed.files}
    assert "workspace" in names and "work" not in names  # the host has /work; the sandbox does not
    marker = f"orchard-escape-{uuid.uuid4().hex[:8]}"
    for path in (f"../../../../tmp/{marker}", f"root_link/tmp/{marker}-2"):
        await stub.UploadFile(
            iter(
                [
                    pb.UploadFileRequest(header=pb.FileHeader(sandbox_id=sid, path=path)),
                    pb.UploadFileRequest(chunk=b"inside"),
                ]
            ),
            timeout=10,
        )
    assert not Path(f"/tmp/{marker}").exists() and not Path(f"/tmp/{marker}-2").exists()
    seen = await run(stub, sid, f"cat /tmp/{marker} /tmp/{marker}-2")
    assert seen.stdout == b"insideinside"
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await _download(stub, sid, "/proc/1/root/../../../../work/main/README.md")
    assert info.value.code() is grpc.StatusCode.NOT_FOUND
