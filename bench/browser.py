"""Orchard Env browser sandboxes: create → first screenshot, action and GetPageContent latency, screenshots/s
(one sandbox, and K at once) and memory per sandbox, through the SDK, each against the same Playwright calls
on a browser this process launches itself (the baseline, alternated in the same run). Starts its own env
service (`orchard serve env`) and a page server on 127.0.0.1; prints one JSON (progress on stderr).

    python bench/browser.py [--creates 10] [--actions 30] [--screenshots 40] [--concurrent 4]
                            [--memory-sandboxes 8] [--verify-sandboxes 24] [--contexts-per-process 16]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import signal
import statistics
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TypeVar

import psutil
from env_service import env_service
from playwright.async_api import (
    Browser,
    BrowserContext,
    Page,
    Playwright,
    ViewportSize,
    async_playwright,
)

from orchard import AsyncSandboxClient
from orchard.sdk import AsyncSandbox
from orchard.services.env.browser import CHROMIUM_ARGS, SETTLE_JS, TEXT_JS
from orchard.services.env.settings import EnvSettings

T = TypeVar("T")

CHROMIUM = EnvSettings.model_fields["browser_path"].default
VIEWPORT: ViewportSize = {"width": 1024, "height": 768}  # the service's default viewport
MIB = 1 << 20
BUDGET_MIB = 8192
PNG = b"\x89PNG\r\n\x1a\n"
ACTIONS = ["navigate", "type", "key_press", "click", "scroll", "content"]
"""One round, in this order: load the page, type into the input, delete a character, press the button, scroll
down, read the page (GetPageContent). Navigating first resets the page, so every round does the same work."""
TEXT = "orchard"
PAGE = b"""<!doctype html><html><head><title>Orchard bench page</title></head>
<body style="margin:0;font:16px sans-serif">
<input id="name" placeholder="name">
<button id="btn" onclick="document.getElementById('out').textContent='clicked:'+document.getElementById('name').value"
  >Press me</button>
<p id="out"></p>
<div style="height:3000px;background:linear-gradient(#fff,#9cf)"></div>
<p id="bottom">bottom</p>
</body></html>"""


class PageHandler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(PAGE)))
        self.end_headers()
        self.wfile.write(PAGE)

    def log_message(self, format: str, *args: object) -> None:
        pass


@contextlib.contextmanager
def page_server() -> Iterator[int]:
    """Yield the port of a page server on 127.0.0.1 (a thread of this process), stopped after."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), PageHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_port
    finally:
        server.shutdown()
        server.server_close()


def progress(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def summary_ms(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {
        "p50_ms": round(statistics.median(values) * 1e3, 1),
        "p90_ms": round(ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))] * 1e3, 1),
        "n": len(values),
    }


def ratio(a: float, b: float) -> float:
    return round(a / b, 2)


async def timed(work: Awaitable[object]) -> float:
    start = time.perf_counter()
    await work
    return time.perf_counter() - start


# ---- what a round does, through the SDK and directly ----


async def sdk_action(sb: AsyncSandbox, name: str, url: str) -> None:
    match name:
        case "navigate":
            await sb.act("navigate", url=url)
        case "type":
            await sb.act("type", selector="#name", text=TEXT)
        case "key_press":
            await sb.act("key_press", key="Backspace")
        case "click":
            await sb.act("click", selector="#btn")
        case "scroll":
            await sb.act("scroll", delta_y=500)
        case "content":
            await sb.page_content()


async def direct_action(page: Page, name: str, url: str) -> None:
    """What the service's BrowserSession does for the same action (services/env/browser.py), less the title it
    also reads after each Act (GetPageContent's is included)."""
    match name:
        case "navigate":
            await page.goto(url)
        case "type":
            await page.locator("#name").press_sequentially(TEXT)
        case "key_press":
            await page.keyboard.press("Backspace")
        case "click":
            await page.click("#btn")
        case "scroll":
            await page.mouse.wheel(0, 500)
            await page.evaluate(SETTLE_JS)
        case "content":
            await page.locator("body").aria_snapshot()
            await page.evaluate(TEXT_JS)
            await page.title()


async def sdk_open(client: AsyncSandboxClient, allow: list[str], url: str) -> tuple[AsyncSandbox, float]:
    """A browser sandbox on the page, and the time from create to its first screenshot."""
    start = time.perf_counter()
    sb = await client.create_browser(allow)
    await sb.act("navigate", url=url)
    shot = await sb.screenshot()
    elapsed = time.perf_counter() - start
    assert shot.png.startswith(PNG) and (shot.width, shot.height) == (1024, 768), shot
    return sb, elapsed


async def direct_open(browser: Browser, url: str) -> tuple[BrowserContext, Page, float]:
    start = time.perf_counter()
    context = await browser.new_context(viewport=VIEWPORT)
    page = await context.new_page()
    await page.goto(url)
    png = await page.screenshot()
    elapsed = time.perf_counter() - start
    assert png.startswith(PNG)
    return context, page, elapsed


async def launch(pw: Playwright) -> Browser:
    return await pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)


# ---- phases ----


async def creates(
    client: AsyncSandboxClient, browser: Browser, allow: list[str], url: str, n: int
) -> dict[str, object]:
    """n - 1 warm creates → first screenshot, alternated with the direct new context + goto + screenshot."""
    sdk, direct, deletes = [], [], []
    for i in range(n - 1):
        progress(f"create → first screenshot {i + 2}/{n}")
        sb, elapsed = await sdk_open(client, allow, url)
        sdk.append(elapsed)
        deletes.append(await timed(sb.delete()))
        context, _, elapsed = await direct_open(browser, url)
        direct.append(elapsed)
        await context.close()
    s, d = summary_ms(sdk), summary_ms(direct)
    return {
        "create_to_first_screenshot": s,
        "baseline_direct_new_context_to_first_screenshot": d,
        "create_p50_ratio_to_baseline": ratio(s["p50_ms"], d["p50_ms"]),
        "delete": summary_ms(deletes),
    }


async def actions(sb: AsyncSandbox, page: Page, url: str, rounds: int) -> dict[str, object]:
    """Each action through the SDK, then the same directly, `rounds` times after two warm-up rounds."""
    sdk: dict[str, list[float]] = {name: [] for name in ACTIONS}
    direct: dict[str, list[float]] = {name: [] for name in ACTIONS}
    for i in range(rounds + 2):
        if i % 10 == 0:
            progress(f"actions: round {i + 1}/{rounds + 2}")
        for name in ACTIONS:
            a = await timed(sdk_action(sb, name, url))
            b = await timed(direct_action(page, name, url))
            if i >= 2:
                sdk[name].append(a)
                direct[name].append(b)
    # Both pages did the same: typed, deleted a character and pressed the button.
    seen = await sb.page_content()
    assert f"clicked:{TEXT[:-1]}" in seen.text and 'button "Press me"' in seen.accessibility_tree, seen
    assert await page.text_content("#out") == f"clicked:{TEXT[:-1]}"
    out: dict[str, object] = {}
    for name in ACTIONS:
        s, d = summary_ms(sdk[name]), summary_ms(direct[name])
        out["get_page_content" if name == "content" else name] = {
            "sdk": s,
            "baseline_direct": d,
            "p50_ratio": ratio(s["p50_ms"], d["p50_ms"]),
        }
    return out


async def rate(targets: list[T], shoot: Callable[[T], Awaitable[object]], n: int) -> float:
    """Screenshots per second, each target shooting n in a row, all targets at once."""

    async def one(target: T) -> None:
        for _ in range(n):
            await shoot(target)

    start = time.perf_counter()
    await asyncio.gather(*(one(t) for t in targets))
    return round(len(targets) * n / (time.perf_counter() - start), 1)


async def screenshots(
    client: AsyncSandboxClient,
    sb: AsyncSandbox,
    browser: Browser,
    page: Page,
    allow: list[str],
    url: str,
    n: int,
    k: int,
) -> dict[str, object]:
    """Screenshots/s of one sandbox in a row and of k sandboxes at once, against direct page.screenshot()."""
    progress(f"screenshots: one sandbox, {n} in a row (and the same directly)")
    await rate([sb], AsyncSandbox.screenshot, 3)  # warm-up
    await rate([page], Page.screenshot, 3)
    one_sdk = await rate([sb], AsyncSandbox.screenshot, n)
    one_direct = await rate([page], Page.screenshot, n)
    progress(f"screenshots: {k} sandboxes at once, {n} each (and {k} direct pages)")
    opened = [sb for sb, _ in await asyncio.gather(*(sdk_open(client, allow, url) for _ in range(k)))]
    direct = await asyncio.gather(*(direct_open(browser, url) for _ in range(k)))
    k_sdk = await rate(opened, AsyncSandbox.screenshot, n)
    k_direct = await rate([p for _, p, _ in direct], Page.screenshot, n)
    await asyncio.gather(*(s.delete() for s in opened), *(c.close() for c, _, _ in direct))
    return {
        "one_sandbox": {
            "sdk_per_s": one_sdk,
            "baseline_direct_per_s": one_direct,
            "ratio_to_baseline": ratio(one_sdk, one_direct),
            "n": n,
        },
        "concurrent": {
            "sandboxes": k,
            "sdk_per_s": k_sdk,
            "baseline_direct_per_s": k_direct,
            "ratio_to_baseline": ratio(k_sdk, k_direct),
            "n_each": n,
        },
    }


# ---- memory ----


def pss_mib(procs: list[psutil.Process]) -> dict[str, float]:
    """PSS of procs in MiB by kind: Chromium's processes, the Playwright driver (node) and the rest (the
    service's own Python process)."""
    out = {
        "total_mib": 0.0,
        "service_process_mib": 0.0,
        "driver_mib": 0.0,
        "chromium_mib": 0.0,
        "chromium_processes": 0,
    }
    for proc in procs:
        try:
            name, pss = proc.name(), proc.memory_full_info().pss / MIB
        except psutil.NoSuchProcess:  # a renderer of a context that just closed
            continue
        kind = "chromium" if name.startswith("chrom") else "driver" if name.startswith("node") else "service_process"
        out[f"{kind}_mib"] += pss
        out["total_mib"] += pss
        out["chromium_processes"] += kind == "chromium"
    return {key: round(value, 1) for key, value in out.items()}


async def measure(root: psutil.Process, n: int) -> dict[str, float]:
    """Memory of root and its descendants with n sandboxes (contexts) open, once the pages have settled."""
    await asyncio.sleep(0.5)
    return {"sandboxes": n, **await asyncio.to_thread(lambda: pss_mib([root, *root.children(recursive=True)]))}


def fit(rows: list[dict[str, float]]) -> tuple[float, float]:
    """(MiB per sandbox, MiB at 0 by the line): least squares of total memory over the rows (one process)."""
    slope, intercept = statistics.linear_regression([r["sandboxes"] for r in rows], [r["total_mib"] for r in rows])
    return slope, intercept


async def service_memory(
    client: AsyncSandboxClient, service: psutil.Process, allow: list[str], url: str, m: int, verify: int
) -> list[dict[str, float]]:
    """The env service's memory with 0..m browser sandboxes open, and with `verify` when more than m."""
    rows = [await measure(service, 0)]
    opened = []
    for i in range(1, max(m, verify) + 1):
        if i <= m or i % 4 == 0:
            progress(f"memory: {i} browser sandboxes")
        opened.append((await sdk_open(client, allow, url))[0])
        if i <= m or i == verify:
            rows.append(await measure(service, i))
    await asyncio.gather(*(sb.delete() for sb in opened))
    return rows


async def direct_memory(url: str, m: int) -> list[dict[str, float]]:
    """The baseline: a browser this process launches, with 0..m contexts each on the page."""
    me = psutil.Process()
    async with async_playwright() as pw:
        browser = await launch(pw)
        # The Playwright driver is this process's only node child (the env service is a Python one).
        (driver,) = [c for c in me.children() if c.name().startswith("node")]
        rows = [await measure(driver, 0)]
        for i in range(1, m + 1):
            await direct_open(browser, url)
            rows.append(await measure(driver, i))
        await browser.close()
    return rows


def memory_report(
    rows: list[dict[str, float]], direct: list[dict[str, float]], m: int, verify: int, per_process: int
) -> dict[str, object]:
    """Marginal MiB per sandbox (a line through 1..m), against the direct browser's per context, and how many
    sandboxes 8 GiB holds by that line plus one more Chromium process every per_process sandboxes."""
    slope, intercept = fit(rows[1 : m + 1])
    direct_slope, direct_intercept = fit(direct[1:])
    process_mib = direct[0]["chromium_mib"]  # a freshly launched Chromium (same flags) with no context

    def predict(n: int) -> float:
        return intercept + slope * n + (math.ceil(n / per_process) - 1) * process_mib

    out: dict[str, object] = {
        "metric": "PSS in MiB of the env service process, its Playwright driver and every Chromium process",
        "by_count": rows,
        "marginal_mib_per_sandbox": round(slope, 1),
        "marginal_two_point_mib": round((rows[m]["total_mib"] - rows[1]["total_mib"]) / (m - 1), 1),
        "fixed_mib": round(intercept, 1),
        "baseline_direct": {
            "by_count": direct,
            "marginal_mib_per_context": round(direct_slope, 1),
            "fixed_mib": round(direct_intercept, 1),
        },
        "marginal_ratio_to_baseline": ratio(slope, direct_slope),
        "extra_chromium_process_mib": process_mib,
        "fits_in_8_gib": next(n for n in range(1 << 20) if predict(n + 1) > BUDGET_MIB),
        "fits_in_8_gib_note": (
            f"extrapolation from {m} sandboxes, not measured: 8 GiB of PSS over the "
            f"least-squares line through 1..{m} open sandboxes (fixed + marginal per sandbox), "
            "plus one more Chromium process (a fresh one's PSS with no context) every "
            f"{per_process} sandboxes (browser_contexts_per_process)"
        ),
    }
    if verify > m:
        measured, predicted = rows[-1]["total_mib"], predict(verify)
        extra = (math.ceil(verify / per_process) - math.ceil(m / per_process)) * process_mib
        out["verify"] = {
            "sandboxes": verify,
            "chromium_processes": rows[-1]["chromium_processes"],
            "measured_mib": measured,
            "predicted_mib": round(predicted, 1),
            "error_pct": round(100 * (predicted - measured) / measured, 1),
            "marginal_mib_per_sandbox_beyond_m": round((measured - rows[m]["total_mib"] - extra) / (verify - m), 1),
        }
    return out


# ---- the run ----


async def run(address: str, service_pid: int, port: int, args: argparse.Namespace) -> dict[str, object]:
    url, allow = f"http://127.0.0.1:{port}/", [f"127.0.0.1:{port}"]
    report: dict[str, object] = {}
    async with AsyncSandboxClient(target=address) as client:
        progress("cold start: the first browser sandbox (the service starts Playwright and Chromium)")
        sb, cold = await sdk_open(client, allow, url)
        await sb.delete()
        # Memory while no other browser runs: another one's processes would share Chromium's pages, lowering PSS.
        rows = await service_memory(
            client, psutil.Process(service_pid), allow, url, args.memory_sandboxes, args.verify_sandboxes
        )
        progress("cold start: the baseline, Playwright and Chromium started by this process")
        start = time.perf_counter()
        pw = await async_playwright().start()
        try:
            browser = await launch(pw)
            launched = time.perf_counter() - start
            context, _, first = await direct_open(browser, url)
            await context.close()
            report.update(
                {
                    "cold_start_ms": round(cold * 1e3, 1),
                    "baseline_direct_cold_start_ms": round((launched + first) * 1e3, 1),
                    "cold_start_ratio_to_baseline": ratio(cold, launched + first),
                }
            )
            report.update(await creates(client, browser, allow, url, args.creates))
            sb, _ = await sdk_open(client, allow, url)
            context, page, _ = await direct_open(browser, url)
            report["actions"] = await actions(sb, page, url, args.actions)
            report["screenshots_per_s"] = await screenshots(
                client, sb, browser, page, allow, url, args.screenshots, args.concurrent
            )
            await sb.delete()
            await browser.close()
        finally:
            await pw.stop()
    progress(f"memory: the baseline, a browser of this process with 0..{args.memory_sandboxes} contexts")
    direct = await direct_memory(url, args.memory_sandboxes)
    report["memory"] = memory_report(
        rows, direct, args.memory_sandboxes, args.verify_sandboxes, args.contexts_per_process
    )
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--creates",
        type=int,
        default=10,
        help="browser sandboxes created one after another (the first is the cold start)",
    )
    parser.add_argument("--actions", type=int, default=30, help="rounds of every action (after 2 warm-up rounds)")
    parser.add_argument("--screenshots", type=int, default=40, help="screenshots in a row, per sandbox")
    parser.add_argument("--concurrent", type=int, default=4, help="sandboxes taking screenshots at once")
    parser.add_argument("--memory-sandboxes", type=int, default=8, help="sandboxes the memory line is fitted on")
    parser.add_argument(
        "--verify-sandboxes", type=int, default=24, help="open this many to check the extrapolation (0: don't)"
    )
    parser.add_argument(
        "--contexts-per-process", type=int, default=16, help="the service's browser_contexts_per_process"
    )
    args = parser.parse_args()
    if args.creates < 2 or args.actions < 1 or args.screenshots < 1 or args.concurrent < 1:
        parser.error("--creates must be at least 2, and --actions, --screenshots and --concurrent at least 1")
    if not 2 <= args.memory_sandboxes <= args.contexts_per_process:
        parser.error(
            "--memory-sandboxes must be between 2 and --contexts-per-process (the line is fitted on "
            "one Chromium process)"
        )
    # SIGTERM stops the run like Ctrl-C does (KeyboardInterrupt), so every finally runs: the sandboxes, the
    # browsers and the service stop. Not by re-raising SIGINT: a shell ignores SIGINT in background jobs.
    signal.signal(signal.SIGTERM, signal.default_int_handler)

    most = max(32, args.memory_sandboxes, args.verify_sandboxes, args.concurrent + 2)
    load_before = os.getloadavg()
    with (
        page_server() as port,
        env_service(
            "--max-browser-sandboxes", str(most), "--browser-contexts-per-process", str(args.contexts_per_process)
        ) as (address, proc),
    ):
        report = asyncio.run(run(address, proc.pid, port, args))
    print(
        json.dumps(
            {
                "benchmark": "browser",
                "cpus": os.cpu_count(),
                "loadavg_before": [round(x, 2) for x in load_before],
                "loadavg_after": [round(x, 2) for x in os.getloadavg()],
                "chromium": CHROMIUM,
                **report,
            }
        )
    )


if __name__ == "__main__":
    main()
