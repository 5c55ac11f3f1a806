"""RawParser (orchard.events.publisher), the lean receive path of the publisher and the experience consumer: over
the same bytes, cut at every position, it dispatches exactly what nats-py's own parser does, except that routed
subscriptions get their frames as raw bytes.

The client is a real nats-py `Client` that is never connected; its protocol handlers (`_process_msg`, PING,
PONG, INFO, -ERR) are replaced by recorders, because the real ones need a server and the parser, which only
calls them, is what is under test."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
from nats.aio.client import Client
from nats.errors import ProtocolError
from nats.protocol.parser import Parser

from orchard.events.wire import RawParser, raw_parser

ROUTED, OTHER = 7, 3
BIG = bytes(range(256)) * 300  # 76.8 KB: more than one 32 KiB read
HEADER = b"NATS/1.0\r\nNats-Msg-Id: ev-1\r\nNats-Expected-Stream: S\r\n\r\n"
STATUS = b"NATS/1.0 404 No Messages\r\n\r\n"


def msg(subject: bytes, sid: int, payload: bytes, reply: bytes = b"") -> bytes:
    args = b" ".join(x for x in (subject, str(sid).encode(), reply, str(len(payload)).encode()) if x)
    return b"MSG " + args + b"\r\n" + payload + b"\r\n"


def hmsg(subject: bytes, sid: int, header: bytes, payload: bytes, reply: bytes = b"") -> bytes:
    sizes = f"{len(header)} {len(header) + len(payload)}".encode()
    args = b" ".join(x for x in (subject, str(sid).encode(), reply, sizes) if x)
    return b"HMSG " + args + b"\r\n" + header + payload + b"\r\n"


STREAM = b"".join(
    [
        b"INFO " + json.dumps({"server_id": "x", "max_payload": 1048576}).encode() + b"\r\n",
        msg(b"_INBOX.a", ROUTED, b"plain"),
        hmsg(b"orchard.rollouts.r.step", ROUTED, HEADER, b"\x08\x01MSG 1 2\r\nHMSG\r\n", b"$JS.ACK.S.c.1.5.5.1.0"),
        b"PING\r\n",
        hmsg(b"_INBOX.a", ROUTED, STATUS, b""),
        msg(b"_INBOX.other", OTHER, b"{}", b"_INBOX.reply.1"),
        b"+OK\r\n",
        msg(b"_INBOX.a", ROUTED, b""),
        hmsg(b"_INBOX.other", OTHER, HEADER, b"x" * 300),
        b"PONG\r\n",
        hmsg(b"_INBOX.a", ROUTED, HEADER, b"y" * 500, b"$JS.ACK.S.c.1.6.6.1.0"),
        b"-ERR 'Permissions Violation for Subscription to \"x\"'\r\n",
        msg(b"_INBOX.a", ROUTED, b"last", b"r"),
    ]
)
"""Every kind of frame, routed and not, with headers, statuses, and payloads that look like frames."""
LARGE = STREAM + hmsg(b"_INBOX.a", ROUTED, HEADER, BIG, b"r.1") + hmsg(b"_INBOX.other", OTHER, HEADER, BIG) + STREAM
"""Payloads larger than a read."""


class RecordingClient(Client):
    """A never-connected nats-py client whose protocol handlers record what the parser hands them."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[Any, ...]] = []
        self._subs = {ROUTED: None, OTHER: None}  # type: ignore[dict-item]
        self.reset_on_error = False

    async def _process_msg(self, sid: int, subject: bytes, reply: bytes, data: bytes, headers: bytes) -> None:  # type: ignore[override]
        self.seen.append(("msg", sid, bytes(subject), bytes(reply), headers or b"", data))

    async def _process_ping(self) -> None:
        self.seen.append(("ping",))

    async def _process_pong(self) -> None:
        self.seen.append(("pong",))

    async def _process_info(self, info: dict[str, Any], initial_connection: bool = False) -> None:
        self.seen.append(("info", info))

    async def _process_err(self, err_msg: str) -> None:
        self.seen.append(("err", err_msg))
        if self.reset_on_error:  # as nats-py does when an error closes or reconnects the connection
            self._ps.reset()


def routed_to(nc: RecordingClient) -> RawParser:
    parser = raw_parser(nc)
    parser.routes[ROUTED] = lambda subject, reply, header, payload: nc.seen.append(
        ("msg", ROUTED, subject, reply, header, payload)
    )
    return parser


async def feed(parser: Parser, chunks: list[bytes]) -> None:
    for chunk in chunks:
        await parser.parse(chunk)


async def expected(data: bytes, reset_on_error: bool = False) -> list[tuple[Any, ...]]:
    """What nats-py's own parser dispatches for `data` in one read."""
    nc = RecordingClient()
    nc.reset_on_error = reset_on_error
    await nc._ps.parse(data)
    return nc.seen


def cuts(data: bytes, points: list[int]) -> list[bytes]:
    bounds = [0, *sorted(points), len(data)]
    return [data[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]


async def test_every_two_way_cut_gives_what_nats_py_gives() -> None:
    want = await expected(STREAM)
    assert [e[0] for e in want].count("msg") == 8 and len(want) == 12
    for cut in range(len(STREAM) + 1):
        nc = RecordingClient()
        parser = routed_to(nc)
        await feed(parser, cuts(STREAM, [cut]))
        assert nc.seen == want, cut
        assert parser.buf == b""


@pytest.mark.parametrize("seed", range(20))
async def test_random_reads_of_large_frames_give_what_nats_py_gives(seed: int) -> None:
    rng = random.Random(seed)
    nc = RecordingClient()
    parser = routed_to(nc)
    await feed(parser, cuts(LARGE, [rng.randrange(len(LARGE)) for _ in range(rng.randrange(1, 200))]))
    assert nc.seen == await expected(LARGE)
    assert parser.buf == b""


async def test_byte_by_byte() -> None:
    nc = RecordingClient()
    await feed(routed_to(nc), [STREAM[i : i + 1] for i in range(len(STREAM))])
    assert nc.seen == await expected(STREAM)


async def test_takes_over_a_frame_nats_py_was_reading() -> None:
    for cut in range(len(STREAM) + 1):
        nc = RecordingClient()
        await nc._ps.parse(STREAM[:cut])  # nats-py's parser holds part of a frame, maybe mid-payload
        parser = routed_to(nc)
        await feed(parser, [STREAM[cut:]])
        assert nc.seen == await expected(STREAM), cut
        assert isinstance(nc._ps, RawParser) and parser.buf == b""


async def test_a_reset_while_dispatching_drops_the_rest_of_the_read() -> None:
    data = msg(b"a", ROUTED, b"1") + b"-ERR 'Stale Connection'\r\n" + msg(b"a", ROUTED, b"2")
    nc = RecordingClient()
    nc.reset_on_error = True
    await feed(routed_to(nc), [data])
    assert (
        nc.seen
        == await expected(data, reset_on_error=True)
        == [
            ("msg", ROUTED, b"a", b"", b"", b"1"),
            ("err", "'stale connection'"),
        ]
    )


async def test_a_failing_route_is_logged_and_the_read_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    nc = RecordingClient()
    parser = raw_parser(nc)

    def broken(subject: bytes, reply: bytes, header: bytes, payload: bytes) -> None:
        raise ValueError("bug")

    parser.routes[ROUTED] = broken
    await parser.parse(msg(b"a", ROUTED, b"1") + b"PING\r\n")
    assert nc.seen == [("ping",)] and "callback failed" in caplog.text


async def test_an_unsubscribed_sid_goes_to_nats_py() -> None:
    nc = RecordingClient()
    parser = routed_to(nc)
    del nc._subs[ROUTED]  # unsubscribed: nats-py drops what still comes for it
    await parser.parse(msg(b"a", ROUTED, b"1"))
    assert nc.seen == [("msg", ROUTED, b"a", b"", b"", b"1")]  # the recorder stands in for nats-py's handler


@pytest.mark.parametrize(
    "line",
    [b"MSG a\r\n", b"MSG a b 1\r\n", b"HMSG a 7 x 2\r\n", b"MSGX a 7 1\r\n", b"FOO bar\r\n", b"X" * 5000],
)
async def test_malformed_input_is_a_protocol_error(line: bytes) -> None:
    with pytest.raises(ProtocolError):
        await routed_to(RecordingClient()).parse(line)
