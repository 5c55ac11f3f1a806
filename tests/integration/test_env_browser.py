"""Browser sandboxes end to end through the SDK: a real env service on 127.0.0.1 driving real headless Chromium,
against a small page served on 127.0.0.1 by a ThreadingHTTPServer. One service (and browser) for the module."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import struct
import threading
import time
import zlib
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import grpc
import psutil
import pytest
from env_helpers import needs_sandboxes

from orchard import AsyncSandboxClient
from orchard.env.v1 import env_pb2 as pb
from orchard.env.v1 import env_pb2_grpc
from orchard.errors import (
    DeadlineExceeded,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
)
from orchard.services.env.manager import SandboxManager
from orchard.services.env.server import build
from orchard.services.env.settings import EnvSettings

CHROMIUM = EnvSettings.model_fields["browser_path"].default
pytestmark = [
    pytest.mark.timeout(90),
    pytest.mark.skipif(
        not os.path.exists(CHROMIUM), reason=f"browser sandboxes need {CHROMIUM} (apt-get install chromium)"
    ),
]

ALICE, BOB = "alice-token-0001", "bob-token-00002"
MAX_BROWSERS = 4
PAGE = """<!doctype html><html><head><title>Orchard test page</title></head>
<body style="margin:0;background:#fff">
<div id="red" style="position:absolute;left:0;top:0;width:300px;height:200px;background:#f00"
     ondblclick="document.getElementById('out').textContent='double'"></div>
<div style="position:absolute;left:10px;top:220px">
  <button id="go" style="width:120px;height:40px;margin:0"
          onclick="document.getElementById('out').textContent='clicked:'+document.getElementById('name').value"
  >Press me</button>
  <input id="name" aria-label="Name">
  <p id="out">waiting</p><p id="keys">no keys</p><p id="scroll">scrollY=0</p>
  <a href="/second">Second page</a>
</div>
<div style="height:3000px"></div>
<script>
document.getElementById('name').addEventListener('keydown', e => {
  if (e.key === 'Enter') document.getElementById('keys').textContent = 'enter:' + e.target.value; });
addEventListener('scroll', () => document.getElementById('scroll').textContent = 'scrollY=' + Math.round(scrollY));
setTimeout(() => { const d = document.createElement('p'); d.id = 'late'; d.textContent = 'late arrival';
                   document.body.appendChild(d); }, 300);
</script></body></html>"""
SECOND = "<!doctype html><title>Second</title><p>the second page</p>"
FETCHER = """<!doctype html><title>Fetcher</title><p id="r">pending</p><script>
fetch('http://127.0.0.1:%d/').then(() => 'leaked', () => 'blocked').then(t => document.getElementById('r').textContent = t);
</script>"""


class Site(BaseHTTPRequestHandler):
    """The test pages; every request's path is recorded on the server."""

    def do_GET(self) -> None:
        self.server.hits.append(self.path)  # type: ignore[attr-defined]
        if self.path.startswith("/redirect-to/"):
            self.send_response(302)
            self.send_header("Location", f"http://127.0.0.1:{self.path.rsplit('/', 1)[1]}/")
            self.end_headers()
            return
        if self.path.startswith("/fetch/"):
            body = FETCHER % int(self.path.rsplit("/", 1)[1])
        else:
            body = SECOND if self.path == "/second" else PAGE
        data = body.encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


@dataclass
class Service:
    address: str
    manager: SandboxManager
    loop: asyncio.AbstractEventLoop


def serve_site() -> ThreadingHTTPServer:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Site)
    server.hits = []  # type: ignore[attr-defined]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.fixture(scope="module")
def site() -> Iterator[ThreadingHTTPServer]:
    server = serve_site()
    yield server
    server.shutdown()


@pytest.fixture(scope="module")
def other_site() -> Iterator[ThreadingHTTPServer]:
    """A second server that no test's policy admits: it must never be reached."""
    server = serve_site()
    yield server
    server.shutdown()
    assert server.hits == [], f"a blocked destination was reached: {server.hits}"  # type: ignore[attr-defined]


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    """A real env service (two tenants) on its own event loop in a thread; small browser limits to test them."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    folder = tmp_path_factory.mktemp("browser")
    tokens = folder / "tokens"
    tokens.write_text(f"alice:{ALICE}\nbob:{BOB}\n")
    settings = EnvSettings(
        port=0,
        state_dir=folder / "state",
        log_format="text",
        auth_tokens_file=tokens,
        max_browser_sandboxes=MAX_BROWSERS,
        browser_contexts_per_process=2,
    )

    async def start() -> tuple[Any, SandboxManager, int]:
        server, manager = await build(settings)
        return server, manager, await server.start()

    server, manager, port = asyncio.run_coroutine_threadsafe(start(), loop).result(30)
    yield Service(f"127.0.0.1:{port}", manager, loop)
    asyncio.run_coroutine_threadsafe(server.stop(), loop).result(60)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)
    loop.close()
    assert not chromium_main_pids(), "chromium left running"


@pytest.fixture
async def client(service: Service) -> AsyncIterator[AsyncSandboxClient]:
    async with await AsyncSandboxClient.connect(service.address, api_key=ALICE) as client:
        yield client


def pixel(png: bytes, x: int, y: int) -> tuple[int, ...]:
    """The RGB(A) of one pixel of an 8-bit RGB or RGBA, non-interlaced PNG (decoded with zlib alone)."""
    width, _, depth, color = struct.unpack(">IIBB", png[16:26])
    assert depth == 8 and color in (2, 6), (depth, color)
    channels = 3 if color == 2 else 4
    data, pos = b"", 8
    while pos < len(png):
        length, kind = struct.unpack(">I4s", png[pos : pos + 8])
        if kind == b"IDAT":
            data += png[pos + 8 : pos + 8 + length]
        pos += 12 + length
    raw, stride = zlib.decompress(data), width * channels
    rows: list[bytearray] = []
    prev = bytearray(stride)
    for row_index in range(y + 1):
        start = row_index * (stride + 1)
        kind, line = raw[start], bytearray(raw[start + 1 : start + 1 + stride])
        for i in range(stride):
            a = line[i - channels] if i >= channels else 0
            b, c = prev[i], prev[i - channels] if i >= channels else 0
            if kind == 1:
                line[i] = (line[i] + a) & 255
            elif kind == 2:
                line[i] = (line[i] + b) & 255
            elif kind == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif kind == 4:
                p = a + b - c
                pa, pb_, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb_ and pa <= pc else b if pb_ <= pc else c)) & 255
        rows.append(line)
        prev = line
    return tuple(rows[y][x * channels : (x + 1) * channels][:3])


async def eventually(check: Any, timeout: float = 5.0) -> Any:
    """Await check() until it returns something truthy."""
    deadline = time.monotonic() + timeout
    while not (result := await check()):
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.05)
    return result


async def test_drive_a_page(client: AsyncSandboxClient, site: ThreadingHTTPServer) -> None:
    """Navigate, click (selector and point), type, press keys, scroll, go back, wait, screenshot, read content."""
    port = site.server_port
    sb = await client.create_browser([f"127.0.0.1:{port}"], labels={"suite": "browser"})
    assert (sb.info.kind, sb.info.state) == ("browser", "ready")
    url = f"http://127.0.0.1:{port}/"
    nav = await sb.act("navigate", url=url)
    assert (nav.url, nav.title, nav.png) == (url, "Orchard test page", b"")

    shot = await sb.screenshot()
    assert (shot.width, shot.height, shot.url, shot.title) == (1024, 768, url, "Orchard test page")
    assert pixel(shot.png, 100, 100) == (255, 0, 0)
    assert pixel(shot.png, 600, 100) == (255, 255, 255)
    full = await sb.screenshot(full_page=True)
    assert full.width == 1024 and full.height >= 3000

    content = await sb.page_content()
    assert 'button "Press me"' in content.accessibility_tree
    assert "waiting" in content.text and "Press me" in content.text

    await sb.act("type", selector="#name", text="abc")
    await sb.act("click", selector="#go")
    assert "clicked:abc" in (await sb.page_content()).text
    await sb.act("click", selector="#name")
    await sb.act("type", text="def")  # into the focused input
    await sb.act("key_press", key="Enter")
    await sb.act("click", x=60, y=240)  # the button, by its place on screen
    text = (await sb.page_content()).text
    assert "enter:abcdef" in text and "clicked:abcdef" in text
    await sb.act("double_click", x=150, y=100)
    assert "double" in (await sb.page_content()).text

    await sb.act("scroll", delta_y=500, x=500, y=400)
    assert await eventually(lambda: _has(sb, "scrollY=500"))
    after = await sb.act("navigate", url=url + "second", screenshot=True)
    assert (after.url, after.title) == (url + "second", "Second") and after.png.startswith(b"\x89PNG")
    back = await sb.act("back")
    assert back.url == url
    await sb.act("wait", selector="#late", timeout=5)
    assert "late arrival" in (await sb.page_content()).text

    listed = [s.sandbox_id async for s in client.list_sandboxes({"suite": "browser"})]
    assert listed == [sb.sandbox_id]
    await sb.delete()
    with pytest.raises(NotFound):
        await sb.screenshot()


async def _has(sb: Any, fragment: str) -> bool:
    return fragment in (await sb.page_content()).text


async def test_egress_is_closed_unless_allowed(
    client: AsyncSandboxClient, site: ThreadingHTTPServer, other_site: ThreadingHTTPServer, service: Service
) -> None:
    """No rules: only about:/data: pages; a rule for another port does not admit this one; an admitted page
    cannot reach a blocked server by fetch or redirect; SetNetworkPolicy opens the way at once."""
    port, other = site.server_port, other_site.server_port
    closed = await client.create_browser()
    with pytest.raises(FailedPrecondition) as info:
        await closed.act("navigate", url=f"http://127.0.0.1:{port}/")
    assert f"does not admit 127.0.0.1:{port}" in info.value.message and info.value.reason == "EGRESS_DENIED"
    data = await closed.act("navigate", url="data:text/html,<title>local</title><p>inline</p>")
    assert data.title == "local"
    assert (await closed.act("navigate", url="about:blank")).url == "about:blank"

    wrong_port = await client.create_browser([f"127.0.0.1:{other + 1 if other + 1 != port else other + 2}"])
    with pytest.raises(FailedPrecondition, match=f"does not admit 127.0.0.1:{port}"):
        await wrong_port.act("navigate", url=f"http://127.0.0.1:{port}/second")

    hits = len(site.hits)  # type: ignore[attr-defined]
    allowed = await client.create_browser([f"127.0.0.1:{port}"])
    await allowed.act("navigate", url=f"http://127.0.0.1:{port}/fetch/{other}")
    assert await eventually(lambda: _has(allowed, "blocked"))
    with pytest.raises(FailedPrecondition, match=f"does not admit 127.0.0.1:{other}"):
        await allowed.act("navigate", url=f"http://127.0.0.1:{port}/redirect-to/{other}")
    assert len(site.hits) > hits  # type: ignore[attr-defined]

    async with grpc.aio.insecure_channel(service.address) as channel:
        stub = env_pb2_grpc.EnvServiceStub(channel)
        policy = pb.NetworkPolicy(allow=[pb.EgressRule(cidr="127.0.0.0/8", port=port)])
        await stub.SetNetworkPolicy(
            pb.SetNetworkPolicyRequest(sandbox_id=closed.sandbox_id, network_policy=policy),
            metadata=(("authorization", f"Bearer {ALICE}"),),
            timeout=10,
        )
    assert (await closed.act("navigate", url=f"http://127.0.0.1:{port}/second")).title == "Second"
    for sb in (closed, wrong_port, allowed):
        await sb.delete()


async def test_bad_requests_get_clear_errors(
    client: AsyncSandboxClient, site: ThreadingHTTPServer, service: Service
) -> None:
    """Bad selectors, timeouts, missing fields and unknown sandboxes get precise errors; the sandbox still works."""
    sb = await client.create_browser([f"127.0.0.1:{site.server_port}"])
    await sb.act("navigate", url=f"http://127.0.0.1:{site.server_port}/")
    started = time.monotonic()
    with pytest.raises(DeadlineExceeded) as timeout:
        await sb.act("click", selector="#nope", timeout=1)
    assert "no element matches selector '#nope' within 1.0 s" in timeout.value.message
    assert time.monotonic() - started < 30  # its 1 s timeout, not the default's 30 s or a hang
    cases: list[tuple[dict[str, Any], str]] = [
        ({"action": "click", "selector": "##"}, "selector"),
        ({"action": "click"}, "selector"),
        ({"action": "type", "selector": "#name"}, "text"),
        ({"action": "key_press", "key": "NoSuchKey"}, "key"),
        ({"action": "navigate", "url": "file:///etc/passwd"}, "url"),
        ({"action": "navigate"}, "url"),
        ({"action": "scroll"}, "delta_y"),
        ({"action": "wait"}, "selector"),
    ]
    for kwargs, field in cases:
        with pytest.raises(InvalidArgument) as info:
            await sb.act(**kwargs)
        assert info.value.field == field, (kwargs, info.value)
    with pytest.raises(ValueError, match="not one of"):
        await sb.act("hover")
    async with grpc.aio.insecure_channel(service.address) as channel:
        stub = env_pb2_grpc.EnvServiceStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as raw:
            await stub.Act(
                pb.ActRequest(sandbox_id=sb.sandbox_id), metadata=(("authorization", f"Bearer {ALICE}"),), timeout=10
            )
        assert raw.value.code() is grpc.StatusCode.INVALID_ARGUMENT and "action is required" in raw.value.details()
    with pytest.raises(NotFound, match="sb-nope"):
        await client.get_sandbox("sb-nope")
    with pytest.raises(NotFound, match="sb-nope"):
        await (await _handle(client, "sb-nope")).act("back")
    assert (await sb.screenshot()).width == 1024  # still serving


async def _handle(client: AsyncSandboxClient, sandbox_id: str) -> Any:
    """An AsyncSandbox handle on an id that may not exist."""
    from orchard.sdk.results import SandboxInfo
    from orchard.sdk.sandbox import AsyncSandbox

    return AsyncSandbox(client, SandboxInfo(sandbox_id=sandbox_id, image="", state="ready", workdir=""))


@needs_sandboxes
async def test_wrong_kind(client: AsyncSandboxClient) -> None:
    """Browser calls on a container sandbox, and container calls on a browser sandbox, say what is needed."""
    container = await client.create_sandbox("host")
    browser = await client.create_browser()
    with pytest.raises(
        FailedPrecondition, match="container sandbox; Screenshot, Act and GetPageContent need a browser sandbox"
    ):
        await container.screenshot()
    with pytest.raises(FailedPrecondition, match="browser sandbox"):
        await container.act("back")
    for call in (browser.exec("true"), browser.upload_content("x", "f"), browser.list_files(), browser.snapshot()):
        with pytest.raises(FailedPrecondition, match="is a browser sandbox .* need a container sandbox"):
            await call
    assert (await container.exec("echo ok")).stdout == "ok\n"


async def test_ids_tenants_and_limits(client: AsyncSandboxClient, service: Service) -> None:
    """Caller-chosen ids, another tenant sees nothing, and max_browser_sandboxes holds across several processes."""
    mine = await client.create_browser(sandbox_id="web-1", labels={"who": "alice"})
    assert mine.sandbox_id == "web-1"
    async with await AsyncSandboxClient.connect(service.address, api_key=BOB) as bob:
        assert [s async for s in bob.list_sandboxes()] == []
        with pytest.raises(NotFound):
            await bob.get_sandbox("web-1")
        with pytest.raises(NotFound):
            await (await _handle(bob, "web-1")).screenshot()
    more = [await client.create_browser() for _ in range(MAX_BROWSERS - 1)]
    assert service.manager.browsers.processes == 2  # two contexts per process here
    async with grpc.aio.insecure_channel(service.address) as channel:  # raw: the SDK would retry after RetryInfo
        stub = env_pb2_grpc.EnvServiceStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.CreateSandbox(
                pb.CreateSandboxRequest(kind=pb.SANDBOX_KIND_BROWSER),
                metadata=(("authorization", f"Bearer {ALICE}"),),
                timeout=10,
            )
    assert info.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "max_browser_sandboxes" in (info.value.details() or "")
    for sb in [mine, *more]:
        await sb.delete()
    assert (await (await client.create_browser()).screenshot()).height == 768


def chromium_main_pids() -> list[int]:
    """This process's live Chromium browser processes (not their renderers and helpers)."""
    pids = []
    for proc in psutil.Process().children(recursive=True):
        try:
            if "chrom" in proc.name() and not any(a.startswith("--type=") for a in proc.cmdline()):
                pids.append(proc.pid)
        except psutil.Error:  # gone, or a zombie not yet reaped
            continue
    return pids


async def test_browser_crash_fails_its_sandboxes(client: AsyncSandboxClient, site: ThreadingHTTPServer) -> None:
    """Killing Chromium fails every sandbox on it with the reason, promptly; a new sandbox gets a new process."""
    victims = [await client.create_browser([f"127.0.0.1:{site.server_port}"]) for _ in range(2)]
    pids = chromium_main_pids()
    assert pids
    killed = 0
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
            killed += 1
        except ProcessLookupError:  # a helper (crashpad's handler) that left with the browser killed before it
            continue
    assert killed

    async def failed() -> bool:
        return all([(await sb.refresh()).state == "failed" for sb in victims])

    await eventually(failed)
    assert "browser process exited unexpectedly" in victims[0].info.failure_reason
    started = time.monotonic()
    with pytest.raises(FailedPrecondition, match="browser process exited unexpectedly"):
        await victims[0].act("navigate", url="about:blank")
    assert time.monotonic() - started < 10  # refused at once, not after a navigation timeout
    fresh = await client.create_browser([f"127.0.0.1:{site.server_port}"])
    assert (await fresh.act("navigate", url=f"http://127.0.0.1:{site.server_port}/second")).title == "Second"
    for sb in victims:
        await sb.delete()


def test_pixel_decoder_reads_a_known_png() -> None:
    """The test's own PNG decoder against a PNG built by hand (a 2x2 image)."""
    rows = b"\x00" + bytes([255, 0, 0, 0, 255, 0]) + b"\x02" + bytes([0, 0, 255, 0, 0, 0])
    ihdr = struct.pack(">IIBBBBB", 2, 2, 8, 2, 0, 0, 0)

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    png = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")
    assert (pixel(png, 0, 0), pixel(png, 1, 0), pixel(png, 0, 1), pixel(png, 1, 1)) == (
        (255, 0, 0),
        (0, 255, 0),
        (255, 0, 255),
        (0, 255, 0),
    )  # row 2 is filtered "up": added to row 1


async def test_page_crash_fails_only_its_sandbox(client: AsyncSandboxClient, service: Service) -> None:
    """A crashed page (chrome://crash, which agents cannot navigate to, so it is opened from the service's side)
    fails its sandbox with the reason; a neighbour on the same process carries on."""
    victim, neighbour = await client.create_browser(), await client.create_browser()
    session = next(sb for sb in service.manager.sandboxes.values() if sb.sandbox_id == victim.sandbox_id).browser
    assert session is not None

    async def crash() -> None:
        with contextlib.suppress(Exception):  # the crash itself fails the navigation
            await session.page.goto("chrome://crash", timeout=5000)

    await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(crash(), service.loop))
    await eventually(lambda: _state_is(victim, "failed"))
    assert "the page crashed" in victim.info.failure_reason
    with pytest.raises(FailedPrecondition, match="the page crashed"):
        await victim.page_content()
    assert (await neighbour.act("navigate", url="data:text/html,<title>fine</title>")).title == "fine"


async def _state_is(sb: Any, state: str) -> bool:
    return (await sb.refresh()).state == state
