"""The raw receive path for NATS connections (used by the event publisher and the experience consumer).

nats-py turns every incoming message into a regex match, a parsed header dict, a `Msg` object and a queue hop to
a subscription task: for a PubAck per event (the publisher) or a delivery per event (the experience consumer) that was
a third of the CPU per event. RawParser replaces the client's protocol parser (`Client._ps`, which nats-py keeps
across reconnects and only resets) with one that cuts frames out of each read with `find` and `split` and hands
the frames of *routed* subscriptions to a plain callback as bytes. Every other frame (other subscriptions, the
JetStream API's replies, PING, PONG, INFO, -ERR) goes to nats-py's own handlers as its parser would send it, so
connecting, reconnecting (which resubscribes a routed subscription like any other), auth and TLS stay nats-py's.
This rests on nats-py internals (`_ps`, `_process_msg` and the other `_process_*` handlers, `_subs`,
`_send_command`, `_flush_pending`); pyproject pins nats-py, and tests/unit/test_experience_wire.py runs the
parser against that version over real frames cut at every byte.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable

from nats.aio.client import Client as NatsClient
from nats.aio.subscription import Subscription
from nats.errors import ConnectionClosedError, ConnectionDrainingError, OutboundBufferLimitError, ProtocolError
from nats.protocol.parser import AWAITING_MSG_PAYLOAD, MAX_CONTROL_LINE_SIZE, Parser

_log = logging.getLogger("orchard.events.wire")

Route = Callable[[bytes, bytes, bytes, bytes], None]
"""Called with (subject, reply, header block or b"", payload) for each message of a routed subscription; it must
not suspend or raise (it runs inside the connection's read loop)."""

_CRLF = b"\r\n"


class RawParser(Parser):
    """nats-py's protocol parser, except that MSG/HMSG frames for a routed subscription id go to its Route."""

    def __init__(self, nc: NatsClient, previous: Parser | None = None) -> None:
        self.routes: dict[int, Route] = {}
        self._frame_end = 0  # when the buffer holds a partial frame: the buffer length that completes it
        super().__init__(nc)  # calls reset()
        self._previous = previous  # nats-py's parser, until it has finished the frame it was reading

    def reset(self) -> None:
        """Drop a partial frame (nats-py calls this when it reconnects)."""
        super().reset()
        self._frame_end = 0
        self._previous = None

    async def parse(self, data: bytes = b"") -> None:
        """Dispatch every complete frame in the buffer (plus `data`); keep a partial one for the next read."""
        previous = self._previous
        if previous is not None:  # its bytes were read before any route existed: let it finish its frame
            if previous.state == AWAITING_MSG_PAYLOAD:
                await previous.parse(data)
                if previous.state == AWAITING_MSG_PAYLOAD or self._previous is None:
                    return
                data = b""
            self._previous = None
            self.buf.extend(previous.buf)  # a partial control line at most
        buf = self.buf
        buf.extend(data)
        if len(buf) < self._frame_end:
            return
        self._frame_end = 0
        nc, routes = self.nc, self.routes
        view = bytes(buf)
        size, pos, routed = len(view), 0, 0
        while pos < size:
            eol = view.find(_CRLF, pos)
            if eol < 0:
                if size - pos > MAX_CONTROL_LINE_SIZE:
                    raise ProtocolError("nats: control line too long")
                break
            first = view[pos]
            if first == 77 or first == 72:  # "MSG <subject> <sid> [reply] <size>", "HMSG ... <header size> <size>"
                args = view[pos:eol].split()
                try:
                    op, header_size, total = args[0], 0, int(args[-1])
                    if op == b"HMSG":
                        header_size = int(args[-2])
                        reply = args[3] if len(args) == 6 else b""
                    elif op == b"MSG":
                        reply = args[3] if len(args) == 5 else b""
                    else:
                        raise ValueError(op)
                    subject, sid = args[1], int(args[2])
                except (ValueError, IndexError):
                    raise ProtocolError("nats: malformed MSG") from None
                start = eol + 2
                end = start + total
                if end + 2 > size:  # the payload has not all arrived: wait for it, parse the line again then
                    self._frame_end = end + 2 - pos
                    break
                header = view[start : start + header_size] if header_size else b""
                payload = view[start + header_size : end]
                pos = end + 2
                route = routes.get(sid)
                if route is not None and sid in nc._subs:
                    try:
                        route(subject, reply, header, payload)
                    except Exception:  # its bug, but it must not end the connection's read loop
                        _log.exception("a raw subscription's callback failed on a message to %r", subject)
                    routed += 1
                    continue
                await nc._process_msg(sid, subject, reply, payload, header or None)  # type: ignore[arg-type]
            elif view.startswith(b"+OK", pos):
                pos = eol + 2
                continue
            elif view.startswith(b"PING", pos):
                pos = eol + 2
                await nc._process_ping()
            elif view.startswith(b"PONG", pos):
                pos = eol + 2
                await nc._process_pong()
            elif view.startswith(b"INFO ", pos):
                info = json.loads(view[pos + 5 : eol])
                pos = eol + 2
                await nc._process_info(info)
            elif view.startswith(b"-ERR", pos):
                message = view[pos + 4 : eol].strip().decode(errors="replace").lower()
                pos = eol + 2
                await nc._process_err(message)
            else:
                raise ProtocolError("nats: unknown protocol")
            if self.buf is not buf:  # the handler reset the parser (a reconnect): what is left is stale
                return
        if routed:
            nc.stats["in_msgs"] += routed
        del buf[:pos]  # what is left starts a frame; _frame_end counts from there


def raw_parser(nc: NatsClient) -> RawParser:
    """The connection's RawParser, put in place of nats-py's on first use."""
    parser = nc._ps
    if not isinstance(parser, RawParser):
        nc._ps = parser = RawParser(nc, previous=parser)
    return parser


async def raw_subscribe(nc: NatsClient, subject: str, callback: Route) -> Subscription:
    """Subscribe to `subject` with its messages going to `callback`; nats-py resubscribes it after a reconnect
    like any other subscription. End it with `raw_unsubscribe()`."""
    parser = raw_parser(nc)  # before the SUB: nothing for the new subscription can reach nats-py's parser
    subscription = await nc.subscribe(subject)
    parser.routes[subscription._id] = callback
    return subscription


async def raw_unsubscribe(subscription: Subscription) -> None:
    raw_parser(subscription._conn).routes.pop(subscription._id, None)
    await subscription.unsubscribe()


async def send_raw(nc: NatsClient, command: bytes) -> None:
    """Queue protocol commands (PUB/HPUB lines with their payloads) as one write, and kick nats-py's flusher.

    Like nats-py's publish it raises ConnectionClosedError on a closed connection and ConnectionDrainingError on a
    draining one, and buffers while reconnecting up to the client's pending size (OutboundBufferLimitError past
    it); unlike it, it does not check subjects or payload sizes: the caller built the command."""
    if nc.is_closed:
        raise ConnectionClosedError
    if nc.is_draining_pubs:
        raise ConnectionDrainingError
    if not nc.is_connected and (
        nc._max_pending_size <= 0 or nc.pending_data_size + len(command) > nc._max_pending_size
    ):
        raise OutboundBufferLimitError
    await nc._send_command(command)
    if nc._flush_queue is not None and nc._flush_queue.empty():  # as nats-py's publish: a queued kick sends it too
        await nc._flush_pending()
