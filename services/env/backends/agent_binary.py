"""The in-sandbox agent's binary: the native agent (agent-rs/, one static file; its protocol in agent-rs/PROTOCOL.md)
that the `local` and `docker` backends bind read-only into every sandbox at SANDBOX_AGENT_PATH. One lookup for both.
(The `kubernetes` backend's pods get it from the agent image instead.)"""

from __future__ import annotations

import os
from pathlib import Path

from orchard.errors import FailedPrecondition
from orchard.services.env.settings import EnvSettings

SANDBOX_AGENT_PATH = "/.orchard/agent"
"""Where the agent is inside a sandbox."""
BUILT_AGENT = Path(__file__).resolve().parents[3] / "agent-rs/target/x86_64-unknown-linux-gnu/release/orchard-agent"
"""Where scripts/build_agent.sh puts it."""


def agent_binary(settings: EnvSettings) -> Path:
    """settings.agent_path, else scripts/build_agent.sh's output; FailedPrecondition saying how to build it when
    there is no such file."""
    path = settings.agent_path or BUILT_AGENT
    try:
        path.stat()
    except PermissionError:  # a folder on its path is closed to this user (a rootless service)
        raise FailedPrecondition(
            f"the native agent {path} cannot be reached by this user (uid {os.geteuid()}): a folder on its path is "
            "closed to it; copy the binary somewhere it can read and set ORCHARD_ENV_AGENT_PATH to it"
        ) from None
    except OSError:
        pass  # not there: said below
    if not path.is_file():
        raise FailedPrecondition(
            f"the native agent {path} is not built: run scripts/build_agent.sh (needs cargo: apt-get install cargo; "
            "scripts/install.sh runs it) or set ORCHARD_ENV_AGENT_PATH to the binary"
        )
    return path
