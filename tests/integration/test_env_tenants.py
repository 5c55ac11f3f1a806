"""Tenants: with a tokens file each token is a tenant, who sees only its own sandboxes and commands — over gRPC
and the REST gateway; another tenant's ids are NOT_FOUND, never PERMISSION_DENIED, so they don't leak."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path

import grpc
import pytest
from env_helpers import StartEnv, duration, needs_sandboxes

from orchard.env.v1 import env_pb2 as pb

pytestmark = [needs_sandboxes, pytest.mark.timeout(60)]

ALICE, BOB = "alice-token-0001", "bob-token-00002"


def md(token: str) -> tuple[tuple[str, str]]:
    return (("authorization", f"Bearer {token}"),)


async def test_tenants_are_isolated_over_grpc(start_env: StartEnv, tmp_path: Path) -> None:
    """Bob cannot see, list, exec in, read, cancel or delete Alice's sandbox; each sees their own."""
    tokens = tmp_path / "tokens"
    tokens.write_text(f"# tenant:token\nalice:{ALICE}\nbob:{BOB}\n")
    env = await start_env(auth_tokens_file=tokens)
    stub = env.stub
    mine = (await stub.CreateSandbox(pb.CreateSandboxRequest(image="host"), metadata=md(ALICE), timeout=30)).sandbox
    assert mine.tenant == "alice"
    ex = (
        await stub.StartExec(
            pb.StartExecRequest(sandbox_id=mine.sandbox_id, shell="echo secret", wait=duration(10)),
            metadata=md(ALICE),
            timeout=30,
        )
    ).exec
    assert ex.stdout == b"secret\n"

    async def bob_gets(call: object) -> grpc.StatusCode:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await call  # type: ignore[misc]
        return info.value.code()

    sid = mine.sandbox_id
    for call in (
        stub.GetSandbox(pb.GetSandboxRequest(sandbox_id=sid), metadata=md(BOB)),
        stub.StartExec(pb.StartExecRequest(sandbox_id=sid, shell="cat /etc/hostname"), metadata=md(BOB)),
        stub.GetExec(pb.GetExecRequest(exec_id=ex.exec_id), metadata=md(BOB)),
        stub.CancelExec(pb.CancelExecRequest(exec_id=ex.exec_id), metadata=md(BOB)),
        stub.DeleteSandbox(pb.DeleteSandboxRequest(sandbox_id=sid), metadata=md(BOB)),
        stub.Heartbeat(pb.HeartbeatRequest(sandbox_id=sid), metadata=md(BOB)),
        stub.ListFiles(pb.ListFilesRequest(sandbox_id=sid), metadata=md(BOB)),
    ):
        assert await bob_gets(call) is grpc.StatusCode.NOT_FOUND
    unknown = await bob_gets(stub.GetSandbox(pb.GetSandboxRequest(sandbox_id="sb-nope"), metadata=md(BOB)))
    assert unknown is grpc.StatusCode.NOT_FOUND  # the same answer as for an id that exists
    theirs = (await stub.CreateSandbox(pb.CreateSandboxRequest(image="host"), metadata=md(BOB), timeout=30)).sandbox
    listed = {
        who: [
            sb.sandbox_id for sb in (await stub.ListSandboxes(pb.ListSandboxesRequest(), metadata=md(token))).sandboxes
        ]
        for who, token in (("alice", ALICE), ("bob", BOB))
    }
    assert listed == {"alice": [sid], "bob": [theirs.sandbox_id]}
    # The same request_id from two tenants makes two sandboxes, one each.
    a = await stub.CreateSandbox(pb.CreateSandboxRequest(image="host", request_id="r1"), metadata=md(ALICE))
    b = await stub.CreateSandbox(pb.CreateSandboxRequest(image="host", request_id="r1"), metadata=md(BOB))
    assert a.sandbox.sandbox_id != b.sandbox.sandbox_id
    await stub.DeleteSandbox(pb.DeleteSandboxRequest(sandbox_id=sid), metadata=md(ALICE))
    with pytest.raises(grpc.aio.AioRpcError) as info:  # Alice learns why hers ended; Bob would not
        await stub.GetSandbox(pb.GetSandboxRequest(sandbox_id=sid), metadata=md(ALICE))
    assert "deleted" in (info.value.details() or "")


async def test_a_chosen_id_reveals_nothing_across_tenants(start_env: StartEnv, tmp_path: Path) -> None:
    """Bob creating a sandbox with the id Alice chose gets what an unused id gets (a sandbox of his own), never
    ALREADY_EXISTS; each then sees only their own under that id; a second create by the same tenant is refused."""
    tokens = tmp_path / "tokens"
    tokens.write_text(f"alice:{ALICE}\nbob:{BOB}\n")
    stub = (await start_env(auth_tokens_file=tokens)).stub

    async def create_as(token: str, sandbox_id: str) -> pb.Sandbox:
        request = pb.CreateSandboxRequest(image="host", sandbox_id=sandbox_id, env={"OWNER": token[:5]})
        return (await stub.CreateSandbox(request, metadata=md(token), timeout=30)).sandbox

    alices = await create_as(ALICE, "shared-name")
    bobs = await create_as(BOB, "shared-name")  # as for "never-used" below: created
    fresh = await create_as(BOB, "never-used")
    assert (alices.sandbox_id, bobs.sandbox_id, fresh.sandbox_id) == ("shared-name", "shared-name", "never-used")
    assert (alices.tenant, bobs.tenant) == ("alice", "bob")
    for token, owner in ((ALICE, "alice"), (BOB, "bob-t")):
        ex = (
            await stub.StartExec(
                pb.StartExecRequest(sandbox_id="shared-name", shell="echo $OWNER", wait=duration(10)),
                metadata=md(token),
                timeout=30,
            )
        ).exec
        assert ex.stdout.decode().strip() == owner[:5]
    for token in (ALICE, BOB):
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await create_as(token, "shared-name")
        assert info.value.code() is grpc.StatusCode.ALREADY_EXISTS
    await stub.DeleteSandbox(pb.DeleteSandboxRequest(sandbox_id="shared-name"), metadata=md(BOB), timeout=30)
    still = await stub.GetSandbox(pb.GetSandboxRequest(sandbox_id="shared-name"), metadata=md(ALICE), timeout=10)
    assert still.sandbox.tenant == "alice"


def _http(port: int, method: str, path: str, key: str, body: dict[str, object] | None = None) -> tuple[int, dict]:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}",
        method=method,
        data=json.dumps(body).encode() if body is not None else None,
        headers={"X-API-Key": key, "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


async def test_tenants_over_rest(start_env: StartEnv, tmp_path: Path) -> None:
    """The REST gateway runs each request as its X-API-Key's tenant, with the same isolation."""
    import asyncio

    from orchard.services.env.rest import HttpGateway

    tokens = tmp_path / "tokens"
    tokens.write_text(f"alice:{ALICE}\nbob:{BOB}\n")
    env = await start_env(auth_tokens_file=tokens)
    gateway = HttpGateway(env.manager, env.settings.model_copy(update={"http_port": 0}))
    await gateway.start()
    try:
        port = gateway.port
        status, created = await asyncio.to_thread(_http, port, "POST", "/sandboxes", ALICE, {"image": "host"})
        assert status == 200, created
        sid = created["sandbox_id"]
        assert (await asyncio.to_thread(_http, port, "GET", f"/sandboxes/{sid}", BOB))[0] == 404
        assert (await asyncio.to_thread(_http, port, "GET", f"/sandboxes/{sid}", ALICE))[0] == 200
        assert (await asyncio.to_thread(_http, port, "GET", "/sandboxes/x", "wrong-key-000"))[0] == 403
    finally:
        await gateway.stop()


def test_malformed_tokens_file_is_refused(tmp_path: Path) -> None:
    """A tokens file with a bad line stops the service at start-up, naming the line."""
    from orchard.runtime.settings import SettingsError, load_settings
    from orchard.services.env.settings import EnvSettings

    tokens = tmp_path / "tokens"
    tokens.write_text("alice:short\n")
    with pytest.raises(SettingsError, match="tokens:1"):
        load_settings(EnvSettings, ["--auth-tokens-file", str(tokens)])
