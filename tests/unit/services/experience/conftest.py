"""A real PostgreSQL server for the store tests: initdb + pg_ctl in a temporary folder, as user `nobody`
(postgres refuses to run as root), on a free port; skipped when the PostgreSQL binaries are absent."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

PG_BIN = (
    next((p for p in sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True) if (p / "initdb").exists()), None)
    if Path("/usr/lib/postgresql").exists()
    else None
)


def _as_postgres_user(args: list[str]) -> list[str]:
    return ["runuser", "-u", "nobody", "--", *args] if os.geteuid() == 0 else args


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    if PG_BIN is None:
        pytest.skip("PostgreSQL binaries not found under /usr/lib/postgresql/*/bin (apt-get install postgresql)")
    root = Path(tempfile.mkdtemp(prefix="orchard-pg-"))
    if os.geteuid() == 0:
        shutil.chown(root, "nobody")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    data = root / "data"
    subprocess.run(
        _as_postgres_user([str(PG_BIN / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust", "--no-sync"]),
        check=True,
        capture_output=True,
    )
    options = f"-p {port} -k {root} -c listen_addresses=127.0.0.1 -c fsync=off"
    subprocess.run(
        _as_postgres_user(
            [str(PG_BIN / "pg_ctl"), "-D", str(data), "-o", options, "-l", str(root / "log"), "-w", "start"]
        ),
        check=True,
        capture_output=True,
    )
    try:
        yield f"postgresql://postgres@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run(
            _as_postgres_user([str(PG_BIN / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop"]),
            capture_output=True,
            check=False,
        )
        shutil.rmtree(root, ignore_errors=True)
