"""The kubernetes backend's view of its own pods: one list + watch of the API (resumed from the last
resourceVersion, relisted when that is too old) feeds a cache that creates wait on, so no request polls the API."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from orchard.services.env.backends.k8s_manifests import CONTAINER

log = logging.getLogger(__name__)

WATCH_TIMEOUT_S = 300  # the server ends a watch after this; it is resumed from the last resourceVersion
RETRY_S = 1.0


@dataclass(frozen=True)
class PodState:
    """What the cache knows of one pod, from its last event."""

    name: str
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    phase: str = "Pending"
    ip: str = ""
    running: bool = False
    """The sandbox container runs (its agent may take a moment more to listen)."""
    ended: str = ""
    """Why the pod can never serve: a terminated container's reason, a failed phase, or deletion."""
    oom_killed: bool = False

    @classmethod
    def of(cls, pod: dict[str, Any]) -> PodState:
        meta, status = pod.get("metadata") or {}, pod.get("status") or {}
        phase = status.get("phase") or "Pending"
        running, ended, oom = False, "", False
        for cs in status.get("containerStatuses") or []:
            if cs.get("name") != CONTAINER:
                continue
            state = cs.get("state") or {}
            running = "running" in state
            for term in (state.get("terminated"), (cs.get("lastState") or {}).get("terminated")):
                if term:
                    oom = oom or term.get("reason") == "OOMKilled"
            if state.get("terminated"):
                ended = f"its container ended: {_terminated(state['terminated'])}"
            waiting = (state.get("waiting") or {}).get("reason", "")
            if waiting in (
                "ErrImagePull",
                "ImagePullBackOff",
                "InvalidImageName",
                "CreateContainerConfigError",
                "CreateContainerError",
            ):
                ended = f"its container cannot start: {waiting}: {state['waiting'].get('message', '')}".rstrip(": ")
        if phase in ("Failed", "Succeeded"):
            why = _joined(status.get("reason"), status.get("message"))
            if why or not ended:  # the pod's own reason (Evicted, DeadlineExceeded ...) comes first
                ended = "; ".join(filter(None, (f"pod {phase.lower()}: {why or 'no reason given'}", ended)))
        return cls(
            name=meta.get("name", ""),
            labels=dict(meta.get("labels") or {}),
            annotations=dict(meta.get("annotations") or {}),
            phase=phase,
            ip=status.get("podIP") or "",
            running=running and bool(status.get("podIP")),
            ended=ended,
            oom_killed=oom,
        )


def _joined(*texts: str | None) -> str:
    return ": ".join(t for t in texts if t)


def _terminated(term: dict[str, Any]) -> str:
    """A terminated container state as text: its reason, exit code and message."""
    text = f"{term.get('reason') or 'terminated'} (exit code {term.get('exitCode', '?')})"
    return _joined(text, (term.get("message") or "").strip()[:500])


def deleted_reason(pod: dict[str, Any]) -> str:
    """Why a pod that the API deleted is gone, with the disruption the API recorded for it, if any (eviction,
    preemption, a lost node's taint)."""
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "DisruptionTarget" and cond.get("status") == "True":
            return f"the pod was deleted ({_joined(cond.get('reason'), cond.get('message'))})"
    return "the pod was deleted"


class PodCache:
    """Pods by name, kept current by a watch thread; waiters get an asyncio.Event per pod."""

    def __init__(
        self,
        list_pods: Callable[..., Any],
        *,
        namespace: str,
        selector: str,
        on_ended: Callable[[PodState], None] = lambda state: None,
    ) -> None:
        self._list_pods = list_pods  # CoreV1Api.list_namespaced_pod
        self._on_ended = on_ended  # told once per pod, on the loop, when it turns ended
        self._namespace = namespace
        self._selector = selector
        self._pods: dict[str, PodState] = {}
        self._changed: dict[str, asyncio.Event] = {}
        self._synced = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop = threading.Event()
        self._response: Any = None  # the open watch, shut down to unblock the thread on close
        self._thread: threading.Thread | None = None

    def get(self, name: str) -> PodState | None:
        return self._pods.get(name)

    async def start(self, timeout: float) -> None:
        """Start watching; return once the first listing is in."""
        self._loop = asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._run, name="k8s-pod-watch", daemon=True)
        self._thread.start()
        async with asyncio.timeout(timeout):
            await self._synced.wait()

    async def wait(self, name: str, ok: Callable[[PodState], bool], timeout: float) -> PodState:
        """The pod's state once ok(state) or it ended; TimeoutError after timeout."""
        async with asyncio.timeout(timeout):
            while True:
                state = self._pods.get(name)
                if state is not None and (ok(state) or state.ended):
                    return state
                event = self._changed.setdefault(name, asyncio.Event())
                event.clear()
                await event.wait()

    def forget(self, name: str) -> None:
        self._changed.pop(name, None)

    async def close(self) -> None:
        self._stop.set()
        response = self._response
        if response is not None:
            response.shutdown()  # unblocks the thread's read at once
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, 5)

    # ---- on the event loop ----

    def _apply(self, kind: str, pods: list[dict[str, Any]]) -> None:
        before = self._pods  # a SYNC replaces the dict; an event's one pod is kept below
        if kind == "SYNC":  # a fresh listing replaces everything
            states = [PodState.of(p) for p in pods]
            gone = set(self._pods) - {s.name for s in states}
            self._pods = {s.name: s for s in states}
            for name in gone:
                self._pods[name] = PodState(name=name, ended="the pod was deleted")
            self._synced.set()
            names = set(self._pods)
        else:
            state = PodState.of(pods[0])
            if kind == "DELETED":
                state = PodState(
                    name=state.name,
                    labels=state.labels,
                    annotations=state.annotations,
                    ended=deleted_reason(pods[0]),
                    oom_killed=state.oom_killed,
                )
            before = {state.name: was} if (was := self._pods.get(state.name)) is not None else {}
            self._pods[state.name] = state
            names = {state.name}
        for name in names:
            was, now = before.get(name), self._pods[name]
            if now.ended and not (was is not None and was.ended):
                self._on_ended(now)
            event = self._changed.get(name)
            if event is not None:
                event.set()

    def _post(self, kind: str, pods: list[dict[str, Any]]) -> None:
        assert self._loop is not None
        try:
            self._loop.call_soon_threadsafe(self._apply, kind, pods)
        except RuntimeError:  # the loop is closed: we are shutting down
            self._stop.set()

    # ---- on the watch thread ----

    def _run(self) -> None:
        from kubernetes.client.exceptions import ApiException

        version = ""
        while not self._stop.is_set():
            try:
                if not version:
                    version = self._relist()
                version = self._watch(version)
            except ApiException as err:
                if err.status == 410:  # our version is too old: list afresh
                    version = ""
                    continue
                log.warning("pod watch failed, retrying in %.0fs: %s", RETRY_S, err)
                self._stop.wait(RETRY_S)
            except Exception as err:  # noqa: BLE001 - the API is unreachable for a while: retry
                if self._stop.is_set():
                    return
                log.warning("pod watch failed, retrying in %.0fs: %s", RETRY_S, err)
                self._stop.wait(RETRY_S)

    def _relist(self) -> str:
        response = self._list_pods(
            self._namespace, label_selector=self._selector, _preload_content=False, _request_timeout=30
        )
        listing = json.loads(response.data)
        self._post("SYNC", listing.get("items") or [])
        return listing["metadata"]["resourceVersion"]

    def _watch(self, version: str) -> str:
        """Follow the watch from version until the server ends it; the version to resume from ("": relist)."""
        from kubernetes.watch.watch import iter_resp_lines

        response = self._list_pods(
            self._namespace,
            label_selector=self._selector,
            watch=True,
            resource_version=version,
            allow_watch_bookmarks=True,
            timeout_seconds=WATCH_TIMEOUT_S,
            _preload_content=False,
        )
        self._response = response
        try:
            for line in iter_resp_lines(response):
                event = json.loads(line)
                obj = event.get("object") or {}
                if event.get("type") == "ERROR":
                    if obj.get("code") == 410:  # our version is too old: list afresh
                        return ""
                    raise RuntimeError(f"watch error: {obj.get('message', obj)}")
                version = obj.get("metadata", {}).get("resourceVersion", version)
                if event.get("type") in ("ADDED", "MODIFIED", "DELETED"):
                    self._post(event["type"], [obj])
        finally:
            self._response = None
            response.release_conn()
        return version
