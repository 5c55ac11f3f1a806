"""The REST gateway's PTY WebSocket (`WS /sandboxes/{id}/exec/pty`): upstream's JSON frame protocol bridged to
`SandboxManager.open_pty`, nothing else.

client → server: init {cmd, env, cwd, rows, cols, login_shell}, then stdin {data: base64}, resize {rows, cols},
signal {sig}, close. server → client: ready {pid}, stdout {data: base64}, exit {code}, error {message}. An error
also closes the socket with code 4000 + its HTTP status (4404 unknown sandbox, 4503 overloaded ...).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import json
import shlex
from collections.abc import Callable

from aiohttp import WSMsgType, web
from pydantic import BaseModel, ConfigDict, ValidationError

from orchard.errors import InvalidArgument, OrchardError
from orchard.services.env.agent_client import PtySession
from orchard.services.env.manager import SandboxManager

INIT_TIMEOUT_S = 30.0
HEARTBEAT_S = 30.0  # pings find clients that vanished without closing


class PtyInit(BaseModel):
    """The first frame: what to run, and on what terminal."""

    model_config = ConfigDict(extra="ignore")

    type: str
    cmd: list[str] = []
    """The program and its arguments; empty runs an interactive bash."""
    env: dict[str, str] | None = None
    cwd: str | None = None
    rows: int = 24
    cols: int = 80
    login_shell: bool = False
    """Run cmd under `bash -lc` (a login shell's environment)."""


async def serve_pty(
    request: web.Request, manager: SandboxManager, http_status: Callable[[OrchardError], int]
) -> web.WebSocketResponse:
    """Run one PTY session over the request's WebSocket until the program exits or the client leaves."""
    # Echo the `api_key.<key>` subprotocol a client authenticated with (rest.py checks the key): browsers drop a
    # handshake that selects none of the subprotocols they offered.
    offered = [p.strip() for p in request.headers.get("Sec-WebSocket-Protocol", "").split(",")]
    ws = web.WebSocketResponse(heartbeat=HEARTBEAT_S, protocols=[p for p in offered if p.startswith("api_key.")])
    if not ws.can_prepare(request).ok:
        raise InvalidArgument("this route is a WebSocket; connect with a WebSocket client")
    await ws.prepare(request)
    try:
        init = await _init(ws)
        argv = ["bash", "-lc", "exec " + shlex.join(init.cmd or ["bash"])] if init.login_shell else init.cmd
        async with manager.commands.open_pty(
            request.match_info["sandbox_id"], argv, init.rows, init.cols, init.cwd or "", init.env
        ) as session:
            await ws.send_json({"type": "ready", "pid": await session.started()})
            await _bridge(ws, session, http_status)
    except OrchardError as err:
        await _fail(ws, err, http_status)
    return ws


async def _init(ws: web.WebSocketResponse) -> PtyInit:
    try:
        msg = await ws.receive(timeout=INIT_TIMEOUT_S)
    except TimeoutError:
        raise InvalidArgument(f'no init frame within {INIT_TIMEOUT_S:g}s; send {{"type": "init", ...}} first') from None
    try:
        init = PtyInit.model_validate_json(msg.data if msg.type is WSMsgType.TEXT else b"")
    except ValidationError as err:
        raise InvalidArgument(f"the first frame must be a JSON init frame: {err.errors()[0]['msg']}") from None
    if init.type != "init":
        raise InvalidArgument(f"the first frame must be of type 'init', got {init.type!r}")
    return init


async def _bridge(ws: web.WebSocketResponse, session: PtySession, http_status: Callable[[OrchardError], int]) -> None:
    """Program output to the client in one task, client frames to the program here."""

    async def output() -> None:
        try:
            async for event in session:
                if event.kind == "out":
                    await ws.send_json({"type": "stdout", "data": base64.b64encode(event.data).decode()})
                else:
                    # Upstream reports a process killed by signal n as -n (Python's returncode), not 128 + n.
                    code = -session.signal if session.signal else event.exit_code
                    await ws.send_json({"type": "exit", "code": code})
            await ws.close()
        except OrchardError as err:  # the sandbox went away mid-session
            await _fail(ws, err, http_status)
        except ConnectionResetError:
            pass  # the client left; the input loop ends the session

    sender = asyncio.create_task(output(), name="pty-output")
    try:
        async for msg in ws:  # ends when either side closes the socket
            if msg.type is not WSMsgType.TEXT or not await _on_frame(session, msg.data):
                break
    finally:
        # Nothing may iterate the session when it is closed (leaving open_pty kills the program).
        sender.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sender


async def _on_frame(session: PtySession, text: str) -> bool:
    """Apply one client frame; False when the client asked to close."""
    try:
        frame = json.loads(text)
        kind = frame.get("type")
        if kind == "stdin":
            await session.send_input(base64.b64decode(frame.get("data", ""), validate=True))
        elif kind == "resize":
            await session.resize(int(frame["rows"]), int(frame["cols"]))
        elif kind == "signal":
            # Ctrl-C is a keystroke on a terminal (its foreground job gets SIGINT); any other signal ends the
            # program's whole process tree.
            await (session.send_input(b"\x03") if frame.get("sig") in ("INT", "SIGINT") else session.kill())
        elif kind == "close":
            return False
        # Other types are ignored, as upstream's clients ignore server frames they do not know.
    except (ValueError, KeyError, TypeError, AttributeError, binascii.Error) as err:
        if isinstance(err, OrchardError):
            raise
        raise InvalidArgument(f"malformed {text[:40]!r} frame: {err}") from None
    return True


async def _fail(ws: web.WebSocketResponse, err: OrchardError, http_status: Callable[[OrchardError], int]) -> None:
    """Report err as an error frame, then close with 4000 + its HTTP status; quiet if the client already left."""
    with contextlib.suppress(ConnectionResetError):
        await ws.send_json({"type": "error", "message": err.message})
        await ws.close(code=4000 + http_status(err), message=err.message.encode()[:120])
