"""The env service's Prometheus metrics: sandboxes by state, creates, exec latency and outcomes, queue depth."""

from __future__ import annotations

from collections import Counter as Tally
from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import REGISTRY, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from orchard.services.env.models import Exec, SandboxState

if TYPE_CHECKING:
    from orchard.services.env.manager import SandboxManager

SANDBOXES_CREATED = Counter("orchard_env_sandboxes_created", "Sandboxes created (ready).")
SANDBOXES_ENDED = Counter("orchard_env_sandboxes_ended", "Sandboxes deleted, by reason kind.", ["reason"])
EXECS = Counter("orchard_env_execs", "Commands ended, by final state.", ["state"])
EXEC_SECONDS = Histogram(
    "orchard_env_exec_duration_seconds",
    "Time from a command's start to its end.",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 1800),
)
OOM_KILLS = Counter("orchard_env_oom_kills", "Commands killed for running out of memory.")
BROWSER_FAILURES = Counter(
    "orchard_env_browser_failures", "Browser sandboxes failed by a crash, by what crashed (page or process).", ["what"]
)


def observe_exec(ex: Exec) -> None:
    """Count an ended command and its running time."""
    EXECS.labels(ex.state.name.lower()).inc()
    if ex.start_time is not None and ex.end_time is not None:
        EXEC_SECONDS.observe(ex.end_time - ex.start_time)
    if getattr(ex, "oom_killed", False):
        OOM_KILLS.inc()


def reason_kind(reason: str) -> str:
    """A small label set for why a sandbox ended (ttl, heartbeat, client, service stop, other)."""
    for needle, kind in (("ttl", "ttl"), ("heartbeat", "heartbeat"), ("client", "client"), ("stopped", "shutdown")):
        if needle in reason:
            return kind
    return "other"


class ManagerCollector(Collector):
    """Gauges read from the manager at scrape time: sandboxes by state and commands waiting."""

    def __init__(self, manager: SandboxManager) -> None:
        self._manager = manager

    def collect(self) -> Iterator[GaugeMetricFamily]:
        states = Tally(sb.state for sb in self._manager.sandboxes.values())
        alive = GaugeMetricFamily("orchard_env_sandboxes", "Sandboxes held, by state.", labels=["state"])
        for state in SandboxState:
            if state is not SandboxState.DELETED:
                alive.add_metric([state.name.lower()], states.get(state, 0))
        yield alive
        yield GaugeMetricFamily(
            "orchard_env_execs_queued",
            "Commands waiting for their sandbox or a slot.",
            value=self._manager.commands.queued,
        )
        yield GaugeMetricFamily(
            "orchard_env_browser_processes",
            "Chromium processes running browser sandboxes.",
            value=self._manager.browsers.processes,
        )


def register(manager: SandboxManager) -> ManagerCollector:
    """Export manager's gauges; unregister() the result when the manager closes."""
    collector = ManagerCollector(manager)
    REGISTRY.register(collector)
    return collector


def unregister(collector: ManagerCollector) -> None:
    REGISTRY.unregister(collector)
