"""Runs an env service for a benchmark: `orchard serve env` on a free port with a throwaway state dir."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import grpc

ORCHARD = str(Path(sys.executable).with_name("orchard"))


@contextlib.contextmanager
def env_service(*flags: str) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """Yield (address, process) of a ready env service; it is stopped (SIGTERM, drain) and its state removed after."""
    with tempfile.TemporaryDirectory() as state:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        proc = subprocess.Popen(
            [ORCHARD, "serve", "env", "--port", str(port), "--state-dir", state, "--log-level", "WARNING", *flags],
            stdout=subprocess.DEVNULL,
        )
        address = f"127.0.0.1:{port}"
        try:
            with grpc.insecure_channel(address) as channel:
                grpc.channel_ready_future(channel).result(timeout=30)
            yield address, proc
        finally:
            proc.terminate()
            proc.wait(timeout=120)
