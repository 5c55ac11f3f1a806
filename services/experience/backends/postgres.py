"""The experience store on PostgreSQL (psycopg 3, async): for many writers and readers at scale."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Sequence
from typing import Any

import psycopg

from orchard.errors import Unavailable
from orchard.services.experience.backends.base import SqlStore, Statement


def _pg(query: str) -> str:
    # The shared SQL uses sqlite's `?` placeholders and no literal '?' or '%' anywhere.
    return query.replace("?", "%s")


_INSERT_VALUES = re.compile(r"INSERT INTO (\w+) \(([\w, ]+)\) VALUES \(\?(?:, \?)*\)( ON CONFLICT .*)", re.DOTALL)
"""A plain multi-row insert of the shared SQL (the target, its columns, the conflict clause)."""


def _bulk(
    query: str, rows: Sequence[Sequence[Any]], types: dict[tuple[str, str], str]
) -> tuple[str, list[list[Any]]] | None:
    """`INSERT ... VALUES (?, ...) ON CONFLICT ...` of many rows as one `INSERT ... SELECT FROM unnest(arrays)`:
    one statement per table and batch, its arrays adapted in C, instead of a (pipelined) statement per row.
    `types` are the columns' SQL types (the arrays are cast to them: text goes out untyped)."""
    match = _INSERT_VALUES.fullmatch(query)
    if match is None or len(rows) < 2:
        return None
    table, columns, conflict = match.groups()
    arrays = [list(column) for column in zip(*rows, strict=True)]
    marks = ", ".join(f"%s::{types[table, c.strip()]}[]" for c in columns.split(","))
    return f"INSERT INTO {table} ({columns}) SELECT * FROM unnest({marks}){conflict}", arrays


class PostgresStore(SqlStore):
    """postgresql://user@host:port/db. One connection writes (the consumer's transactions, executemany runs
    pipelined), another serves reads in autocommit mode, so queries never wait for a write batch."""

    blob = "BYTEA"
    greatest = "GREATEST"

    def __init__(self, url: str) -> None:
        self.url = url
        self._writer: psycopg.AsyncConnection[Any] | None = None
        self._reader: psycopg.AsyncConnection[Any] | None = None
        self._write_lock, self._read_lock = asyncio.Lock(), asyncio.Lock()
        self._types: dict[tuple[str, str], str] = {}  # (table, column) -> SQL type, read once the schema exists

    async def open(self) -> None:
        try:
            self._writer = await psycopg.AsyncConnection.connect(self.url)
            self._reader = await psycopg.AsyncConnection.connect(self.url, autocommit=True)
        except psycopg.OperationalError as err:
            raise Unavailable(f"cannot connect to PostgreSQL at {_safe(self.url)}: {err}".strip()) from err
        async with self._writer.transaction():
            # Two replicas starting together would race on CREATE TABLE IF NOT EXISTS; serialise them.
            await self._writer.execute("SELECT pg_advisory_xact_lock(7283001)")
            for statement in self.schema().split(";"):
                if statement.strip():
                    await self._writer.execute(statement)
            cur = await self._writer.execute(
                "SELECT table_name, column_name, data_type FROM information_schema.columns "
                "WHERE table_schema = current_schema()"
            )
            self._types = {(table, column): kind for table, column, kind in await cur.fetchall()}

    async def close(self) -> None:
        for conn in (self._writer, self._reader):
            if conn is not None:
                await conn.close()
        self._writer = self._reader = None

    async def _transaction(self, statements: list[Statement]) -> None:
        assert self._writer is not None, "store not open"
        async with self._write_lock, self._writer.transaction(), self._writer.cursor() as cur:
            for query, rows in statements:
                bulk = _bulk(query, rows, self._types)
                if bulk is not None:
                    await cur.execute(*bulk)
                else:
                    await cur.executemany(_pg(query), rows)

    async def _fetch(self, query: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        assert self._reader is not None, "store not open"
        async with self._read_lock, self._reader.cursor() as cur:
            await cur.execute(_pg(query), list(params))
            return await cur.fetchall()


def _safe(url: str) -> str:
    """The URL without its password, for messages."""
    head, at, tail = url.rpartition("@")
    return f"{head.split(':')[0]}:{head.split(':')[1]}:***@{tail}" if at and head.count(":") >= 2 else url
