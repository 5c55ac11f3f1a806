"""SiteServer: serves the bundled practice sites (and MiniWoB++'s pages when installed) on a loopback port.

Every page is rendered from the request alone (the shop's cart lives in the browser's localStorage), so one
server can serve any number of agents at once.
"""

from __future__ import annotations

from pathlib import Path
from types import TracebackType
from typing import Self

from aiohttp import web

from orchard.errors import FailedPrecondition
from orchard.tasks.web import pages
from orchard.tasks.web.miniwob import MINIWOB_PREFIX, miniwob_core_js, miniwob_html_dir

SITES_DIR = Path(__file__).resolve().parent / "sites"
"""The static files: one folder per site, plus static/ for the shared stylesheet."""


def _html(text: str, status: int = 200) -> web.Response:
    return web.Response(text=text, status=status, content_type="text/html")


async def _index(request: web.Request) -> web.Response:
    return _html(pages.sites_index())


async def _shop_index(request: web.Request) -> web.Response:
    return _html(pages.shop_index())


async def _order(request: web.Request) -> web.Response:
    form = await request.post()
    status, text = pages.order_page({k: str(v) for k, v in form.items()})
    return _html(text, status)


async def _library_search(request: web.Request) -> web.Response:
    return _html(pages.library_search(request.query.get("q", "")))


async def _library_book(request: web.Request) -> web.Response:
    status, text = pages.library_book(request.match_info["book_id"])
    return _html(text, status)


async def _contact_sent(request: web.Request) -> web.Response:
    return _html(pages.contact_sent(request.query))


async def _booking_confirm(request: web.Request) -> web.Response:
    form = await request.post()
    return _html(pages.booking_confirmed({k: str(v) for k, v in form.items()}))


async def _signup_done(request: web.Request) -> web.Response:
    form = await request.post()
    return _html(pages.signup_done({k: str(v) for k, v in form.items()}))


def make_app() -> web.Application:
    """The aiohttp application: dynamic pages first, then the static folders."""
    app = web.Application()
    app.router.add_get("/", _index)
    app.router.add_get("/shop/index.html", _shop_index)
    app.router.add_post("/shop/order", _order)
    app.router.add_get("/library/search", _library_search)
    app.router.add_get("/library/book/{book_id}", _library_book)
    app.router.add_get("/forms/contact/sent", _contact_sent)
    app.router.add_post("/forms/booking/confirm", _booking_confirm)
    app.router.add_post("/forms/signup/done", _signup_done)
    for folder in sorted(p for p in SITES_DIR.iterdir() if p.is_dir()):
        app.router.add_static(f"/{folder.name}/", folder)
    html_dir = miniwob_html_dir()
    if html_dir is not None:
        core_js = miniwob_core_js(html_dir)

        async def _core_js(request: web.Request) -> web.Response:
            return web.Response(text=core_js, content_type="application/javascript")

        app.router.add_get(f"{MINIWOB_PREFIX}/core/core.js", _core_js)
        app.router.add_static(f"{MINIWOB_PREFIX}/", html_dir)
    return app


class SiteServer:
    """Serves the bundled sites on a loopback port (port 0 picks a free one)."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self._host = host
        self._port = port
        self._runner: web.AppRunner | None = None

    async def start(self) -> str:
        """Start serving; returns the base URL, e.g. "http://127.0.0.1:41234"."""
        if self._runner is not None:
            raise FailedPrecondition(f"the site server is already running at {self.url}")
        runner = web.AppRunner(make_app(), access_log=None)
        await runner.setup()
        try:
            await web.TCPSite(runner, self._host, self._port).start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        self._port = runner.addresses[0][1]
        return self.url

    async def stop(self) -> None:
        """Stop serving (a no-op when not running)."""
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

    @property
    def port(self) -> int:
        """The port served on (the picked one once started)."""
        return self._port

    @property
    def url(self) -> str:
        """The base URL, e.g. "http://127.0.0.1:41234"."""
        host = f"[{self._host}]" if ":" in self._host else self._host
        return f"http://{host}:{self._port}"
