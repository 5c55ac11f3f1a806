"""The Python SDK end to end: a real env service on 127.0.0.1 (local backend), real "host" sandboxes."""

from __future__ import annotations

import asyncio
import hashlib
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from env_helpers import needs_sandboxes

from orchard import AsyncExecHandle, AsyncSandbox, AsyncSandboxClient, JobResult, PatchError, SandboxClient
from orchard.errors import FailedPrecondition, NotFound, Unauthenticated, Unavailable
from orchard.sdk.config import load_config
from orchard.services.env.server import build
from orchard.services.env.settings import EnvSettings

pytestmark = [needs_sandboxes, pytest.mark.timeout(60)]

PATCH = """\
diff --git a/calc.py b/calc.py
--- a/calc.py
+++ b/calc.py
@@ -1,2 +1,2 @@
 def add(a, b):
-    return a - b
+    return a + b  # fixed
"""
CALC = "def add(a, b):\n    return a - b\n"
FIXED = b"def add(a, b):\n    return a + b  # fixed\n"
# A patch that applies to calc.py (once fixed) but not to other.py: all or nothing means neither changes.
HALF_GOOD = """\
diff --git a/calc.py b/calc.py
--- a/calc.py
+++ b/calc.py
@@ -1,2 +1,2 @@
 def add(a, b):
-    return a + b  # fixed
+    return b + a
diff --git a/other.py b/other.py
--- a/other.py
+++ b/other.py
@@ -1 +1 @@
-x = 2
+x = 3
"""
TEST_CALC = (
    "import unittest\nfrom calc import add\n\n\nclass T(unittest.TestCase):\n"
    "    def test_add(self):\n        self.assertEqual(add(2, 3), 5)\n"
)


@pytest.fixture(scope="module")
def address(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real env service on 127.0.0.1:0, on its own event loop in a thread so sync and async tests share it."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    settings = EnvSettings(port=0, state_dir=tmp_path_factory.mktemp("env") / "state", log_format="text")

    async def start() -> tuple[object, int]:
        server, _ = await build(settings)
        return server, await server.start()

    server, port = asyncio.run_coroutine_threadsafe(start(), loop).result(30)
    yield f"127.0.0.1:{port}"
    asyncio.run_coroutine_threadsafe(server.stop(), loop).result(30)  # type: ignore[attr-defined]
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)
    loop.close()


@pytest.fixture
async def client(address: str) -> AsyncIterator[AsyncSandboxClient]:
    """A connected async client; its sandboxes are deleted when the test ends."""
    async with await AsyncSandboxClient.connect(address) as client:
        yield client


@pytest.fixture
async def sandbox(client: AsyncSandboxClient) -> AsyncIterator[AsyncSandbox]:
    """A fresh "host" sandbox, deleted after the test."""
    async with await client.create_sandbox("host") as sandbox:
        yield sandbox


def free_port() -> int:
    """A loopback port nothing listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_lifecycle_and_context_exit_deletes(address: str) -> None:
    """create -> exec -> delete; leaving a sandbox's block deletes it, closing the client deletes the rest."""
    async with AsyncSandboxClient(address) as client:
        sandbox = await client.create_sandbox("host", env={"GREETING": "hi"}, labels={"test": "lifecycle"})
        assert sandbox.info.state == "ready" and sandbox.info.labels == {"test": "lifecycle"}
        assert (await sandbox.exec("echo $GREETING")).stdout == "hi\n"
        await sandbox.delete()
        await sandbox.delete()  # deleting twice is fine
        with pytest.raises(NotFound, match="deleted by a client"):
            await client.get_sandbox(sandbox.sandbox_id)

        async with await client.create_sandbox("host") as scoped:
            assert (await client.get_sandbox(scoped.sandbox_id)).info.state == "ready"
        with pytest.raises(NotFound):
            await scoped.refresh()

        left = await client.create_sandbox("host")
    async with AsyncSandboxClient(address) as other:
        with pytest.raises(NotFound):
            await other.get_sandbox(left.sandbox_id)


async def test_exec_result_fields(sandbox: AsyncSandbox) -> None:
    """stdout, stderr, exit code and status of a good and a failing command; cwd, env, stdin and timeouts."""
    ok = await sandbox.exec("echo out; echo err >&2")
    assert (ok.stdout, ok.stderr, ok.exit_code, ok.status) == ("out\n", "err\n", 0, "succeeded")
    assert ok.succeeded and ok.is_complete and not ok.failed and ok.duration is not None

    bad = await sandbox.exec("echo bye; exit 3")
    assert (bad.stdout, bad.exit_code, bad.status) == ("bye\n", 3, "failed")
    assert bad.failed and not bad.succeeded and bad.is_complete

    shaped = await sandbox.exec("cat; echo; echo $FOO; pwd", cwd="/tmp", env={"FOO": "bar"}, stdin="in")
    assert shaped.stdout == "in\nbar\n/tmp\n"

    slow = await sandbox.exec("sleep 10", timeout=0.5)
    assert slow.status == "timed_out" and slow.timed_out and slow.failed and "timed out" in slow.error


async def test_argv_is_quoted(sandbox: AsyncSandbox) -> None:
    """A list command is argv: spaces and quotes reach the program intact."""
    result = await sandbox.exec(["printf", "%s|", "a b", "it's"])
    assert result.stdout == "a b|it's|"


async def test_stream_yields_output_in_order_before_the_end(sandbox: AsyncSandbox) -> None:
    """stream() yields each chunk as it is written, in order, long before the command ends."""
    handle = await sandbox.start("for i in 1 2 3; do echo $i; sleep 0.4; done; echo done >&2")
    started = time.monotonic()
    chunks: list[tuple[str, bytes, float]] = []
    async for name, data in handle.stream():
        chunks.append((name, data, time.monotonic() - started))
    assert b"".join(d for n, d, _ in chunks if n == "stdout") == b"1\n2\n3\n"
    assert b"".join(d for n, d, _ in chunks if n == "stderr") == b"done\n"
    assert chunks[0][2] < chunks[-1][2] - 0.6  # the first line came well before the last
    result = await handle.wait()
    assert result.status == "succeeded" and result.stdout == "1\n2\n3\n"


async def until_output(handle: AsyncExecHandle, text: str) -> None:
    """Poll describe() until the command's stdout contains text (5 s at most)."""
    async with asyncio.timeout(5):
        while text not in (await handle.describe()).stdout:
            await asyncio.sleep(0.02)


async def test_cancel(sandbox: AsyncSandbox) -> None:
    """wait(timeout) gives up without stopping the command; cancel() kills it and wait() reports it cancelled."""
    handle = await sandbox.exec_async("echo started; sleep 30")
    await until_output(handle, "started")
    assert (await handle.describe()).status == "running"
    with pytest.raises(TimeoutError):
        await handle.wait(0.2)
    cancelled = await handle.cancel()
    assert cancelled.status == "cancelled" and cancelled.is_complete and cancelled.stdout == "started\n"
    assert (await handle.wait(5)).status == "cancelled"
    assert (await sandbox.exec("echo next")).stdout == "next\n"  # the sandbox goes on


async def test_cancel_right_after_start(sandbox: AsyncSandbox) -> None:
    """cancel() at once after start(), while the process may still be spawning, stops it too."""
    handle = await sandbox.start("sleep 30")
    assert (await handle.cancel()).status == "cancelled"


async def test_apply_patch(sandbox: AsyncSandbox) -> None:
    """A good patch applies and reports its files; a bad one raises PatchError and changes nothing."""
    await sandbox.upload_content(CALC, "calc.py")
    await sandbox.upload_content("x = 1\n", "other.py")
    result = await sandbox.apply_patch(PATCH)
    assert result.files == ["calc.py"]
    assert await sandbox.download_content("calc.py") == FIXED

    with pytest.raises(PatchError, match="does not apply") as info:
        await sandbox.apply_patch(HALF_GOOD)
    assert isinstance(info.value, FailedPrecondition)
    assert await sandbox.download_content("calc.py") == FIXED
    assert await sandbox.download_content("other.py") == b"x = 1\n"


async def test_upload_and_download_content(sandbox: AsyncSandbox) -> None:
    """Binary bytes and text round-trip exactly; parent folders are created."""
    data = bytes(range(256)) * 4099  # not a multiple of the chunk size
    uploaded = await sandbox.upload_content(data, "deep/dir/blob.bin")
    assert (uploaded.path, uploaded.size) == ("/workspace/deep/dir/blob.bin", len(data))
    assert await sandbox.download_content("/workspace/deep/dir/blob.bin") == data
    await sandbox.upload_content("héllo\n", "text.txt")
    assert (await sandbox.exec("cat text.txt")).stdout == "héllo\n"


async def test_upload_and_download_a_10mb_file(sandbox: AsyncSandbox, tmp_path: Path) -> None:
    """A 10 MB file streams up and back down unchanged (same sha256), with no partial file left."""
    source = tmp_path / "big.bin"
    source.write_bytes(os.urandom(10 * 1000 * 1000))
    uploaded = await sandbox.upload_file(source, "big.bin")
    assert uploaded.size == source.stat().st_size
    back = tmp_path / "back.bin"
    assert await sandbox.download_file("big.bin", back) == uploaded.size
    assert hashlib.sha256(back.read_bytes()).digest() == hashlib.sha256(source.read_bytes()).digest()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["back.bin", "big.bin"]


async def test_list_files(sandbox: AsyncSandbox) -> None:
    """list_files gives name, absolute path, type, size and mtime, ordered by name."""
    await sandbox.upload_content(b"12345", "d/file.txt")
    await sandbox.exec("mkdir d/sub")
    entries = await sandbox.list_files("d")
    assert [(e.name, e.path, e.type) for e in entries] == [
        ("file.txt", "/workspace/d/file.txt", "file"),
        ("sub", "/workspace/d/sub", "directory"),
    ]
    assert entries[0].size == 5 and entries[0].modified is not None and entries[0].modified > 0
    assert "d" in [e.name for e in await sandbox.list_files()]  # the workdir by default


async def test_get_job(sandbox: AsyncSandbox) -> None:
    """get_job returns the same result as exec for a finished command."""
    result = await sandbox.exec("echo from-job")
    job = await sandbox.get_job(result.job_id)
    assert isinstance(job, JobResult)
    assert (job.job_id, job.status, job.stdout, job.exit_code) == (result.job_id, "succeeded", "from-job\n", 0)
    with pytest.raises(NotFound):
        await sandbox.get_job("ex-unknown")


async def test_cleanup_all_and_list_with_prefix(address: str) -> None:
    """A prefixed client names and labels its sandboxes; list_sandboxes pages by label; cleanup_all deletes."""
    async with AsyncSandboxClient(address, prefix="sdkt", auto_cleanup=False) as client:
        made = [await client.create_sandbox("host") for _ in range(3)]
        assert all(sb.sandbox_id.startswith("sdkt-") for sb in made)
        listed = [sb.sandbox_id async for sb in client.list_sandboxes({"orchard.prefix": "sdkt"}, page_size=2)]
        assert listed == sorted(sb.sandbox_id for sb in made)
        await made[0].delete()
        assert sorted(await client.cleanup_all()) == sorted(sb.sandbox_id for sb in made[1:])
        assert [sb async for sb in client.list_sandboxes({"orchard.prefix": "sdkt"})] == []


async def test_unreachable_service_fails_fast() -> None:
    """Nothing listening: connect raises Unavailable (a ConnectionError) within seconds, naming the address."""
    target = f"127.0.0.1:{free_port()}"
    started = time.monotonic()
    with pytest.raises(ConnectionError) as info:
        await AsyncSandboxClient.connect(target)
    assert time.monotonic() - started < 20  # seconds, not the retry budget of minutes
    assert isinstance(info.value, Unavailable)
    assert target in str(info.value) and "orchard serve env" in str(info.value)


async def test_idempotent_calls_retry_then_raise_unavailable(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """When the service goes away, a Get is tried 3 times with backoff, then Unavailable names the address."""
    server, _ = await build(EnvSettings(port=0, state_dir=tmp_path / "state", log_format="text", grace_period_s=0))
    port = await server.start()
    client = await AsyncSandboxClient.connect(f"127.0.0.1:{port}")
    await server.stop()
    caplog.set_level("INFO", logger="orchard.sdk")
    try:
        with pytest.raises(Unavailable, match=f"127.0.0.1:{port}"):
            await client.get_sandbox("sb-any")
    finally:
        await client.close()
    assert len([r for r in caplog.records if "GetSandbox failed" in r.message]) == 2  # two retries


async def test_api_key_is_sent_as_bearer_token(tmp_path: Path) -> None:
    """With auth on, a client without the key is refused and one with it works."""
    server, _ = await build(EnvSettings(port=0, state_dir=tmp_path / "state", log_format="text", auth_token="s3cret"))
    port = await server.start()
    try:
        async with AsyncSandboxClient(f"127.0.0.1:{port}") as anonymous:
            with pytest.raises(Unauthenticated):
                await anonymous.create_sandbox("host")
        async with (
            AsyncSandboxClient(f"http://127.0.0.1:{port}", api_key="s3cret") as client,
            await client.create_sandbox("host") as sandbox,
        ):
            assert (await sandbox.exec("echo ok")).stdout == "ok\n"
    finally:
        await server.stop()


def test_config_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Arguments beat ORCHARD_ENV_ADDRESS, which beats SANDBOX_BASE_URL (scheme stripped); keys and prefix too."""
    for name in ("ORCHARD_ENV_ADDRESS", "SANDBOX_BASE_URL", "ORCHARD_API_KEY", "SANDBOX_API_KEY", "SANDBOX_PREFIX"):
        monkeypatch.delenv(name, raising=False)
    assert load_config().target == "127.0.0.1:50051"
    monkeypatch.setenv("SANDBOX_BASE_URL", "http://envhost:8080/")
    monkeypatch.setenv("SANDBOX_API_KEY", "k1")
    monkeypatch.setenv("SANDBOX_PREFIX", "team")
    config = load_config()
    assert (config.target, config.secure, config.api_key, config.prefix) == ("envhost:8080", False, "k1", "team")
    monkeypatch.setenv("ORCHARD_ENV_ADDRESS", "grpchost:50051")
    assert load_config().target == "grpchost:50051"
    assert load_config("https://arg:443", api_key="k2").target == "arg:443"
    assert load_config("https://arg:443").secure and load_config(api_key="k2").api_key == "k2"


def test_sync_quick_start(address: str) -> None:
    """The quick start, verbatim but for the image: exec, apply a patch, exec again; `with` cleans up.

    The fix changes calc.py's size on purpose: a same-size edit within the same second as the first run
    would leave Python's __pycache__ (keyed on source mtime in seconds and size) looking fresh.
    """
    aks_modal = pytest.importorskip("aks_modal", reason="aks_modal is not installed (libs/aks_modal in setup.py)")
    with aks_modal.SandboxClient(address) as client:
        with client.create_sandbox("host") as sandbox:
            sandbox.upload_content(CALC, "calc.py")
            sandbox.upload_content(TEST_CALC, "test_calc.py")
            result = sandbox.exec("python3 -m unittest -q", timeout=600)
            assert result.exit_code == 1 and "FAILED" in result.stderr
            sandbox.apply_patch(PATCH)
            result = sandbox.exec("python3 -m unittest")
            assert result.exit_code == 0 and "OK" in result.stderr
            handle = sandbox.start("echo a; sleep 0.2; echo b")
            assert b"".join(chunk for _, chunk in handle.stream()) == b"a\nb\n"
            assert handle.wait().succeeded
            sandbox_id = sandbox.sandbox_id
        with pytest.raises(NotFound):
            client.get_sandbox(sandbox_id)
        assert [sb.sandbox_id for sb in client.list_sandboxes()] == sorted(
            sb.sandbox_id for sb in client.list_sandboxes()
        )


def test_sync_get_unknown_sandbox_raises_not_found(address: str) -> None:
    """get_sandbox of an unknown id raises NotFound (also a LookupError)."""
    with SandboxClient(address) as client:
        with pytest.raises(NotFound, match="sb-nope") as info:
            client.get_sandbox("sb-nope")
        assert isinstance(info.value, LookupError)


async def test_sync_client_inside_a_running_loop(address: str) -> None:
    """The blocking client works where an event loop already runs (as in Jupyter)."""
    with SandboxClient(address) as client, client.create_sandbox("host") as sandbox:
        assert sandbox.exec(["echo", "in a loop"]).stdout == "in a loop\n"


def test_sync_client_cleans_up_at_process_exit(address: str) -> None:
    """A sync client that is never closed deletes its sandboxes when the process exits."""
    script = (
        "import sys; from orchard import SandboxClient; "
        "c = SandboxClient(sys.argv[1]); print(c.create_sandbox('host').sandbox_id)"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, address], capture_output=True, text=True, timeout=30, check=True
    )
    sandbox_id = done.stdout.strip()
    assert sandbox_id.startswith("sb-")
    with SandboxClient(address) as client, pytest.raises(NotFound, match="deleted by a client"):
        client.get_sandbox(sandbox_id)
