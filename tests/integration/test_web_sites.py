"""The bundled web tasks end to end: a real SiteServer on 127.0.0.1:0 and Debian's chromium driven by Playwright.
Every task's scripted solution passes its check; doing nothing, or a plausible wrong variant, fails it."""

from __future__ import annotations

import asyncio
import html
import os
import shutil
from collections.abc import AsyncIterator, Mapping
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
from playwright.async_api import Browser, Page, async_playwright

from orchard.tasks.web import CheckResult, SiteServer, WebTask, load_tasks
from orchard.tasks.web.miniwob import miniwob_html_dir

CHROMIUM = "/usr/bin/chromium"
pytestmark = [
    pytest.mark.asyncio(loop_scope="module"),
    pytest.mark.timeout(120),
    pytest.mark.skipif(
        not os.path.exists(CHROMIUM) and shutil.which("chromium") is None,
        reason="needs Debian's chromium at /usr/bin/chromium (apt-get install chromium)",
    ),
]
TASKS = {t.task_id: t for t in load_tasks()}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def site() -> AsyncIterator[str]:
    async with SiteServer() as server:
        yield server.url


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def browser() -> AsyncIterator[Browser]:
    async with async_playwright() as playwright:
        chromium = await playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        yield chromium
        await chromium.close()


async def act(page: Page, step: Mapping[str, Any]) -> None:
    """One solution step, as the env service's browser sandboxes run an ActRequest (services/env/browser.py)."""
    action, selector = step["action"], step.get("selector", "")
    if action == "click":
        await (page.click(selector) if selector else page.mouse.click(step["x"], step["y"]))
    elif action == "double_click":
        await (page.dblclick(selector) if selector else page.mouse.dblclick(step["x"], step["y"]))
    elif action == "type":  # like the env service: typed key by key, after any text already there
        await (
            page.locator(selector).press_sequentially(step["text"]) if selector else page.keyboard.type(step["text"])
        )
    elif action == "key_press":
        await page.keyboard.press(step["key"])
    elif action == "scroll":
        await page.mouse.wheel(step.get("delta_x", 0), step.get("delta_y", 0))
    elif action == "navigate":
        await page.goto(step["url"])
    elif action == "back":
        await page.go_back()
    elif action == "wait":
        await page.wait_for_selector(selector, state="visible")


async def run(browser: Browser, site: str, task: WebTask, steps: list[dict[str, Any]]) -> CheckResult:
    """Open the task's start page in a fresh context, run `steps`, and check the final page."""
    context = await browser.new_context()
    try:
        page = await context.new_page()
        page.set_default_timeout(10_000)
        await page.goto(task.url(site))
        for step in steps:
            await act(page, step)
        await page.wait_for_load_state()
        return task.check.evaluate(page.url, await page.title(), await page.inner_text("body"))
    finally:
        await context.close()


@pytest.mark.parametrize("task_id", sorted(TASKS))
async def test_solution_passes_and_doing_nothing_fails(browser: Browser, site: str, task_id: str) -> None:
    task = TASKS[task_id]
    result = await run(browser, site, task, task.actions(site))
    assert result == CheckResult(passed=True, reasons=())
    assert not (await run(browser, site, task, [])).passed


def without(steps: list[dict[str, Any]], selector: str, count: int = 99) -> list[dict[str, Any]]:
    """The steps less (up to `count` of) those on `selector`."""
    kept = []
    for step in steps:
        if step.get("selector") == selector and count > 0:
            count -= 1
            continue
        kept.append(step)
    return kept


def replace(steps: list[dict[str, Any]], selector: str, other: str) -> list[dict[str, Any]]:
    return [{**s, "selector": other} if s.get("selector") == selector else s for s in steps]


WRONG = {
    # Naive order: add one teapot and check out, never raising the quantity.
    "shop-teapots": (lambda s: without(s, "#inc-teapot-green"), "the page text lacks '3 x Green Teapot'"),
    # Leaves the newsletter box ticked, as the form has it.
    "form-signup": (lambda s: without(s, "#newsletter"), "the page text lacks 'Newsletter: no'"),
    "form-booking": (lambda s: without(s, "#outdoor"), "the page text lacks 'Outdoor seating: yes'"),
    # Opens the first result instead of the cheapest.
    "search-cheapest": (
        lambda s: replace(s, 'a[href="/library/book/garden-birds"]', 'a[href="/library/book/orchard-keeper"]'),
        "the URL path is '/library/book/orchard-keeper', not '/library/book/garden-birds'",
    ),
    # Opens the release named just above 2.2 on the home page.
    "nav-release": (
        lambda s: replace(s, 'a[href="/docs/releases/2.2.html"]', 'a[href="/docs/releases/2.3.html"]'),
        "the URL path is '/docs/releases/2.3.html', not '/docs/releases/2.2.html'",
    ),
}


@pytest.mark.parametrize("task_id", sorted(WRONG))
async def test_wrong_variant_fails_with_reason(browser: Browser, site: str, task_id: str) -> None:
    task = TASKS[task_id]
    change, reason = WRONG[task_id]
    result = await run(browser, site, task, change(task.actions(site)))
    assert not result.passed
    assert reason in result.reasons


async def test_contexts_keep_separate_carts(browser: Browser, site: str) -> None:
    """Two agents shopping at once on one server: each context's cart holds only its own items."""
    teapots, mug = TASKS["shop-teapots"], TASKS["shop-blue-mug"]
    results = await asyncio.gather(
        run(browser, site, teapots, teapots.actions(site)), run(browser, site, mug, mug.actions(site))
    )
    assert [r.passed for r in results] == [True, True]


async def test_server_rejects_bad_orders_and_unknown_pages(site: str) -> None:
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{site}/shop/order", data={"items": "mug-blue:0", "name": "A", "address": "B"}) as r:
            assert r.status == 400
            assert "the quantity of 'mug-blue' must be 1 to 99" in html.unescape(await r.text())
        async with http.post(f"{site}/shop/order", data={"items": "mug-blue:2"}) as r:
            assert r.status == 400
            assert "please fill in: Full name, Address" in await r.text()
        for path in ("/library/book/nope", "/shop/nope.html", "/../setup.py"):
            async with http.get(f"{site}{path}") as r:
                assert r.status in (403, 404), path


@pytest.mark.skipif(
    miniwob_html_dir() is None,
    reason="needs the miniwob package (scripts/install.sh installs it: pip install --no-deps miniwob==1.1.0)",
)
@pytest.mark.parametrize("task", load_tasks("miniwob") if miniwob_html_dir() else [], ids=lambda t: t.task_id)
async def test_miniwob_solution_passes(browser: Browser, site: str, task: WebTask) -> None:
    assert (await run(browser, site, task, task.actions(site))).passed
    assert not (await run(browser, site, task, task.actions(site)[:1])).passed  # START only: no reward yet
