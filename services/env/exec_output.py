"""An exec's kept output, in arrival order, with bounded memory: the first `head_bytes` in memory, everything
after in a spool file in the state dir, deleted with the exec record.

A command may print hundreds of MiB and its record is kept for `exec_retention_s`: held in memory, a few such
commands would grow the service without bound. Here memory per exec is at most `head_bytes` plus a short index
(consecutive chunks of one stream are one segment), and reads of the spooled part run in a thread.
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass
from pathlib import Path


@dataclass
class _Segment:
    """A run of one stream's bytes: in memory (data) or in the spool file at `offset`."""

    fd: int
    length: int
    data: bytearray | None = None
    offset: int = 0


@dataclass(frozen=True)
class StreamPosition:
    """Where a reader of the interleaved output stands: a segment, and the bytes of it already read."""

    segment: int = 0
    consumed: int = 0


READ_CHUNK = 1 << 20
"""Most bytes one streamed chunk carries from the spool file."""


class ExecOutput:
    """Stdout (fd 1) and stderr (fd 2) of one exec."""

    def __init__(self, spool_path: Path, head_bytes: int) -> None:
        self._spool_path = spool_path
        self._head_left = head_bytes
        self._segments: list[_Segment] = []
        self._fd: int | None = None
        self._spooled = 0
        self._readers = 0  # reads of the spool file in flight: its fd is closed only once none is
        self._closed = False
        self.kept = [0, 0]
        """Bytes kept per stream (stdout, stderr)."""

    @property
    def spooled_bytes(self) -> int:
        """Bytes of this output on disk."""
        return self._spooled

    def append(self, fd: int, data: bytes) -> None:
        """Keep a chunk (the agent caps each stream at the exec's max_output before it gets here)."""
        if not data:
            return
        self.kept[fd - 1] += len(data)
        last = self._segments[-1] if self._segments else None
        if self._head_left:
            part, data = data[: self._head_left], data[self._head_left :]
            self._head_left -= len(part)
            if last is not None and last.fd == fd and last.data is not None:
                last.data += part
                last.length += len(part)
            else:
                self._segments.append(_Segment(fd, len(part), data=bytearray(part)))
            if not data:
                return
            last = self._segments[-1]
        if self._fd is None:
            self._spool_path.parent.mkdir(parents=True, exist_ok=True)
            self._fd = os.open(self._spool_path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        # A chunk is at most the agent's frame size (64 KiB): one write to the page cache costs microseconds, less
        # than a thread hop.
        os.pwrite(self._fd, data, self._spooled)
        if last is not None and last.fd == fd and last.data is None:
            last.length += len(data)
        else:
            self._segments.append(_Segment(fd, len(data), offset=self._spooled))
        self._spooled += len(data)

    def close(self) -> None:
        """Delete the spool file (the record is being forgotten); reads still in flight finish first."""
        self._closed = True
        if self._spooled:
            self._spool_path.unlink(missing_ok=True)
        self._release()

    def _release(self) -> None:
        # Never close the fd under a reader: its number could be reused by another exec's file mid-read.
        if self._closed and not self._readers and self._fd is not None:
            os.close(self._fd)
            self._fd = None

    async def read(self, fd: int, offset: int = 0, limit: int | None = None) -> bytes:
        """Up to `limit` bytes of one stream from `offset` (all of it by default)."""
        end = self.kept[fd - 1] if limit is None else min(self.kept[fd - 1], offset + limit)
        if offset >= end:
            return b""
        pieces: list[bytes | tuple[int, int]] = []  # bytes, or (file offset, length) to read
        position = 0
        for seg in self._segments:
            if seg.fd != fd:
                continue
            lo, hi = max(offset, position), min(end, position + seg.length)
            if lo < hi:
                if seg.data is not None:
                    pieces.append(bytes(seg.data[lo - position : hi - position]))
                else:
                    pieces.append((seg.offset + lo - position, hi - lo))
            position += seg.length
            if position >= end:
                break
        if all(isinstance(p, bytes) for p in pieces):
            return b"".join(pieces)  # type: ignore[arg-type]
        return await self._in_thread(self._join, pieces)

    async def _in_thread(self, fn, *args):  # type: ignore[no-untyped-def]
        if self._closed:
            return b""
        self._readers += 1
        try:
            return await asyncio.to_thread(fn, *args)
        finally:
            self._readers -= 1
            self._release()

    def _join(self, pieces: list[bytes | tuple[int, int]]) -> bytes:
        out = bytearray()
        for piece in pieces:
            if isinstance(piece, bytes):
                out += piece
            else:
                out += self._pread(*piece)
        return bytes(out)

    def _pread(self, offset: int, length: int) -> bytes:
        assert self._fd is not None  # held open by _in_thread's reader count
        return os.pread(self._fd, length, offset)

    def has_more(self, at: StreamPosition) -> bool:
        """Whether output beyond `at` has arrived."""
        if at.segment >= len(self._segments):
            return False
        return at.consumed < self._segments[at.segment].length or at.segment + 1 < len(self._segments)

    async def read_stream(self, at: StreamPosition) -> tuple[list[tuple[int, bytes]], StreamPosition]:
        """The chunks (fd, bytes) after `at` in arrival order (at most READ_CHUNK from the file), and the new
        position."""
        chunks: list[tuple[int, bytes]] = []
        segment, consumed = at.segment, at.consumed
        while segment < len(self._segments):
            seg = self._segments[segment]
            if consumed < seg.length:
                if seg.data is not None:
                    chunks.append((seg.fd, bytes(seg.data[consumed : seg.length])))
                    consumed = seg.length
                else:
                    length = min(seg.length - consumed, READ_CHUNK)
                    chunks.append((seg.fd, await self._in_thread(self._pread, seg.offset + consumed, length)))
                    consumed += length
                    return chunks, StreamPosition(segment, consumed)
            if segment + 1 >= len(self._segments):
                break
            segment, consumed = segment + 1, 0
        return chunks, StreamPosition(segment, consumed)
