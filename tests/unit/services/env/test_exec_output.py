"""ExecOutput: a small head in memory, the rest spooled to a file; reads by stream and offset, and the interleaved
stream in arrival order, stay exact across the boundary; closing deletes the file."""

from pathlib import Path

import pytest

from orchard.services.env.exec_output import ExecOutput, StreamPosition


async def drain(out: ExecOutput, at: StreamPosition) -> tuple[list[tuple[int, bytes]], StreamPosition]:
    chunks: list[tuple[int, bytes]] = []
    while out.has_more(at):
        more, at = await out.read_stream(at)
        chunks += more
    return chunks, at


def merged(chunks: list[tuple[int, bytes]]) -> list[tuple[int, bytes]]:
    """Consecutive chunks of one stream joined: the order of streams is what must hold, not chunk sizes."""
    out: list[tuple[int, bytes]] = []
    for fd, data in chunks:
        if out and out[-1][0] == fd:
            out[-1] = (fd, out[-1][1] + data)
        else:
            out.append((fd, data))
    return out


@pytest.mark.parametrize("head", [0, 5, 1 << 20])
async def test_reads_are_exact_across_the_head(tmp_path: Path, head: int) -> None:
    out = ExecOutput(tmp_path / "ex-1", head)
    written = [(1, b"abc"), (2, b"E1"), (1, b"defgh"), (1, b"ij"), (2, b"E2E2"), (1, b"k" * 100)]
    for fd, data in written:
        out.append(fd, data)
    stdout = b"abcdefghij" + b"k" * 100
    assert await out.read(1) == stdout and await out.read(2) == b"E1E2E2"
    assert out.kept == [len(stdout), 6]
    for offset, limit in [(0, 1), (2, 4), (9, 3), (50, 1000), (110, 5), (111, 5)]:
        assert await out.read(1, offset, limit) == stdout[offset : offset + limit]
    chunks, at = await drain(out, StreamPosition())
    assert merged(chunks) == [(1, b"abc"), (2, b"E1"), (1, b"defghij"), (2, b"E2E2"), (1, b"k" * 100)]
    assert (tmp_path / "ex-1").exists() == (head < 116)
    assert out.spooled_bytes == max(0, 116 - head)
    out.append(2, b"late")  # a reader at the end sees what arrives next, and only that
    more, _ = await drain(out, at)
    assert merged(more) == [(2, b"late")]


async def test_large_spooled_output_streams_in_bounded_chunks(tmp_path: Path) -> None:
    out = ExecOutput(tmp_path / "ex-2", 1024)
    data = bytes(range(256)) * (12 << 12)  # 12 MiB
    for i in range(0, len(data), 1 << 16):
        out.append(1, data[i : i + (1 << 16)])
    chunks, _ = await drain(out, StreamPosition())
    assert max(len(c) for _, c in chunks) <= 1 << 20
    assert b"".join(c for _, c in chunks) == data
    assert await out.read(1) == data


async def test_close_deletes_the_file_and_reads_after_it_are_empty(tmp_path: Path) -> None:
    out = ExecOutput(tmp_path / "ex-3", 2)
    out.append(1, b"hello world")
    assert (tmp_path / "ex-3").stat().st_size == 9
    out.close()
    assert not (tmp_path / "ex-3").exists()
    assert await out.read(1, 2) == b""


async def test_empty_chunks_keep_nothing(tmp_path: Path) -> None:
    out = ExecOutput(tmp_path / "ex-4", 0)
    out.append(1, b"")
    assert out.kept == [0, 0] and not out.has_more(StreamPosition()) and await out.read(1) == b""
    assert not (tmp_path / "ex-4").exists()
