"""One Claw assistant environment: a sandbox on the `claw` image with a seeded world, its mail (SMTP + IMAP) and
calendar (CalDAV) servers running, and the assistant's tools as calls into it.

The servers run under a terminal session (`sandbox.pty`) that this object holds open for the environment's life:
commands of one sandbox run one at a time, and the agent ends whatever a command started when it ends, so a server
started by a command would either block every tool call or die with it. A terminal session takes no part in that
queue, and its process tree ends when the session does. Each tool call is then one short command
(`claw_tool.py`, JSON in and out). See docs/design/claw-environment.md for the servers and the layout.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from orchard.errors import FailedPrecondition
from orchard.sdk import AsyncSandbox, AsyncSandboxClient
from orchard.sdk.sandbox import AsyncPtySession

log = logging.getLogger(__name__)

SCRIPTS = Path(__file__).resolve().parent / "sandbox"
"""The in-sandbox scripts, uploaded to BIN."""
BIN = "/claw/bin"
PYTHON = "python3"
READY = "CLAW READY"
"""What `claw_services.py serve` prints once every server answers (claw_services.READY)."""
READY_TIMEOUT_S = 60.0
OUTPUT_LIMIT = 20_000
"""How much of the servers' terminal output is kept, for errors."""


class AssistantEnv:
    """A sandbox with mail, calendar and files seeded from a world state (see `orchard.tasks.assistant`).

    env = await AssistantEnv.start(client, task.fixture)
    try:
        print(await env.call("search_mail", {"query": "invoice"}))
        final = await env.state()
    finally:
        await env.close()
    """

    def __init__(self, client: AsyncSandboxClient, sandbox: AsyncSandbox) -> None:
        self.client = client
        self.sandbox = sandbox
        self._stack = contextlib.AsyncExitStack()
        self._reader: asyncio.Task[None] | None = None
        self._output = ""
        self._ready = asyncio.Event()
        self._ended = asyncio.Event()
        self._settled = asyncio.Event()
        """Set once the servers are ready or have stopped."""
        self._closed = False

    @classmethod
    async def start(
        cls,
        client: AsyncSandboxClient,
        fixture: Mapping[str, Any],
        *,
        image: str = "claw",
        ttl_s: float = 3600,
        labels: dict[str, str] | None = None,
    ) -> AssistantEnv:
        """Create the sandbox, seed `fixture` and start the servers; raises FailedPrecondition (with the servers'
        output) when they do not come up. Nothing is left behind when it fails."""
        sandbox = await client.create_sandbox(image=image, timeout=ttl_s, labels=labels)
        env = cls(client, sandbox)
        try:
            await env._setup(fixture, ttl_s)
        except BaseException:
            await env.close()
            raise
        return env

    async def _setup(self, fixture: Mapping[str, Any], ttl_s: float) -> None:
        began = time.monotonic()
        await asyncio.gather(
            *(self.sandbox.upload_content(p.read_bytes(), f"{BIN}/{p.name}") for p in sorted(SCRIPTS.glob("*.py"))),
            self.sandbox.upload_content(json.dumps(dict(fixture)), "/claw/fixture.json"),
        )
        seeded = await self.sandbox.exec([PYTHON, f"{BIN}/claw_services.py", "seed", "/claw/fixture.json"], timeout=120)
        if seeded.exit_code != 0:
            raise FailedPrecondition(
                f"seeding sandbox {self.sandbox.sandbox_id} failed (exit {seeded.exit_code}): "
                f"{(seeded.stderr or seeded.stdout)[-2000:]}"
            )
        session = await self._stack.enter_async_context(
            self.sandbox.pty([PYTHON, f"{BIN}/claw_services.py", "serve"], cols=200, timeout=ttl_s)
        )
        self._reader = asyncio.create_task(self._read(session))
        try:
            async with asyncio.timeout(READY_TIMEOUT_S):
                await self._settled.wait()
        except TimeoutError:
            raise FailedPrecondition(
                f"the Claw servers in sandbox {self.sandbox.sandbox_id} were not ready after "
                f"{READY_TIMEOUT_S:.0f} s; their output:\n{self._output[-3000:]}"
            ) from None
        if not self._ready.is_set():
            raise FailedPrecondition(
                f"the Claw servers in sandbox {self.sandbox.sandbox_id} stopped before they "
                f"were ready; their output:\n{self._output[-3000:]}"
            )
        log.debug("claw sandbox %s ready in %.2f s", self.sandbox.sandbox_id, time.monotonic() - began)

    async def _read(self, session: AsyncPtySession) -> None:
        """Drain the servers' terminal (so they never block on it), keeping its tail and noting READY."""
        try:
            async for chunk in session:
                self._output = (self._output + chunk.decode(errors="replace"))[-OUTPUT_LIMIT:]
                if READY in self._output:
                    self._ready.set()
                    self._settled.set()
        except Exception as err:  # noqa: BLE001 - the session ended badly; the next call reports the servers down
            self._output += f"\n[terminal session ended: {err}]"
        finally:
            self._ended.set()
            self._settled.set()
            if not self._closed:
                log.warning("the Claw servers in sandbox %s stopped: %s", self.sandbox.sandbox_id, self._output[-500:])

    async def call(self, tool: str, args: Mapping[str, Any]) -> str:
        """Run one tool; its result as JSON text ({"error": "..."} when the call failed)."""
        if self._ended.is_set():
            return json.dumps({"error": f"the mail and calendar servers have stopped: {self._output[-300:].strip()}"})
        result = await self.sandbox.exec(
            [PYTHON, f"{BIN}/claw_tool.py"], timeout=60, stdin=json.dumps({"tool": tool, "args": dict(args)})
        )
        if result.exit_code != 0 or not result.stdout.strip():
            return json.dumps(
                {
                    "error": f"the {tool} tool failed (exit {result.exit_code}): "
                    f"{(result.stderr or result.error)[-1000:]}"
                }
            )
        return result.stdout.strip()

    async def state(self) -> dict[str, Any]:
        """The world as the sandbox holds it now: mail by folder, events, files, and the fixture's user, allowed
        domains and contacts."""
        result = await self.sandbox.exec([PYTHON, f"{BIN}/claw_services.py", "dump"], timeout=120)
        if result.exit_code != 0:
            raise FailedPrecondition(
                f"reading the state of sandbox {self.sandbox.sandbox_id} failed (exit "
                f"{result.exit_code}): {result.stderr[-2000:]}"
            )
        return json.loads(result.stdout)  # type: ignore[no-any-return]

    async def close(self) -> None:
        """End the servers and delete the sandbox; closing twice is fine."""
        if self._closed:
            return
        self._closed = True
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._reader
        try:
            await self._stack.aclose()
        except Exception as err:  # noqa: BLE001 - the sandbox goes anyway
            log.debug("closing the terminal of sandbox %s: %s", self.sandbox.sandbox_id, err)
        await self.sandbox.delete()

    def __repr__(self) -> str:
        return f"AssistantEnv(sandbox_id={self.sandbox.sandbox_id!r}, ready={self._ready.is_set()})"
