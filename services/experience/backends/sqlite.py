"""The embedded experience store: one SQLite file (WAL), written and read off the event loop."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from orchard.services.experience.backends.base import SqlStore, Statement


class SqliteStore(SqlStore):
    """sqlite:///<path>. One writer connection and one reader connection: in WAL mode reads never wait for the
    consumer's write transactions. synchronous=FULL, because an event is acked once its transaction commits."""

    def __init__(self, url: str) -> None:
        self.path = Path(url.removeprefix("sqlite:///")) if url.startswith("sqlite:///") else Path(url)
        self._writer: sqlite3.Connection | None = None
        self._reader: sqlite3.Connection | None = None
        # sqlite3 connections are not safe to use from two threads at once; to_thread may pick any thread.
        self._write_lock, self._read_lock = threading.Lock(), threading.Lock()

    async def open(self) -> None:
        await asyncio.to_thread(self._open)

    def _open(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._writer = self._connect()
        self._writer.executescript(self.schema())
        self._reader = self._connect()

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, timeout=30, isolation_level=None, check_same_thread=False)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
        return conn

    async def close(self) -> None:
        for conn in (self._writer, self._reader):
            if conn is not None:
                conn.close()
        self._writer = self._reader = None

    async def _transaction(self, statements: list[Statement]) -> None:
        await asyncio.to_thread(self._write, statements)

    def _write(self, statements: list[Statement]) -> None:
        assert self._writer is not None, "store not open"
        with self._write_lock:
            self._writer.execute("BEGIN IMMEDIATE")
            try:
                for query, rows in statements:
                    self._writer.executemany(query, rows)
            except BaseException:
                self._writer.execute("ROLLBACK")
                raise
            self._writer.execute("COMMIT")

    async def _fetch(self, query: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        return await asyncio.to_thread(self._read, query, params)

    def _read(self, query: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
        assert self._reader is not None, "store not open"
        with self._read_lock:
            return self._reader.execute(query, list(params)).fetchall()
