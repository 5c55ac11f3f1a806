"""EnvService servicer: translates protos to the manager's domain calls and back, nothing else.
Errors raised below are OrchardErrors; the runtime's interceptor maps them to status codes."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import grpc

from orchard.env.v1 import env_pb2 as pb
from orchard.env.v1 import env_pb2_grpc
from orchard.errors import InvalidArgument, OrchardError
from orchard.prototime import duration, span_of, timestamp
from orchard.services.env.agent_client import PtySession
from orchard.services.env.backends.base import EgressRule, Resources
from orchard.services.env.browser import BrowserSession
from orchard.services.env.browser_actions import Action, ActionKind, check_action
from orchard.services.env.commands import ExecRequest
from orchard.services.env.files import FileInfo
from orchard.services.env.images import BuildProgress, Recipe
from orchard.services.env.manager import CreateRequest, SandboxManager
from orchard.services.env.models import Exec, Sandbox, SandboxKind, Snapshot

PTY_STARTED_KEY = "orchard-pty-started"
"""Initial metadata OpenPty sends once the program runs (a failed start ends the call without it)."""
KINDS = {
    pb.SANDBOX_KIND_UNSPECIFIED: SandboxKind.CONTAINER,
    pb.SANDBOX_KIND_CONTAINER: SandboxKind.CONTAINER,
    pb.SANDBOX_KIND_BROWSER: SandboxKind.BROWSER,
}
ACTIONS = {
    pb.ACTION_TYPE_CLICK: ActionKind.CLICK,
    pb.ACTION_TYPE_DOUBLE_CLICK: ActionKind.DOUBLE_CLICK,
    pb.ACTION_TYPE_TYPE: ActionKind.TYPE,
    pb.ACTION_TYPE_KEY_PRESS: ActionKind.KEY_PRESS,
    pb.ACTION_TYPE_SCROLL: ActionKind.SCROLL,
    pb.ACTION_TYPE_NAVIGATE: ActionKind.NAVIGATE,
    pb.ACTION_TYPE_BACK: ActionKind.BACK,
    pb.ACTION_TYPE_WAIT: ActionKind.WAIT,
}
ISOLATIONS = {pb.ISOLATION_UNSPECIFIED: "", pb.ISOLATION_CONTAINER: "container", pb.ISOLATION_GVISOR: "gvisor"}
FILE_TYPES = {"file": pb.FILE_TYPE_FILE, "directory": pb.FILE_TYPE_DIRECTORY, "symlink": pb.FILE_TYPE_SYMLINK}


def sandbox_pb(sb: Sandbox) -> pb.Sandbox:
    r = sb.resources
    return pb.Sandbox(
        name=f"sandboxes/{sb.sandbox_id}",
        sandbox_id=sb.sandbox_id,
        kind=sb.kind.value,
        image=sb.image,
        state=sb.state.value,
        failure_reason=sb.failure_reason,
        resources=pb.Resources(
            cpu_millis=r.cpu_millis, memory_bytes=r.memory_bytes, pids=r.pids, disk_bytes=r.disk_bytes
        ),
        env=sb.env,
        labels=sb.labels,
        network_policy=pb.NetworkPolicy(
            allow=[pb.EgressRule(cidr=e.cidr, host=e.host, port=e.port) for e in sb.egress]
        ),
        workdir=sb.workdir,
        create_time=timestamp(sb.create_time),
        expire_time=timestamp(sb.expire_time),
        ttl=duration(sb.ttl_s),
        heartbeat_timeout=duration(sb.heartbeat_timeout_s),
        last_heartbeat_time=timestamp(sb.last_heartbeat_time),
        tenant=sb.tenant,
        from_snapshot=sb.from_snapshot,
        isolation={v: k for k, v in ISOLATIONS.items()}.get(sb.isolation, pb.ISOLATION_UNSPECIFIED),
    )


def snapshot_pb(snap: Snapshot) -> pb.Snapshot:
    return pb.Snapshot(
        name=f"snapshots/{snap.snapshot_id}",
        snapshot_id=snap.snapshot_id,
        sandbox_id=snap.sandbox_id,
        image=snap.image,
        size_bytes=snap.size_bytes,
        create_time=timestamp(snap.create_time),
        labels=snap.labels,
        tenant=snap.tenant,
        keep=snap.keep,
    )


async def exec_pb(ex: Exec, *, read_cap: int = 0) -> pb.Exec:
    """The exec as a message, with up to read_cap bytes of each stream (none when 0)."""
    msg = pb.Exec(
        name=f"sandboxes/{ex.sandbox_id}/execs/{ex.exec_id}",
        exec_id=ex.exec_id,
        sandbox_id=ex.sandbox_id,
        command=ex.command,
        state=ex.state.value,
        exit_code=ex.exit_code,
        stdout_truncated=ex.truncated(1),
        stderr_truncated=ex.truncated(2),
        stdout_total_bytes=ex.totals[0],
        stderr_total_bytes=ex.totals[1],
        error=ex.error,
        create_time=timestamp(ex.create_time),
        start_time=timestamp(ex.start_time),
        end_time=timestamp(ex.end_time),
        timeout=duration(ex.timeout_s),
        oom_killed=ex.oom_killed,
    )
    if read_cap:
        msg.stdout, msg.stderr = await ex.output(1, 0, read_cap), await ex.output(2, 0, read_cap)
        msg.stdout_partial = ex.out.kept[0] > len(msg.stdout)
        msg.stderr_partial = ex.out.kept[1] > len(msg.stderr)
    if ex.start_time is not None and ex.end_time is not None:
        msg.duration.CopyFrom(duration(ex.end_time - ex.start_time))
    return msg


def file_pb(info: FileInfo) -> pb.FileInfo:
    return pb.FileInfo(
        name=info.name,
        path=info.path,
        type=FILE_TYPES.get(info.type, pb.FILE_TYPE_UNSPECIFIED),
        size_bytes=info.size,
        mode=info.mode,
        modify_time=timestamp(info.mtime),
    )


async def _relay_pty_input(requests: AsyncIterator[pb.OpenPtyRequest], session: PtySession) -> None:
    """Pass keystrokes and resizes to the session; a bad message kills the program, and is raised."""
    try:
        async for message in requests:
            part = message.WhichOneof("part")
            if part == "input":
                await session.send_input(message.input)
            elif part == "resize":
                await session.resize(message.resize.rows, message.resize.cols)
            else:
                raise InvalidArgument("start may only be the first message of a PTY session", field="start")
    except OrchardError:
        await session.kill()
        raise


class EnvServicer(env_pb2_grpc.EnvServiceServicer):
    """gRPC face of the SandboxManager."""

    def __init__(self, manager: SandboxManager) -> None:
        self.manager = manager

    async def _exec_pb(self, ex: Exec) -> pb.Exec:
        return await exec_pb(ex, read_cap=self.manager.commands.read_cap)

    async def CreateSandbox(
        self, request: pb.CreateSandboxRequest, context: grpc.aio.ServicerContext
    ) -> pb.CreateSandboxResponse:
        kind = KINDS.get(request.kind)
        if kind is None:
            raise InvalidArgument(
                f"kind {request.kind} is not a SandboxKind (SANDBOX_KIND_CONTAINER or SANDBOX_KIND_BROWSER)",
                field="kind",
            )
        if request.isolation not in ISOLATIONS:
            raise InvalidArgument(
                f"isolation {request.isolation} is not an Isolation (ISOLATION_CONTAINER or ISOLATION_GVISOR)",
                field="isolation",
            )
        res = request.resources
        if min(res.cpu_millis, res.memory_bytes, res.pids, res.disk_bytes) < 0:
            raise InvalidArgument("resources must not be negative", field="resources")
        sandbox = await self.manager.create_sandbox(
            CreateRequest(
                image=request.image,
                env=dict(request.env),
                labels=dict(request.labels),
                resources=Resources(res.cpu_millis, res.memory_bytes, res.pids, res.disk_bytes),
                egress=tuple(EgressRule(r.cidr, r.host, r.port) for r in request.network_policy.allow),
                ttl_s=span_of(request.ttl, "ttl"),
                heartbeat_timeout_s=span_of(request.heartbeat_timeout, "heartbeat_timeout"),
                sandbox_id=request.sandbox_id,
                request_id=request.request_id,
                workdir=request.workdir,
                from_snapshot=request.from_snapshot,
                kind=kind,
                isolation=ISOLATIONS[request.isolation],
            )
        )
        return pb.CreateSandboxResponse(sandbox=sandbox_pb(sandbox))

    async def GetSandbox(
        self, request: pb.GetSandboxRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetSandboxResponse:
        return pb.GetSandboxResponse(sandbox=sandbox_pb(self.manager.get_sandbox(request.sandbox_id)))

    async def ListSandboxes(
        self, request: pb.ListSandboxesRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListSandboxesResponse:
        page, token = self.manager.list_sandboxes(dict(request.label_selector), request.page_size, request.page_token)
        return pb.ListSandboxesResponse(sandboxes=[sandbox_pb(sb) for sb in page], next_page_token=token)

    async def DeleteSandbox(
        self, request: pb.DeleteSandboxRequest, context: grpc.aio.ServicerContext
    ) -> pb.DeleteSandboxResponse:
        return pb.DeleteSandboxResponse(sandbox=sandbox_pb(await self.manager.delete_sandbox(request.sandbox_id)))

    async def Heartbeat(self, request: pb.HeartbeatRequest, context: grpc.aio.ServicerContext) -> pb.HeartbeatResponse:
        return pb.HeartbeatResponse(sandbox=sandbox_pb(self.manager.heartbeat(request.sandbox_id)))

    async def SetNetworkPolicy(
        self, request: pb.SetNetworkPolicyRequest, context: grpc.aio.ServicerContext
    ) -> pb.SetNetworkPolicyResponse:
        sandbox = await self.manager.set_network_policy(
            request.sandbox_id, tuple(EgressRule(r.cidr, r.host, r.port) for r in request.network_policy.allow)
        )
        return pb.SetNetworkPolicyResponse(sandbox=sandbox_pb(sandbox))

    async def SnapshotSandbox(
        self, request: pb.SnapshotSandboxRequest, context: grpc.aio.ServicerContext
    ) -> pb.SnapshotSandboxResponse:
        snapshot = await self.manager.snapshots.take(
            request.sandbox_id, request.snapshot_id, dict(request.labels), request.request_id, keep=request.keep
        )
        return pb.SnapshotSandboxResponse(snapshot=snapshot_pb(snapshot))

    async def GetSnapshot(
        self, request: pb.GetSnapshotRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetSnapshotResponse:
        return pb.GetSnapshotResponse(snapshot=snapshot_pb(self.manager.snapshots.get(request.snapshot_id)))

    async def ListSnapshots(
        self, request: pb.ListSnapshotsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListSnapshotsResponse:
        page, token = self.manager.snapshots.list(dict(request.label_selector), request.page_size, request.page_token)
        return pb.ListSnapshotsResponse(snapshots=[snapshot_pb(s) for s in page], next_page_token=token)

    async def DeleteSnapshot(
        self, request: pb.DeleteSnapshotRequest, context: grpc.aio.ServicerContext
    ) -> pb.DeleteSnapshotResponse:
        snapshot = await self.manager.snapshots.delete(request.snapshot_id)
        return pb.DeleteSnapshotResponse(snapshot=snapshot_pb(snapshot))

    async def StartExec(self, request: pb.StartExecRequest, context: grpc.aio.ServicerContext) -> pb.StartExecResponse:
        which = request.WhichOneof("command")
        ex = self.manager.commands.start_exec(
            ExecRequest(
                sandbox_id=request.sandbox_id,
                argv=list(request.argv.args) if which == "argv" else None,
                shell=request.shell if which == "shell" else None,
                cwd=request.cwd,
                env=dict(request.env),
                stdin=request.stdin,
                timeout_s=span_of(request.timeout, "timeout"),
                login_shell=request.login_shell,
                max_output=request.max_output_bytes,
            )
        )
        if request.HasField("wait") and (wait_s := span_of(request.wait, "wait")) > 0:
            ex = await self.manager.commands.wait_exec(ex.exec_id, wait_s)
        return pb.StartExecResponse(exec=await self._exec_pb(ex))

    async def GetExec(self, request: pb.GetExecRequest, context: grpc.aio.ServicerContext) -> pb.GetExecResponse:
        return pb.GetExecResponse(exec=await self._exec_pb(self.manager.commands.get_exec(request.exec_id)))

    async def WaitExec(self, request: pb.WaitExecRequest, context: grpc.aio.ServicerContext) -> pb.WaitExecResponse:
        ex = await self.manager.commands.wait_exec(request.exec_id, span_of(request.timeout, "timeout"))
        return pb.WaitExecResponse(exec=await self._exec_pb(ex), done=ex.state.done)

    async def StreamExec(
        self, request: pb.StreamExecRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.StreamExecResponse]:
        async for fd, data in self.manager.commands.stream_exec(request.exec_id):
            yield pb.StreamExecResponse(stdout=data) if fd == 1 else pb.StreamExecResponse(stderr=data)
        ex = self.manager.commands.get_exec(request.exec_id)
        yield pb.StreamExecResponse(exit=await exec_pb(ex))

    async def BuildImage(
        self, request: pb.BuildImageRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.BuildImageResponse]:
        recipe = None
        if request.HasField("recipe"):
            r = request.recipe
            recipe = Recipe(
                suite=r.suite,
                variant="minbase",
                packages=tuple(r.packages),
                pip=tuple(r.pip),
                description=r.description or f"{request.name}: {r.suite} with {' '.join(r.packages)}",
            )
        steps: asyncio.Queue[BuildProgress] = asyncio.Queue()
        build = asyncio.create_task(self.manager.build_image(request.name, recipe, request.force, steps.put_nowait))
        try:
            while not build.done() or not steps.empty():
                getter = asyncio.ensure_future(steps.get())
                await asyncio.wait({getter, build}, return_when=asyncio.FIRST_COMPLETED)
                if getter.done():
                    p = getter.result()
                    yield pb.BuildImageResponse(
                        progress=pb.ImageBuildProgress(
                            stage=p.stage, done=p.done, total=p.total or 0, message=p.message
                        )
                    )
                else:
                    getter.cancel()
            image = build.result()
        finally:
            if not build.done():  # the client went away: stop building
                build.cancel()
                with contextlib.suppress(asyncio.CancelledError, OrchardError):
                    await build
        yield pb.BuildImageResponse(
            image=pb.SandboxImage(
                name=image.name,
                size_bytes=image.size_bytes,
                description=image.description,
                build_time=timestamp(image.build_time.timestamp() if image.build_time else None),
            )
        )

    async def ReadExecOutput(
        self, request: pb.ReadExecOutputRequest, context: grpc.aio.ServicerContext
    ) -> pb.ReadExecOutputResponse:
        data, kept, eof = await self.manager.commands.read_output(
            request.exec_id, int(request.stream), request.offset, request.limit
        )
        return pb.ReadExecOutputResponse(data=data, kept_bytes=kept, eof=eof)

    async def CancelExec(
        self, request: pb.CancelExecRequest, context: grpc.aio.ServicerContext
    ) -> pb.CancelExecResponse:
        ex = await self.manager.commands.cancel_exec(request.exec_id)
        return pb.CancelExecResponse(exec=await self._exec_pb(ex))

    async def ApplyPatch(
        self, request: pb.ApplyPatchRequest, context: grpc.aio.ServicerContext
    ) -> pb.ApplyPatchResponse:
        files, output = await self.manager.commands.apply_patch(
            request.sandbox_id, request.patch, request.cwd, span_of(request.timeout, "timeout")
        )
        return pb.ApplyPatchResponse(files=files, output=output)

    async def UploadFile(
        self, request_iterator: AsyncIterator[pb.UploadFileRequest], context: grpc.aio.ServicerContext
    ) -> pb.UploadFileResponse:
        stream = aiter(request_iterator)
        first = await anext(stream, None)
        if first is None or first.WhichOneof("part") != "header":
            raise InvalidArgument("the first message of an upload must be its header", field="header")
        header = first.header

        async def chunks() -> AsyncIterator[bytes]:
            async for message in stream:
                if message.WhichOneof("part") != "chunk":
                    raise InvalidArgument("only content chunks may follow the header", field="chunk")
                yield message.chunk
            # grpc.aio ends the request stream alike when the client finishes and when it cancels; a cancel
            # lands at the next await, so give it one before the upload is committed.
            await asyncio.sleep(0)

        path, size = await self.manager.files.upload(header.sandbox_id, header.path, header.mode, chunks())
        return pb.UploadFileResponse(path=path, size_bytes=size)

    async def DownloadFile(
        self, request: pb.DownloadFileRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.DownloadFileResponse]:
        info, content = await self.manager.files.download(request.sandbox_id, request.path)
        yield pb.DownloadFileResponse(info=file_pb(info))
        async for chunk in content:
            yield pb.DownloadFileResponse(chunk=chunk)

    async def ListFiles(self, request: pb.ListFilesRequest, context: grpc.aio.ServicerContext) -> pb.ListFilesResponse:
        path, files = await self.manager.files.list(request.sandbox_id, request.path)
        return pb.ListFilesResponse(path=path, files=[file_pb(f) for f in files])

    async def OpenPty(
        self, request_iterator: AsyncIterator[pb.OpenPtyRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.OpenPtyResponse]:
        requests = aiter(request_iterator)
        first = await anext(requests, None)
        if first is None or first.WhichOneof("part") != "start":
            raise InvalidArgument("the first message of a PTY session must be start", field="start")
        start = first.start
        async with self.manager.commands.open_pty(
            start.sandbox_id, list(start.argv), start.rows, start.cols, start.cwd, dict(start.env)
        ) as session:
            await context.send_initial_metadata(((PTY_STARTED_KEY, "1"),))  # the SDK waits for it: the session is up
            # Input in a task of its own, output here; leaving (the exit, an error, the client going away)
            # cancels the input task, and leaving the block kills the program's process tree.
            relay = asyncio.create_task(_relay_pty_input(requests, session), name="pty-input")
            try:
                async for event in session:
                    if event.kind == "out":
                        yield pb.OpenPtyResponse(output=event.data)
                    elif relay.done() and not relay.cancelled() and (err := relay.exception()) is not None:
                        raise err  # the session ended because of a bad input message: report that instead
                    else:
                        yield pb.OpenPtyResponse(exit_code=event.exit_code)
            finally:
                relay.cancel()
                await asyncio.gather(relay, return_exceptions=True)

    def _browser(self, sandbox_id: str) -> BrowserSession:
        session = self.manager.ready_browser(sandbox_id).browser
        assert session is not None
        return session

    async def Screenshot(
        self, request: pb.ScreenshotRequest, context: grpc.aio.ServicerContext
    ) -> pb.ScreenshotResponse:
        png, width, height, url, title = await self._browser(request.sandbox_id).screenshot(request.full_page)
        return pb.ScreenshotResponse(png=png, width=width, height=height, url=url, title=title)

    async def Act(self, request: pb.ActRequest, context: grpc.aio.ServicerContext) -> pb.ActResponse:
        session = self._browser(request.sandbox_id)
        s = self.manager.settings
        action = check_action(
            Action(
                kind=ACTIONS.get(request.action),
                x=request.x,
                y=request.y,
                selector=request.selector,
                text=request.text,
                key=request.key,
                delta_x=request.delta_x,
                delta_y=request.delta_y,
                url=request.url,
                timeout_s=span_of(request.timeout, "timeout"),
                screenshot=request.screenshot,
            ),
            s.browser_action_timeout_s,
            s.max_browser_action_timeout_s,
        )
        url, title, png = await session.act(action)
        return pb.ActResponse(url=url, title=title, png=png)

    async def GetPageContent(
        self, request: pb.GetPageContentRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetPageContentResponse:
        url, title, tree, text = await self._browser(request.sandbox_id).content()
        return pb.GetPageContentResponse(url=url, title=title, accessibility_tree=tree, text=text)
