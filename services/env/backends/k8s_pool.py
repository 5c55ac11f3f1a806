"""Warm pools of the kubernetes backend: per sandbox image, pods created ahead and kept started, so a create
that fits takes one whose agent already listens instead of waiting for a pod to be scheduled and started."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from orchard.services.env.backends.k8s_watch import PodCache

log = logging.getLogger(__name__)

RECHECK_S = 5.0  # how often pods that died while waiting are looked for without a take waking the filler
RETRY_S = 5.0  # after a failed create (quota, API down), before the next try


@dataclass(frozen=True)
class WarmPod:
    """A pod waiting in a pool, with its agent's token."""

    name: str
    token: str
    image: str
    created_s: float


class WarmPools:
    """Keeps sizes[image] started pods per image; take() hands one out and the filler task replaces it."""

    def __init__(
        self,
        sizes: dict[str, int],
        cache: PodCache,
        *,
        create: Callable[[str], Awaitable[WarmPod]],
        delete: Callable[[str], Awaitable[None]],
    ) -> None:
        self._sizes = {image: n for image, n in sizes.items() if n > 0}
        self._cache = cache
        self._create = create
        self._delete = delete
        self._pods: dict[str, list[WarmPod]] = {image: [] for image in self._sizes}
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._sizes:
            self._task = asyncio.create_task(self._fill_forever(), name="k8s-warm-pools")

    def waiting(self, image: str) -> list[WarmPod]:
        """The pods of image's pool, started or not (a copy)."""
        return list(self._pods.get(image, []))

    def take(self, image: str) -> WarmPod | None:
        """A started pod of image's pool, now the caller's; None when none is started yet."""
        pods = self._pods.get(image, [])
        for pod in pods:
            state = self._cache.get(pod.name)
            if state is not None and state.running and not state.ended:
                pods.remove(pod)
                self._wake.set()
                return pod
        return None

    async def _fill_forever(self) -> None:
        while True:
            self._wake.clear()
            try:
                await self._fill()
            except Exception:
                log.exception("refilling the warm pools failed; retrying in %.0fs", RETRY_S)
                await asyncio.sleep(RETRY_S)
                continue
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(RECHECK_S):
                    await self._wake.wait()

    async def _fill(self) -> None:
        """Replace pods that died while waiting, then create what each pool lacks (together)."""
        for pods in self._pods.values():
            dead = [p for p in pods if (s := self._cache.get(p.name)) is not None and s.ended]
            for pod in dead:
                log.warning(
                    "warm pod %s of %s died while waiting (%s); replacing it",
                    pod.name,
                    pod.image,
                    self._cache.get(pod.name).ended,  # type: ignore[union-attr]
                )
                pods.remove(pod)
                await self._delete(pod.name)
        wanted = [image for image, n in self._sizes.items() for _ in range(n - len(self._pods[image]))]
        made = await asyncio.gather(*(self._create(image) for image in wanted), return_exceptions=True)
        failures = [m for m in made if isinstance(m, BaseException)]
        for made_pod in made:
            if isinstance(made_pod, WarmPod):
                self._pods[made_pod.image].append(made_pod)
        if failures:
            raise failures[0]

    async def close(self) -> None:
        """Stop refilling and delete every waiting pod."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        pods = [p for pods in self._pods.values() for p in pods]
        self._pods = {image: [] for image in self._sizes}
        await asyncio.gather(*(self._delete(p.name) for p in pods), return_exceptions=True)
