"""AsyncSandboxClient: the async SDK's entry point. It creates, finds, lists and deletes sandboxes (and the
snapshots they are forked from), and deletes the ones it created when it closes (auto_cleanup)."""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import uuid
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from types import TracebackType
from typing import Self

from orchard.env.v1 import env_pb2 as pb
from orchard.errors import InvalidArgument, NotFound, Unavailable
from orchard.sdk.config import ClientConfig, load_config
from orchard.sdk.results import ImageInfo, SnapshotInfo, sandbox_info, snapshot_info
from orchard.sdk.sandbox import AsyncSandbox, duration
from orchard.sdk.transport import Transport
from orchard.sdk.units import cpu_millis, memory_bytes

log = logging.getLogger("orchard.sdk")

PREFIX_LABEL = "orchard.prefix"
"""Label set on sandboxes created by a client with a prefix."""
OPEN_EGRESS = (pb.EgressRule(cidr="0.0.0.0/0"), pb.EgressRule(cidr="::/0"))
BUILD_TIMEOUT_S = 1800.0
"""Longest an image build may take (debootstrap of a suite with many packages on a slow mirror)."""
ISOLATION = {None: pb.ISOLATION_UNSPECIFIED, "container": pb.ISOLATION_CONTAINER, "gvisor": pb.ISOLATION_GVISOR}
CLEANUP_CONCURRENCY = 64


def egress_rule(item: str) -> pb.EgressRule:
    """An allow item as a rule: "HOST", "HOST:PORT", "CIDR", "CIDR:PORT" (an address is a one-address CIDR;
    IPv6 with a port in brackets: "[::1]:8080"). Raises ValueError."""
    text = item.strip()
    port = ""
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        port = rest.removeprefix(":") if rest.startswith(":") else rest
        if rest and not rest.startswith(":"):
            raise ValueError(f"allow item {item!r}: expected [IPv6]:PORT")
    elif "/" in text:
        network, _, rest = text.partition("/")
        prefix, _, port = rest.partition(":")
        host = f"{network}/{prefix}"
    elif text.count(":") == 1:
        host, _, port = text.partition(":")
    else:
        host = text  # a name, an IPv4 address, or a bare IPv6 address
    if port and not (port.isdigit() and 0 < int(port) < 65536):
        raise ValueError(f"allow item {item!r}: port {port!r} is not 1..65535")
    if not host:
        raise ValueError(f"allow item {item!r} names no host or network")
    try:
        ipaddress.ip_network(host, strict=False)
    except ValueError:
        if "/" in host or ":" in host:
            raise ValueError(f"allow item {item!r}: {host!r} is not an IP network") from None
        return pb.EgressRule(host=host, port=int(port or 0))
    return pb.EgressRule(cidr=host, port=int(port or 0))


class AsyncSandboxPager:
    """Sandboxes matching a label selector, fetched one page at a time as you iterate.

    `async for sandbox in client.list_sandboxes(...)` walks every item; `pages()` gives whole pages.
    """

    def __init__(self, client: AsyncSandboxClient, labels: Mapping[str, str], page_size: int) -> None:
        self._client = client
        self._labels = dict(labels)
        self._page_size = page_size

    async def pages(self) -> AsyncIterator[list[AsyncSandbox]]:
        token = ""
        while True:
            request = pb.ListSandboxesRequest(label_selector=self._labels, page_size=self._page_size, page_token=token)
            response = await self._client._transport.unary("ListSandboxes", request, idempotent=True)
            yield [AsyncSandbox(self._client, sandbox_info(sb)) for sb in response.sandboxes]
            token = response.next_page_token
            if not token:
                return

    async def _items(self) -> AsyncIterator[AsyncSandbox]:
        async for page in self.pages():
            for sandbox in page:
                yield sandbox

    def __aiter__(self) -> AsyncIterator[AsyncSandbox]:
        return self._items()


class AsyncSandboxClient:
    """Client of the Orchard env service.

    Use `async with AsyncSandboxClient() as client:` or `client = await AsyncSandboxClient.connect()`.

    Args:
        target: "host:port" (or "http(s)://host:port"); else ORCHARD_ENV_ADDRESS, SANDBOX_BASE_URL,
            then 127.0.0.1:50051.
        timeout: deadline in seconds of one call (exec waits follow the command's own timeout).
        auto_cleanup: delete every sandbox this client created when it closes.
        api_key: bearer token; else ORCHARD_API_KEY or SANDBOX_API_KEY.
        prefix: prepended to the ids of sandboxes created here, and set as label "orchard.prefix";
            else SANDBOX_PREFIX.
        connect_timeout: how long to wait for the service before failing with Unavailable.
    """

    def __init__(
        self,
        target: str | None = None,
        timeout: float = 300.0,
        auto_cleanup: bool = True,
        api_key: str | None = None,
        prefix: str | None = None,
        *,
        connect_timeout: float = 3.0,
    ) -> None:
        self.config: ClientConfig = load_config(target, api_key, prefix)
        self.auto_cleanup = auto_cleanup
        self._transport = Transport(self.config, timeout=timeout, connect_timeout=connect_timeout)
        self._created: set[str] = set()
        self._snapshots: set[str] = set()  # taken through this client (AsyncSandbox.snapshot)

    @classmethod
    async def connect(
        cls,
        target: str | None = None,
        timeout: float = 300.0,
        auto_cleanup: bool = True,
        api_key: str | None = None,
        prefix: str | None = None,
        *,
        connect_timeout: float = 3.0,
    ) -> AsyncSandboxClient:
        """A client whose connection is already up; raises Unavailable (a ConnectionError) fast if it cannot be."""
        client = cls(target, timeout, auto_cleanup, api_key, prefix, connect_timeout=connect_timeout)
        await client._transport.connect()
        return client

    @property
    def target(self) -> str:
        return self.config.target

    @property
    def timeout(self) -> float:
        return self._transport.timeout

    async def create_sandbox(
        self,
        image: str = "",
        block_network: bool = True,
        sandbox_id: str | None = None,
        cpu: str | float | None = None,
        memory: str | int | None = None,
        timeout: float | None = 3600,
        wait_ready: bool = True,
        env: Mapping[str, str] | None = None,
        labels: Mapping[str, str] | None = None,
        from_snapshot: str | None = None,
        isolation: str | None = None,
    ) -> AsyncSandbox:
        """Create a sandbox from `image` (or from a snapshot) and return it ready.

        Args:
            image: e.g. "python:3.11-slim", or "host" (the host's root, read-only, with a writable layer);
                may be empty with from_snapshot (the snapshot's image is used).
            block_network: no network at all (the default); False allows all egress.
            sandbox_id: the id to use; generated when None.
            cpu: CPU limit, e.g. "4", "500m" or 0.5; the service default when None.
            memory: memory limit, e.g. "16Gi", or bytes; the service default when None.
            timeout: the sandbox's lifetime (TTL) in seconds; the service default when None.
            wait_ready: accepted for compatibility; the service always answers once the sandbox is ready.
            env: environment variables every command gets.
            labels: labels for filtering (list_sandboxes) and bulk cleanup.
            from_snapshot: the id of a snapshot (AsyncSandbox.snapshot) whose files the sandbox starts with;
                it stacks them over its image without copying, so forking many is about as fast as creating many.
            isolation: "container" (namespaces and seccomp) or "gvisor" (a user-space kernel; docker and
                kubernetes backends); the service default when None.
        """
        if isolation not in ISOLATION:
            raise InvalidArgument(f"isolation {isolation!r} is not one of 'container', 'gvisor'", field="isolation")
        labels = dict(labels or {})
        prefix = self.config.prefix
        if prefix:
            if not (sandbox_id and sandbox_id.startswith(f"{prefix}-")):
                sandbox_id = f"{prefix}-{sandbox_id or uuid.uuid4().hex[:12]}"
            labels.setdefault(PREFIX_LABEL, prefix)
        request = pb.CreateSandboxRequest(
            image=image,
            resources=pb.Resources(cpu_millis=cpu_millis(cpu), memory_bytes=memory_bytes(memory)),
            env=dict(env or {}),
            labels=labels,
            ttl=duration(timeout or 0),
            network_policy=pb.NetworkPolicy(allow=[] if block_network else OPEN_EGRESS),
            sandbox_id=sandbox_id or "",
            from_snapshot=from_snapshot or "",
            isolation=ISOLATION[isolation],
            request_id=uuid.uuid4().hex,  # one per create, kept across retries: a retry never makes a second sandbox
        )
        response = await self._transport.unary("CreateSandbox", request, idempotent=True)
        sandbox = AsyncSandbox(self, sandbox_info(response.sandbox))
        self._created.add(sandbox.sandbox_id)
        return sandbox

    async def create_browser(
        self,
        allow: Sequence[str] = (),
        *,
        sandbox_id: str | None = None,
        timeout: float | None = 3600,
        labels: Mapping[str, str] | None = None,
    ) -> AsyncSandbox:
        """Create a browser sandbox (a fresh headless Chromium context and page) and return it ready; drive it
        with screenshot(), act() and page_content().

        Args:
            allow: where its page may connect; nothing else is reachable (about:, data: and blob: always work).
                Each item is "HOST" (that name exactly), "HOST:PORT", "CIDR" or "CIDR:PORT" (an address is a
                one-address CIDR), e.g. "127.0.0.1:8080", "example.com", "10.0.0.0/8:443"; no port = any port.
            sandbox_id: the id to use; generated when None.
            timeout: the sandbox's lifetime (TTL) in seconds; the service default when None.
            labels: labels for filtering (list_sandboxes) and bulk cleanup.
        """
        if isinstance(allow, str):
            raise TypeError("allow is a sequence of items like ['127.0.0.1:8080'], not one string")
        rules = [egress_rule(item) for item in allow]
        labels = dict(labels or {})
        prefix = self.config.prefix
        if prefix:
            if not (sandbox_id and sandbox_id.startswith(f"{prefix}-")):
                sandbox_id = f"{prefix}-{sandbox_id or uuid.uuid4().hex[:12]}"
            labels.setdefault(PREFIX_LABEL, prefix)
        request = pb.CreateSandboxRequest(
            kind=pb.SANDBOX_KIND_BROWSER,
            labels=labels,
            ttl=duration(timeout or 0),
            network_policy=pb.NetworkPolicy(allow=rules),
            sandbox_id=sandbox_id or "",
            request_id=uuid.uuid4().hex,
        )
        response = await self._transport.unary("CreateSandbox", request, idempotent=True)
        sandbox = AsyncSandbox(self, sandbox_info(response.sandbox))
        self._created.add(sandbox.sandbox_id)
        return sandbox

    async def get_sandbox(self, sandbox_id: str) -> AsyncSandbox:
        """An existing sandbox; raises NotFound (with the reason when it was deleted or expired)."""
        response = await self._transport.unary(
            "GetSandbox", pb.GetSandboxRequest(sandbox_id=sandbox_id), idempotent=True
        )
        return AsyncSandbox(self, sandbox_info(response.sandbox))

    async def delete_sandbox(self, sandbox_id: str) -> bool:
        """Delete a sandbox; returns False if it was already gone."""
        try:
            await self._transport.unary(
                "DeleteSandbox", pb.DeleteSandboxRequest(sandbox_id=sandbox_id), idempotent=True
            )
        except NotFound:
            self._created.discard(sandbox_id)
            return False
        self._created.discard(sandbox_id)
        return True

    def list_sandboxes(self, labels: Mapping[str, str] | None = None, page_size: int = 100) -> AsyncSandboxPager:
        """Every sandbox carrying all of `labels` (all sandboxes when None), ordered by id."""
        return AsyncSandboxPager(self, labels or {}, page_size)

    async def get_snapshot(self, snapshot_id: str) -> SnapshotInfo:
        """A snapshot; raises NotFound."""
        response = await self._transport.unary(
            "GetSnapshot", pb.GetSnapshotRequest(snapshot_id=snapshot_id), idempotent=True
        )
        return snapshot_info(response.snapshot)

    async def build_image(
        self,
        name: str,
        *,
        suite: str = "",
        packages: Sequence[str] = (),
        pip: Sequence[str] = (),
        description: str = "",
        force: bool = False,
        progress: Callable[[str, int, int, str], None] | None = None,
        timeout: float = BUILD_TIMEOUT_S,
    ) -> ImageInfo:
        """Build sandbox image `name` on the service's machine; returns at once when it is built already.

        A new name needs its recipe: `suite` (bullseye, bookworm or trixie: Python 3.9, 3.11 or 3.13) and its
        Debian `packages` (git required; python3-pip too with `pip`), optionally `pip` requirements installed
        system-wide.
        `progress(stage, done, total, message)` is called for every step (debootstrap takes about a minute).
        """
        request = pb.BuildImageRequest(name=name, force=force)
        if suite:
            request.recipe.CopyFrom(
                pb.ImageRecipe(suite=suite, packages=list(packages), pip=list(pip), description=description)
            )
        async for event in self._transport.server_stream("BuildImage", request, timeout=timeout):
            if event.WhichOneof("event") == "progress":
                if progress is not None:
                    p = event.progress
                    progress(p.stage, p.done, p.total, p.message)
            else:
                return ImageInfo(
                    name=event.image.name, size=event.image.size_bytes, description=event.image.description
                )
        raise Unavailable(f"the build of image {name!r} ended without an image")

    async def list_snapshots(self, labels: Mapping[str, str] | None = None) -> list[SnapshotInfo]:
        """Every snapshot carrying all of `labels` (all snapshots when None), ordered by id."""
        found: list[SnapshotInfo] = []
        token = ""
        while True:
            request = pb.ListSnapshotsRequest(label_selector=dict(labels or {}), page_size=1000, page_token=token)
            response = await self._transport.unary("ListSnapshots", request, idempotent=True)
            found += [snapshot_info(s) for s in response.snapshots]
            token = response.next_page_token
            if not token:
                return found

    async def delete_snapshot(self, snapshot_id: str) -> bool:
        """Delete a snapshot; returns False if it was already gone. Sandboxes made from it keep running (its
        files stay on disk until the last of them is deleted)."""
        try:
            await self._transport.unary(
                "DeleteSnapshot", pb.DeleteSnapshotRequest(snapshot_id=snapshot_id), idempotent=True
            )
        except NotFound:
            self._snapshots.discard(snapshot_id)
            return False
        self._snapshots.discard(snapshot_id)
        return True

    async def cleanup_all(self) -> list[str]:
        """Delete every sandbox this client created and has not deleted yet; returns the ids deleted now."""
        ids = sorted(self._created)
        slots = asyncio.Semaphore(CLEANUP_CONCURRENCY)

        async def delete(sandbox_id: str) -> bool:
            async with slots:
                return await self.delete_sandbox(sandbox_id)

        results = await asyncio.gather(*(delete(i) for i in ids), return_exceptions=True)
        failures = [r for r in results if isinstance(r, BaseException)]
        if failures:
            raise failures[0]
        return [i for i, deleted in zip(ids, results, strict=True) if deleted is True]

    async def close(self) -> None:
        """Delete the sandboxes this client created and the snapshots it took (with auto_cleanup), then close
        the connection."""
        try:
            if self.auto_cleanup and self._created:
                await self.cleanup_all()
            if self.auto_cleanup and self._snapshots:
                await asyncio.gather(*(self.delete_snapshot(i) for i in sorted(self._snapshots)))
        except Exception as err:
            log.warning(
                "could not delete every sandbox and snapshot this client made (%s); sandboxes %s remain "
                "until their ttl, snapshots %s until deleted or the service stops",
                err,
                sorted(self._created),
                sorted(self._snapshots),
            )
        finally:
            await self._transport.close()

    async def __aenter__(self) -> Self:
        await self._transport.connect()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"AsyncSandboxClient(target={self.target!r})"
