"""Browser sandboxes: BrowserPool runs headless Chromium processes through Playwright (async) and gives each
browser sandbox a BrowserSession: its own context (cookies, storage, cache) and page, behind its own egress
proxy, sharing a process with up to `browser_contexts_per_process` others. The manager owns ids, leases and
limits; this module owns the processes, contexts and what is done on the page."""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

from playwright.async_api import (
    Browser,
    BrowserContext,
    Page,
    Playwright,
    async_playwright,
)
from playwright.async_api import Error as PlaywrightError
from playwright.async_api import TimeoutError as PlaywrightTimeoutError

from orchard.errors import (
    DeadlineExceeded,
    FailedPrecondition,
    InvalidArgument,
    ResourceExhausted,
    Unavailable,
)
from orchard.services.env.backends.base import EgressRule
from orchard.services.env.browser_actions import Action, ActionKind, png_size
from orchard.services.env.browser_policy import admits, needs_addresses, url_target
from orchard.services.env.browser_proxy import EgressProxy, blocked_message
from orchard.services.env.settings import EnvSettings

log = logging.getLogger(__name__)

T = TypeVar("T")

CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
    "--disable-breakpad",
    "--disable-domain-reliability",
    "--disable-client-side-phishing-detection",
    "--no-pings",
    "--dns-prefetch-disable",
    # Containers give /dev/shm 64 MiB; renderers then run out of it. /tmp holds their shared memory instead.
    "--disable-dev-shm-usage",
    # Egress goes through each context's proxy; these keep Chromium from reaching out any other way.
    "--disable-features=DnsOverHttps,NetworkPrediction,MediaRouter,OptimizationHints,Translate,AutofillServerCommunication",
    "--force-webrtc-ip-handling-policy=disable_non_proxied_udp",
    "--webrtc-ip-handling-policy=disable_non_proxied_udp",
]
BROWSER_EXITED = (
    "the browser process exited unexpectedly (crashed or was killed); delete this sandbox and create a new one"
)
PAGE_CRASHED = "the page crashed, likely out of memory; delete this sandbox and create a new one"
CLOSE_TIMEOUT_S = 10.0
SELECTOR_SYNTAX = re.compile(
    r"while parsing|not a valid (selector|XPath)|Unknown engine|Unexpected token|"
    r"SyntaxError",
    re.IGNORECASE,
)
SETTLE_JS = "() => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))"
TEXT_JS = "() => document.body ? document.body.innerText : ''"


@dataclass(eq=False)
class BrowserProcess:
    """One Chromium process and the sessions (contexts) on it."""

    browser: Browser
    sessions: set[BrowserSession] = field(default_factory=set)
    reserved: int = 0
    """Sessions being opened on it."""


@dataclass(eq=False)
class BrowserSession:
    """One browser sandbox: a context and its page, its egress proxy, and an order for its actions."""

    sandbox_id: str
    process: BrowserProcess
    context: BrowserContext
    page: Page
    proxy: EgressProxy
    settings: EnvSettings
    order: asyncio.Lock = field(default_factory=asyncio.Lock)
    """Held by each action, so one sandbox's actions run one at a time, in order."""
    failed: asyncio.Event = field(default_factory=asyncio.Event)
    failure_reason: str = ""

    def fail(self, reason: str) -> None:
        if not self.failed.is_set():
            self.failure_reason = reason
            self.failed.set()

    # ---- what the RPCs do ----

    async def screenshot(self, full_page: bool) -> tuple[bytes, int, int, str, str]:
        """(png, width, height, url, title) of the viewport, or of the whole page."""
        async with self.order:
            timeout_s = self.settings.browser_action_timeout_s
            png = await self._run(
                self.page.screenshot(full_page=full_page, timeout=timeout_s * 1000), "screenshot", timeout_s
            )
            width, height = png_size(png)
            return png, width, height, self.page.url, await self._run(self.page.title(), "screenshot", timeout_s)

    async def act(self, action: Action) -> tuple[str, str, bytes]:
        """Perform a checked action (browser_actions.check_action); returns (url, title, png or b"")."""
        async with self.order:
            await self._run(self._perform(action), action.describe(), action.timeout_s, action)
            png = b""
            if action.screenshot:
                png = await self._run(
                    self.page.screenshot(timeout=action.timeout_s * 1000), "screenshot", action.timeout_s
                )
            return self.page.url, await self._run(self.page.title(), "title", action.timeout_s), png

    async def content(self) -> tuple[str, str, str, str]:
        """(url, title, accessibility tree as indented text, visible text)."""
        async with self.order:
            timeout_s = self.settings.browser_action_timeout_s
            tree = await self._run(
                self.page.locator("body").aria_snapshot(timeout=timeout_s * 1000), "reading the page", timeout_s
            )
            text = await self._run(self.page.evaluate(TEXT_JS), "reading the page", timeout_s)
            return self.page.url, await self._run(self.page.title(), "title", timeout_s), tree, str(text)

    async def _perform(self, a: Action) -> None:
        page, ms = self.page, a.timeout_s * 1000
        match a.kind:
            case ActionKind.CLICK if a.selector:
                await page.click(a.selector, timeout=ms)
            case ActionKind.CLICK:
                await page.mouse.click(a.x, a.y)
            case ActionKind.DOUBLE_CLICK if a.selector:
                await page.dblclick(a.selector, timeout=ms)
            case ActionKind.DOUBLE_CLICK:
                await page.mouse.dblclick(a.x, a.y)
            case ActionKind.TYPE if a.selector:
                await page.locator(a.selector).press_sequentially(a.text, timeout=ms)
            case ActionKind.TYPE:
                await page.keyboard.type(a.text)
            case ActionKind.KEY_PRESS if a.selector:
                await page.press(a.selector, a.key, timeout=ms)
            case ActionKind.KEY_PRESS:
                await page.keyboard.press(a.key)
            case ActionKind.SCROLL:
                if a.has_point:
                    await page.mouse.move(a.x, a.y)
                await page.mouse.wheel(a.delta_x, a.delta_y)
                await page.evaluate(SETTLE_JS)  # the wheel scrolls asynchronously: let two frames pass
            case ActionKind.NAVIGATE:
                await self._navigate(a.url, ms)
            case ActionKind.BACK:
                await page.go_back(timeout=ms)
            case ActionKind.WAIT if a.selector:
                await page.wait_for_selector(a.selector, state="visible", timeout=ms)
            case ActionKind.WAIT:
                await asyncio.sleep(a.timeout_s)

    async def _navigate(self, url: str, ms: float) -> None:
        target = url_target(url)
        rules = self.proxy.rules()
        # A name that only a CIDR rule might admit is left to the proxy, which resolves it.
        if target is not None and not admits(rules, target) and not needs_addresses(rules, target):
            raise FailedPrecondition(blocked_message(self.sandbox_id, target), field="url", reason="EGRESS_DENIED")
        started = time.monotonic()
        try:
            response = await self.page.goto(url, timeout=ms)
        except PlaywrightError as err:
            if isinstance(err, PlaywrightTimeoutError) or self.failed.is_set() or self.page.is_closed():
                raise
            blocked = self.proxy.blocked_since(started)
            if blocked is not None:  # e.g. a redirect to a destination the policy does not admit
                raise FailedPrecondition(
                    blocked_message(self.sandbox_id, blocked), field="url", reason="EGRESS_DENIED"
                ) from None
            raise FailedPrecondition(
                f"could not load {url!r}: {_first_line(err)}", field="url", reason="NAVIGATION_FAILED"
            ) from None
        if response is not None and response.status == 403:
            blocked = self.proxy.blocked_since(started)
            if blocked is not None and blocked == url_target(response.url):  # the proxy refused the page itself
                raise FailedPrecondition(blocked_message(self.sandbox_id, blocked), field="url", reason="EGRESS_DENIED")

    async def _run(self, work: Awaitable[T], what: str, timeout_s: float, action: Action | None = None) -> T:
        """Await work, but give up at once if the sandbox fails meanwhile (never hang on a dead browser), and
        turn Playwright's errors into OrchardErrors."""
        task = asyncio.ensure_future(work)
        failed = asyncio.ensure_future(self.failed.wait())
        try:
            # The action's own timeout fires first; this one only guards against a browser that stopped answering.
            async with asyncio.timeout(timeout_s + 15.0):
                await asyncio.wait({task, failed}, return_when=asyncio.FIRST_COMPLETED)
        except TimeoutError:
            raise DeadlineExceeded(
                f"{what} did not finish within {timeout_s:g} s: the browser stopped answering; "
                "delete this sandbox and create a new one"
            ) from None
        finally:
            failed.cancel()
            if not task.done():
                task.cancel()
        if not task.done() or task.cancelled():
            raise self._failure()
        err = task.exception()
        if err is None:
            return task.result()
        if isinstance(err, PlaywrightError):
            raise await self._translate(err, what, timeout_s, action) from None
        raise err

    def _failure(self) -> FailedPrecondition:
        return FailedPrecondition(
            f"sandbox {self.sandbox_id!r} is failed: {self.failure_reason}", reason="BROWSER_FAILED"
        )

    async def _translate(self, err: PlaywrightError, what: str, timeout_s: float, action: Action | None) -> Exception:
        if self.failed.is_set():
            return self._failure()
        if self.page.is_closed() or not self.process.browser.is_connected():
            try:  # the crash or disconnect event may arrive just after the call's own error
                async with asyncio.timeout(2.0):
                    await self.failed.wait()
            except TimeoutError:
                self.fail(BROWSER_EXITED if not self.process.browser.is_connected() else PAGE_CRASHED)
            return self._failure()
        message = _first_line(err)
        selector = action.selector if action else ""
        if isinstance(err, PlaywrightTimeoutError):
            if selector:
                if await self._count(selector) == 0:
                    return DeadlineExceeded(
                        f"{what}: no element matches selector {selector!r} within {timeout_s:.1f} s", field="selector"
                    )
                return DeadlineExceeded(
                    f"{what}: an element matches selector {selector!r}, but it was not "
                    f"visible, enabled and stable within {timeout_s:.1f} s",
                    field="selector",
                )
            return DeadlineExceeded(f"{what} did not finish within {timeout_s:.1f} s ({message})", field="timeout")
        if selector and SELECTOR_SYNTAX.search(message):
            return InvalidArgument(f"selector {selector!r} is not a valid selector: {message}", field="selector")
        if "strict mode violation" in message:
            return InvalidArgument(
                f"selector {selector!r} matches more than one element; make it match one "
                f"(e.g. append ' >> nth=0'): {message}",
                field="selector",
            )
        if "Unknown key" in message:
            return InvalidArgument(
                f"{message}; use a key name such as 'Enter', 'ArrowDown', 'a' or 'Control+A'", field="key"
            )
        return FailedPrecondition(f"{what} failed: {message}")

    async def _count(self, selector: str) -> int:
        try:
            async with asyncio.timeout(2.0):
                return await self.page.locator(selector).count()
        except (PlaywrightError, TimeoutError):
            return 0

    async def close(self) -> None:
        await _close_context(self.context)
        await self.proxy.close()


async def _close_context(context: BrowserContext) -> None:
    try:
        async with asyncio.timeout(CLOSE_TIMEOUT_S):
            await context.close()
    except (PlaywrightError, TimeoutError):
        pass  # its process is gone or hung; closing the process takes it along


def _first_line(err: PlaywrightError) -> str:
    """Playwright's message without its call log or "Page.click: " prefix."""
    line = err.message.split("\n", 1)[0]
    return re.sub(r"^[A-Za-z]+\.[A-Za-z]+: ", "", line)


class BrowserPool:
    """Chromium processes, launched when first needed, and the sessions on them."""

    def __init__(self, settings: EnvSettings, on_failure: Callable[[str, str], None]) -> None:
        self.settings = settings
        self._on_failure = on_failure
        """Called with (sandbox_id, reason) when a session's page crashes or its process dies."""
        self._playwright: Playwright | None = None
        self._processes: list[BrowserProcess] = []
        self._sessions: dict[str, BrowserSession] = {}
        self._opening = 0
        self._launching = asyncio.Lock()
        self._closing = False

    @property
    def processes(self) -> int:
        return len(self._processes)

    async def open(self, sandbox_id: str, rules: Callable[[], tuple[EgressRule, ...]]) -> BrowserSession:
        """A new context and page for sandbox_id, behind a proxy that admits what rules() allows."""
        s = self.settings
        if self._closing:
            raise Unavailable("the env service is stopping; browser sandboxes cannot be created now")
        if len(self._sessions) + self._opening >= s.max_browser_sandboxes:
            raise ResourceExhausted(
                f"the service already runs {s.max_browser_sandboxes} browser sandboxes (its "
                "limit, max_browser_sandboxes); delete some or retry later",
                retry_after=5.0,
            )
        self._opening += 1
        try:
            async with self._launching:
                process = next(
                    (p for p in self._processes if len(p.sessions) + p.reserved < s.browser_contexts_per_process), None
                )
                if process is None:
                    process = await self._launch()
                process.reserved += 1
            try:
                session = await self._new_session(sandbox_id, process, rules)
            finally:
                process.reserved -= 1
        finally:
            self._opening -= 1
        process.sessions.add(session)
        self._sessions[sandbox_id] = session
        session.page.on("crash", lambda _: self._fail(session, PAGE_CRASHED))
        return session

    async def _new_session(
        self, sandbox_id: str, process: BrowserProcess, rules: Callable[[], tuple[EgressRule, ...]]
    ) -> BrowserSession:
        s = self.settings
        proxy = EgressProxy(sandbox_id, rules)
        port = await proxy.start()
        context: BrowserContext | None = None
        try:
            # "<-loopback>" sends 127.0.0.1 and localhost through the proxy too (Chromium skips them by default).
            context = await process.browser.new_context(
                viewport={"width": s.browser_viewport_width, "height": s.browser_viewport_height},
                proxy={"server": f"http://127.0.0.1:{port}", "bypass": "<-loopback>"},
                service_workers="block",
                accept_downloads=False,
            )
            context.set_default_timeout(s.browser_action_timeout_s * 1000)
            page = await context.new_page()
        except BaseException as err:
            if context is not None:
                await _close_context(context)
            await proxy.close()
            if isinstance(err, PlaywrightError):
                raise Unavailable(
                    f"the browser could not open a page for sandbox {sandbox_id!r} ({_first_line(err)}); retry"
                ) from None
            raise
        return BrowserSession(sandbox_id, process, context, page, proxy, s)

    async def _launch(self) -> BrowserProcess:
        s = self.settings
        try:
            if self._playwright is None:
                self._playwright = await async_playwright().start()
            browser = await self._playwright.chromium.launch(
                executable_path=s.browser_path,
                args=CHROMIUM_ARGS,
                headless=True,
                timeout=s.browser_launch_timeout_s * 1000,
            )
        except PlaywrightError as err:
            raise FailedPrecondition(
                f"cannot start the browser {s.browser_path!r} ({_first_line(err)}); install "
                "Chromium (apt-get install chromium) or set ORCHARD_ENV_BROWSER_PATH"
            ) from None
        process = BrowserProcess(browser)
        self._processes.append(process)
        browser.on("disconnected", lambda _: self._process_gone(process))
        log.info("browser process started", extra={"processes": len(self._processes)})
        return process

    def _process_gone(self, process: BrowserProcess) -> None:
        if process not in self._processes or self._closing:
            return  # closed on purpose: an idle extra process, or the service stopping
        self._processes.remove(process)
        for session in list(process.sessions):
            self._fail(session, BROWSER_EXITED)
        log.warning("browser process exited", extra={"sessions": len(process.sessions)})

    def _fail(self, session: BrowserSession, reason: str) -> None:
        if session.failed.is_set() or self._closing:
            return
        session.fail(reason)
        self._on_failure(session.sandbox_id, reason)

    async def close_session(self, sandbox_id: str) -> None:
        """Close a sandbox's context and proxy; a process left without contexts closes unless it is the last."""
        session = self._sessions.pop(sandbox_id, None)
        if session is None:
            return
        session.fail("the sandbox was deleted")
        process = session.process
        process.sessions.discard(session)
        await session.close()
        if not process.sessions and not process.reserved and process in self._processes and len(self._processes) > 1:
            self._processes.remove(process)
            await _close_browser(process.browser)

    async def close(self) -> None:
        """Close every session and process, then Playwright."""
        self._closing = True
        await asyncio.gather(*(self.close_session(sid) for sid in list(self._sessions)), return_exceptions=True)
        await asyncio.gather(*(_close_browser(p.browser) for p in self._processes), return_exceptions=True)
        self._processes.clear()
        if self._playwright is not None:
            try:
                async with asyncio.timeout(CLOSE_TIMEOUT_S):
                    await self._playwright.stop()
            except (PlaywrightError, TimeoutError):
                log.warning("playwright did not stop cleanly")
            self._playwright = None


async def _close_browser(browser: Browser) -> None:
    try:
        async with asyncio.timeout(CLOSE_TIMEOUT_S):
            await browser.close()
    except (PlaywrightError, TimeoutError):
        log.warning("a browser process did not close cleanly")
