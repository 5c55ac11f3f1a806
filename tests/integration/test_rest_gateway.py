"""The REST gateway (public Orchard Env HTTP API) against a real env service on 127.0.0.1: the gRPC server and
the gateway in one process over one SandboxManager, real "host" sandboxes."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from env_helpers import HOST_IMAGE, needs_sandboxes

from orchard.runtime import GrpcServer
from orchard.services.env.manager import SandboxManager
from orchard.services.env.server import build, start_gateway
from orchard.services.env.settings import EnvSettings

pytestmark = [needs_sandboxes, pytest.mark.timeout(60)]

TOKEN = "s3cret-token"
PATCH = "--- a/calc.py\n+++ b/calc.py\n@@ -1,2 +1,2 @@\n def add(a, b):\n-    return a - b\n+    return a + b\n"
CALC = b"def add(a, b):\n    return a - b\n"


@dataclass
class Api:
    """A running env service with its REST gateway, and a client session aimed at it."""

    url: str
    session: aiohttp.ClientSession
    manager: SandboxManager
    server: GrpcServer

    async def call(self, method: str, path: str, status: int = 200, **kw: Any) -> Any:
        """One request; asserts the status and returns the JSON body."""
        async with self.session.request(method, self.url + path, **kw) as response:
            body = await response.json()
            assert response.status == status, body
            return body

    async def sandbox(self, **fields: Any) -> str:
        """Create a host-image sandbox and return its id."""
        return (await self.call("POST", "/sandboxes", json={"image": HOST_IMAGE, **fields}))["sandbox_id"]


StartApi = Callable[..., Awaitable[Api]]


@pytest.fixture
async def start_api(tmp_path: Path) -> AsyncIterator[StartApi]:
    """Start env services with a gateway on http_port=0 (settings overridable); all stopped after."""
    started: list[Api] = []

    async def start(headers: dict[str, str] | None = None, **overrides: Any) -> Api:
        settings = EnvSettings(
            **{
                "port": 0,
                "http_port": 0,
                "state_dir": tmp_path / f"state{len(started)}",
                "log_format": "text",
                "grace_period_s": 1.0,
                **overrides,
            }
        )
        server, manager = await build(settings)
        try:
            gateway = await start_gateway(settings, server, manager)
        except BaseException:
            await manager.close()
            raise
        assert gateway is not None
        api = Api(f"http://127.0.0.1:{gateway.port}", aiohttp.ClientSession(headers=headers), manager, server)
        started.append(api)
        await server.start()
        return api

    yield start
    for api in reversed(started):
        await api.session.close()
        await api.server.stop()  # the gateway drains, then the manager destroys every sandbox left


@pytest.fixture
async def api(start_api: StartApi) -> Api:
    """One service without auth."""
    return await start_api()


async def test_banner_health_resources_and_auth(start_api: StartApi) -> None:
    """With a token, / and /health are open, other routes answer 401 without X-API-Key and 403 with a wrong one."""
    api = await start_api(auth_token=TOKEN)
    assert (await api.call("GET", "/"))["status"] == "running"
    assert await api.call("GET", "/health") == {"status": "healthy"}
    missing = await api.call("GET", "/resources", 401)
    assert "X-API-Key" in missing["detail"]
    assert (
        "invalid API key"
        in (await api.call("POST", "/sandboxes", 403, json={"image": HOST_IMAGE}, headers={"X-API-Key": "wrong"}))[
            "detail"
        ]
    )
    resources = await api.call("GET", "/resources", headers={"X-API-Key": TOKEN})
    assert resources["status"] == "ok" and resources["total_capacity"]["cpu"] >= 1


async def test_sandbox_lifecycle(api: Api) -> None:
    """Create (upstream defaults echoed), get, wait, heartbeat (arms a 180 s timeout), delete, then 404."""
    created = await api.call("POST", "/sandboxes", json={"image": HOST_IMAGE, "sandbox_id": "rest-box-1"})
    assert created == {
        "sandbox_id": "rest-box-1",
        "namespace": "local",
        "image": HOST_IMAGE,
        "block_network": True,
        "cpu": "4",
        "memory": "16Gi",
        "timeout": 3600,
        "status": "ready",
    }
    info = await api.call("GET", "/sandboxes/rest-box-1")
    assert info["ready"] is True and info["status"] == "ready" and info["created_at"] <= time.time()
    assert (await api.call("GET", "/sandboxes/rest-box-1/wait", params={"timeout": "5"}))["ready"] is True
    assert api.manager.sandboxes["rest-box-1"].heartbeat_timeout_s == 0
    assert await api.call("POST", "/sandboxes/rest-box-1/heartbeat") == {"status": "ok", "sandbox_id": "rest-box-1"}
    assert api.manager.sandboxes["rest-box-1"].heartbeat_timeout_s == 180
    assert (
        "already exists"
        in (await api.call("POST", "/sandboxes", 409, json={"image": HOST_IMAGE, "sandbox_id": "rest-box-1"}))["detail"]
    )
    assert await api.call("DELETE", "/sandboxes/rest-box-1") == {"status": "deleted", "sandbox_id": "rest-box-1"}
    assert "not found" in (await api.call("GET", "/sandboxes/rest-box-1", 404))["detail"]
    await api.call("DELETE", "/sandboxes/rest-box-1", 404)


async def test_create_options_and_refusals(start_api: StartApi) -> None:
    """block_network=false gets egress or a 400 with a hint; cpu/memory echo; a full service is 503 with Retry-After."""
    api = await start_api(max_sandboxes=1)
    async with api.session.post(api.url + "/sandboxes", json={"image": HOST_IMAGE, "block_network": False}) as resp:
        body = await resp.json()
        if resp.status == 200:  # the backend has egress allowlists (and nftables here)
            assert body["block_network"] is False
            await api.call("DELETE", f"/sandboxes/{body['sandbox_id']}")
        else:
            assert resp.status == 400 and "block_network=true" in body["detail"], body
    custom = await api.call("POST", "/sandboxes", json={"image": HOST_IMAGE, "cpu": "2", "memory": "8Gi"})
    assert (custom["cpu"], custom["memory"]) == ("2", "8Gi")
    assert (await api.call("GET", f"/sandboxes/{custom['sandbox_id']}"))["memory"] == "8Gi"
    async with api.session.post(api.url + "/sandboxes", json={"image": HOST_IMAGE}) as response:
        assert response.status == 503 and response.headers["Retry-After"] == "5"
        assert "limit" in (await response.json())["detail"]
    missing = await api.call("POST", "/sandboxes", 422, json={"cpu": "4"})
    assert missing["detail"][0]["loc"] == ["body", "image"]


async def test_unknown_ids_routes_and_bad_bodies(api: Api) -> None:
    """Unknown sandbox/job/route → 404, wrong method → 405, bad JSON or fields → 422, all as {"detail": ...}."""
    for method, path in [
        ("GET", "/sandboxes/nope"),
        ("GET", "/jobs/ex-nope"),
        ("GET", "/jobs/ex-nope/wait"),
        ("POST", "/sandboxes/nope/heartbeat"),
        ("GET", "/sandboxes/nope/files/list"),
    ]:
        assert "not found" in (await api.call(method, path, 404))["detail"]
    assert (await api.call("POST", "/sandboxes/nope/exec", 404, json={"command": "true"}))["detail"]
    assert await api.call("GET", "/no/such/route", 404) == {"detail": "Not Found"}
    assert await api.call("PUT", "/sandboxes", 405) == {"detail": "Method Not Allowed"}
    bad_json = await api.call(
        "POST", "/sandboxes", 422, data=b"{not json", headers={"Content-Type": "application/json"}
    )
    assert bad_json["detail"][0]["type"] == "json_invalid"
    sandbox_id = await api.sandbox()
    bad_field = await api.call("POST", f"/sandboxes/{sandbox_id}/exec", 422, json={"command": 5})
    assert bad_field["detail"][0]["loc"][:2] == ["body", "command"]
    assert (await api.call("GET", "/jobs/ex-x/wait", 422, params={"timeout": "soon"}))["detail"][0]["loc"] == [
        "query",
        "timeout",
    ]


async def test_exec_without_wait_then_poll_and_wait(api: Api) -> None:
    """wait=false answers {job_id, status: queued}; polling GET /jobs/{id} reaches succeeded; /wait returns it."""
    sandbox_id = await api.sandbox()
    queued = await api.call("POST", f"/sandboxes/{sandbox_id}/exec", json={"command": "sleep 0.2; echo done"})
    assert queued == {"job_id": queued["job_id"], "status": "queued"}
    seen = set()
    while (job := await api.call("GET", f"/jobs/{queued['job_id']}"))["status"] != "succeeded":
        seen.add(job["status"])
        await asyncio.sleep(0.02)
    assert seen <= {"queued", "running"} and "running" in seen
    assert job["stdout"] == "done\n" and job["exit_code"] == 0 and job["error"] is None
    assert job["created_at"] <= job["started_at"] <= job["completed_at"]
    assert await api.call("GET", f"/jobs/{job['job_id']}/wait", params={"timeout": "1"}) == job


async def test_exec_with_wait(api: Api) -> None:
    """wait=true answers the finished job: exit codes, stderr, env, cwd, login shell and argv quoting."""
    sandbox_id = await api.sandbox()
    path = f"/sandboxes/{sandbox_id}/exec"
    failed = await api.call("POST", path, json={"command": "echo out; echo err >&2; exit 3", "wait": True})
    assert (failed["status"], failed["exit_code"], failed["stdout"], failed["stderr"], failed["error"]) == (
        "failed",
        3,
        "out\n",
        "err\n",
        None,
    )
    env = await api.call(
        "POST",
        path,
        json={
            "command": "echo $A $(pwd) $0",
            "env": {"A": "1"},
            "cwd": "/tmp",
            "login_shell": True,
            "wait": True,
            "timeout_seconds": 10,
        },
    )
    assert env["stdout"] == "1 /tmp bash\n" and env["status"] == "succeeded"
    argv = await api.call("POST", path, json={"command": ["printf", "%s|", "a b", "it's", "$HOME"], "wait": True})
    assert argv["stdout"] == "a b|it's|$HOME|" and argv["command"] == "printf '%s|' 'a b' 'it'\"'\"'s' '$HOME'"


async def test_exec_timeout_and_job_wait_408(api: Api) -> None:
    """A command past its timeout is failed saying so; a job wait that runs out answers 408."""
    sandbox_id = await api.sandbox()
    path = f"/sandboxes/{sandbox_id}/exec"
    timed_out = await api.call("POST", path, json={"command": "sleep 5", "timeout_seconds": 0.5, "wait": True})
    assert timed_out["status"] == "failed" and "timed out" in timed_out["error"]
    job_id = (await api.call("POST", path, json={"command": "sleep 5"}))["job_id"]
    late = await api.call("GET", f"/jobs/{job_id}/wait", 408, params={"timeout": "0.3"})
    assert "still" in late["detail"]
    await api.call("DELETE", f"/sandboxes/{sandbox_id}")
    cancelled = await api.call("GET", f"/jobs/{job_id}")
    assert cancelled["status"] == "failed" and "cancelled" in cancelled["error"]


async def test_apply_patch(api: Api) -> None:
    """A patch that applies is success=true; one that does not is success=false with git's message, files unchanged."""
    sandbox_id = await api.sandbox()
    content = base64.b64encode(CALC).decode()
    await api.call("POST", f"/sandboxes/{sandbox_id}/files", json={"path": "calc.py", "content": content})
    ok = await api.call("POST", f"/sandboxes/{sandbox_id}/apply_patch", json={"patch": PATCH})
    assert ok["success"] is True and ok["exit_code"] == 0
    again = await api.call("POST", f"/sandboxes/{sandbox_id}/apply_patch", json={"patch": PATCH, "timeout_seconds": 5})
    assert again["success"] is False and "does not apply" in again["stderr"] and again["error"]
    download = await api.call("GET", f"/sandboxes/{sandbox_id}/files", params={"path": "calc.py"})
    assert base64.b64decode(download["content"]) == CALC.replace(b"a - b", b"a + b")


async def test_files_round_trip_and_list(api: Api) -> None:
    """Binary upload/download round trip, listing with types, and the file routes' errors."""
    sandbox_id = await api.sandbox()
    files = f"/sandboxes/{sandbox_id}/files"
    blob = bytes(range(256)) * 5000
    uploaded = await api.call("POST", files, json={"path": "dir/blob.bin", "content": base64.b64encode(blob).decode()})
    assert uploaded == {"success": True, "path": "/workspace/dir/blob.bin", "size": len(blob)}
    download = await api.call("GET", files, params={"path": "/workspace/dir/blob.bin"})
    assert base64.b64decode(download["content"]) == blob and download["size"] == len(blob)
    listing = await api.call("GET", files + "/list")
    assert listing["path"] == "/workspace" and [(f["name"], f["type"]) for f in listing["files"]] == [
        ("dir", "directory")
    ]
    inner = (await api.call("GET", files + "/list", params={"path": "dir"}))["files"]
    assert inner[0]["name"] == "blob.bin" and inner[0]["size"] == len(blob) and inner[0]["modified"].endswith("+00:00")
    assert (await api.call("GET", files, 404, params={"path": "missing.txt"}))["detail"]
    assert "directory" in (await api.call("GET", files, 400, params={"path": "dir"}))["detail"]
    assert "base64" in (await api.call("POST", files, 400, json={"path": "x", "content": "@@@"}))["detail"]
    assert (await api.call("GET", files, 422))["detail"][0]["loc"] == ["query", "path"]


async def test_body_size_limit(start_api: StartApi) -> None:
    """A body over max_message_bytes is refused with 413 before it reaches the sandbox."""
    api = await start_api(max_message_bytes=64 * 1024)
    sandbox_id = await api.sandbox()
    big = base64.b64encode(os.urandom(96 * 1024)).decode()
    refused = await api.call("POST", f"/sandboxes/{sandbox_id}/files", 413, json={"path": "big", "content": big})
    assert "exceeded" in refused["detail"]


async def read_until(ws: aiohttp.ClientWebSocketResponse, text: bytes) -> bytes:
    """PTY output frames until text has appeared."""
    seen = b""
    while text not in seen:
        frame = await ws.receive_json(timeout=10)
        assert frame["type"] == "stdout", frame
        seen += base64.b64decode(frame["data"])
    return seen


async def test_pty_websocket(start_api: StartApi) -> None:
    """Upstream's PTY frames (key in ?api_key=): init, ready, stdout, stdin, resize, exit; errors close with 4xxx."""
    api = await start_api(headers={"X-API-Key": TOKEN}, auth_token=TOKEN)
    sandbox_id = await api.sandbox()
    ws_url = api.url.replace("http", "ws") + f"/sandboxes/{sandbox_id}/exec/pty"
    async with aiohttp.ClientSession() as bare:
        async with bare.ws_connect(f"{ws_url}?api_key={TOKEN}") as ws:
            await ws.send_json(
                {
                    "type": "init",
                    "cmd": ["bash", "-c", "stty size; read x; echo got-$x; exit 4"],
                    "env": {},
                    "cwd": None,
                    "rows": 30,
                    "cols": 100,
                    "login_shell": False,
                }
            )
            ready = await ws.receive_json(timeout=10)
            assert ready["type"] == "ready" and isinstance(ready["pid"], int) and ready["pid"] > 1
            assert b"30 100" in await read_until(ws, b"30 100")
            await ws.send_json({"type": "resize", "rows": 40, "cols": 120})
            await ws.send_json({"type": "stdin", "data": base64.b64encode(b"abc\n").decode()})
            await read_until(ws, b"got-abc")
            while (frame := await ws.receive_json(timeout=10))["type"] == "stdout":
                pass
            assert frame == {"type": "exit", "code": 4}
            assert (await ws.receive()).type is aiohttp.WSMsgType.CLOSE
        async with bare.ws_connect(f"{ws_url}?api_key={TOKEN}") as ws:  # killed by a signal: -9, as upstream says
            await ws.send_json({"type": "init", "cmd": ["bash", "-c", "echo up; kill -9 $$"]})
            assert (await ws.receive_json(timeout=10))["type"] == "ready"
            while (frame := await ws.receive_json(timeout=10))["type"] == "stdout":
                pass
            assert frame == {"type": "exit", "code": -9}
        async with bare.ws_connect(f"{ws_url}?api_key={TOKEN}") as ws:  # an interactive shell, ended by the client
            await ws.send_json({"type": "init", "login_shell": True})
            assert (await ws.receive_json(timeout=10))["type"] == "ready"
            await ws.send_json({"type": "stdin", "data": base64.b64encode(b"echo $((6*7))\n").decode()})
            await read_until(ws, b"42")
            await ws.send_json({"type": "stdin", "data": base64.b64encode(b"sleep 1000\n").decode()})
            await ws.send_json({"type": "close"})
            while (message := await ws.receive(timeout=10)).type is aiohttp.WSMsgType.TEXT:
                assert message.json()["type"] == "stdout"  # the terminal may still echo what was typed
            assert message.type is aiohttp.WSMsgType.CLOSE
        async with bare.ws_connect(ws_url.replace(sandbox_id, "nope"), protocols=[f"api_key.{TOKEN}"]) as ws:
            await ws.send_json({"type": "init", "cmd": ["true"]})
            assert "not found" in (await ws.receive_json(timeout=10))["message"]
            await ws.receive()
            assert ws.close_code == 4404
        async with bare.ws_connect(f"{ws_url}?api_key={TOKEN}") as ws:
            await ws.send_str("hello")
            assert "init" in (await ws.receive_json(timeout=10))["message"]
            await ws.receive()
            assert ws.close_code == 4400
        with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
            await bare.ws_connect(ws_url)
        assert refused.value.status == 401
    processes = await api.call(
        "POST", f"/sandboxes/{sandbox_id}/exec", json={"command": "cat /proc/[0-9]*/comm", "wait": True}
    )
    assert "sleep" not in processes["stdout"]  # closing a session killed its program's whole tree


async def test_stop_drains_requests_in_flight(api: Api) -> None:
    """A request in flight when the service stops still gets its answer before the manager closes the sandboxes."""
    sandbox_id = await api.sandbox()
    request = asyncio.create_task(
        api.call("POST", f"/sandboxes/{sandbox_id}/exec", json={"command": "sleep 0.5; echo drained", "wait": True})
    )
    await asyncio.sleep(0.2)
    await api.server.stop()
    assert (await request)["stdout"] == "drained\n"
    assert not api.manager.sandboxes


def upstream_style_session(base_url: str, api_key: str) -> bytes:
    """Shaped like the upstream SDK's calls (create → exec(wait) → upload → apply_patch → download → delete)."""

    def request(method: str, path: str, payload: dict[str, Any] | None = None) -> dict[str, Any]:
        data = json.dumps(payload).encode() if payload is not None else None
        req = urllib.request.Request(
            f"{base_url}{path}",
            data=data,
            method=method,
            headers={"X-API-Key": api_key, "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=60) as response:
            return json.load(response)

    sandbox_id = request("POST", "/sandboxes", {"image": HOST_IMAGE, "block_network": True})["sandbox_id"]
    try:
        ready = request("GET", f"/sandboxes/{sandbox_id}/wait?timeout=3600")
        assert ready.get("ready") or ready.get("status") == "ready"
        job = request(
            "POST",
            f"/sandboxes/{sandbox_id}/exec",
            {
                "command": "git --version",
                "timeout_seconds": None,
                "cwd": None,
                "env": None,
                "login_shell": False,
                "wait": True,
            },
        )
        assert job["status"] == "succeeded", job
        request(
            "POST",
            f"/sandboxes/{sandbox_id}/files",
            {"path": "/workspace/calc.py", "content": base64.b64encode(CALC).decode()},
        )
        patched = request("POST", f"/sandboxes/{sandbox_id}/apply_patch", {"patch": PATCH, "timeout_seconds": 30})
        assert patched["success"], patched
        download = request("GET", f"/sandboxes/{sandbox_id}/files?path=/workspace/calc.py")
        return base64.b64decode(download["content"])
    finally:
        request("DELETE", f"/sandboxes/{sandbox_id}")


async def test_upstream_style_client_end_to_end(start_api: StartApi) -> None:
    """A plain urllib client written against the upstream contract runs unchanged: only its base URL is ours."""
    api = await start_api(auth_token=TOKEN)
    patched = await asyncio.to_thread(upstream_style_session, api.url, TOKEN)
    assert patched == CALC.replace(b"a - b", b"a + b")
    assert not api.manager.sandboxes
    with pytest.raises(urllib.error.HTTPError) as refused:
        await asyncio.to_thread(upstream_style_session, api.url, "wrong")
    assert refused.value.code == 403


def test_serve_env_with_http_port(tmp_path: Path) -> None:
    """`orchard serve env --http-port N` serves REST next to gRPC, and SIGTERM stops both cleanly (exit 0)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        http_port = probe.getsockname()[1]
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "orchard.services.env.server",
            "--port",
            "0",
            "--http-port",
            str(http_port),
            "--state-dir",
            str(tmp_path / "state"),
            "--log-format",
            "text",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/health", timeout=1) as response:
                    assert json.load(response) == {"status": "healthy"}
                break
            except (urllib.error.URLError, ConnectionError):
                assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1].decode()
                time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=20)
        assert proc.returncode == 0, stderr.decode()
        assert b"env REST gateway stopped" in stderr
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
