"""Property-based fuzzing of every EnvService RPC with random inputs (hypothesis), against a real server with real
sandboxes: whatever comes in, the answer is OK or a deliberate status code — never UNKNOWN or INTERNAL — and the
service keeps working."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

import grpc
import pytest
from env_helpers import needs_sandboxes
from google.protobuf.duration_pb2 import Duration
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchard.env.v1 import env_pb2 as pb
from orchard.env.v1 import env_pb2_grpc
from orchard.services.env.server import build
from orchard.services.env.settings import EnvSettings

pytestmark = [needs_sandboxes, pytest.mark.timeout(300), pytest.mark.slow]

DELIBERATE = {
    grpc.StatusCode.OK,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.ALREADY_EXISTS,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.UNIMPLEMENTED,
    grpc.StatusCode.UNAUTHENTICATED,
}
FUZZ = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)

text = st.text(alphabet=st.characters(blacklist_categories=["Cs"]), max_size=40)
names = st.one_of(text, st.sampled_from(["", "host", "python:3.11-slim", "sb-x", "a" * 64, "../..", "/", "."]))
paths = st.one_of(
    text,
    st.sampled_from(
        [
            "",
            "/",
            "/workspace",
            "../../etc/passwd",
            "/proc/self/environ",
            "a/b/c",
            "/dev/null",
            "x\x00y",
            "//",
            "/workspace/" + "d/" * 50,
        ]
    ),
)
small_maps = st.dictionaries(text, text, max_size=3)
seconds = st.floats(min_value=-10, max_value=10, allow_nan=False)


def duration(value: float) -> Duration:
    d = Duration()
    d.FromNanoseconds(int(value * 1e9))
    return d


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[env_pb2_grpc.EnvServiceStub, str]]:
    """A real env service in a thread, a sync stub to it, and one ready sandbox that the fuzzing may use."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    state: Path = tmp_path_factory.mktemp("fuzz") / "state"
    settings_ = EnvSettings(port=0, state_dir=state, log_format="text", log_level="WARNING", max_sandboxes=50)

    async def start() -> tuple[Any, int]:
        built, _ = await build(settings_)
        return built, await built.start()

    built, port = asyncio.run_coroutine_threadsafe(start(), loop).result(30)
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    stub = env_pb2_grpc.EnvServiceStub(channel)
    sandbox_id = stub.CreateSandbox(pb.CreateSandboxRequest(image="host"), timeout=30).sandbox.sandbox_id
    yield stub, sandbox_id
    channel.close()
    asyncio.run_coroutine_threadsafe(built.stop(), loop).result(60)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)
    loop.close()
    assert not list((state / "sandboxes").iterdir())
    assert not list((state / "snapshots").iterdir())


def call(fn: Callable[..., Any], request: Any) -> Any:
    """Call an RPC; a non-deliberate status code fails the property."""
    try:
        response = fn(request, timeout=30)
        if hasattr(response, "__iter__") and not hasattr(response, "ListFields"):
            response = list(response)
        return response
    except grpc.RpcError as err:
        assert err.code() in DELIBERATE, f"{err.code()}: {err.details()} for {request!r}"[:2000]
        return None


def sandbox_ids(server: tuple[Any, str]) -> st.SearchStrategy[str]:
    return st.one_of(st.just(server[1]), names)


@FUZZ
@given(data=st.data())
def test_fuzz_create_and_lifecycle(server: tuple[env_pb2_grpc.EnvServiceStub, str], data: st.DataObject) -> None:
    """CreateSandbox/Get/List/Heartbeat/SetNetworkPolicy/Delete with random fields."""
    stub, _ = server
    request = pb.CreateSandboxRequest(
        image=data.draw(names),
        kind=cast(pb.SandboxKind, data.draw(st.integers(0, 3))),  # unknown kinds too
        env=data.draw(small_maps),
        labels=data.draw(small_maps),
        ttl=duration(data.draw(seconds)),
        heartbeat_timeout=duration(data.draw(seconds)),
        sandbox_id=data.draw(names),
        request_id=data.draw(text),
        workdir=data.draw(paths),
        resources=pb.Resources(
            cpu_millis=data.draw(st.integers(-5, 10_000)),
            memory_bytes=data.draw(st.integers(-5, 1 << 40)),
            pids=data.draw(st.integers(-5, 10)),
        ),
        network_policy=pb.NetworkPolicy(
            allow=[
                pb.EgressRule(cidr=data.draw(text), host=data.draw(text), port=data.draw(st.integers(-5, 70_000)))
                for _ in range(data.draw(st.integers(0, 2)))
            ]
        ),
    )
    created = call(stub.CreateSandbox, request)
    sid = created.sandbox.sandbox_id if created else data.draw(names)
    call(stub.GetSandbox, pb.GetSandboxRequest(sandbox_id=sid))
    call(stub.Heartbeat, pb.HeartbeatRequest(sandbox_id=sid))
    call(
        stub.ListSandboxes,
        pb.ListSandboxesRequest(
            label_selector=data.draw(small_maps),
            page_size=data.draw(st.integers(-(2**31), 2**31 - 1)),
            page_token=data.draw(text),
        ),
    )
    call(
        stub.SetNetworkPolicy,
        pb.SetNetworkPolicyRequest(
            sandbox_id=sid, network_policy=pb.NetworkPolicy(allow=[pb.EgressRule(cidr=data.draw(text))])
        ),
    )
    if created:
        assert call(stub.DeleteSandbox, pb.DeleteSandboxRequest(sandbox_id=sid)) is not None
    else:
        call(stub.DeleteSandbox, pb.DeleteSandboxRequest(sandbox_id=sid))


@FUZZ
@given(data=st.data())
def test_fuzz_exec(server: tuple[env_pb2_grpc.EnvServiceStub, str], data: st.DataObject) -> None:
    """StartExec/GetExec/WaitExec/StreamExec/CancelExec with random commands, env, cwd, stdin and limits."""
    stub, _ = server
    request = pb.StartExecRequest(
        sandbox_id=data.draw(sandbox_ids(server)),
        cwd=data.draw(paths),
        env=data.draw(small_maps),
        stdin=data.draw(st.binary(max_size=64)),
        timeout=duration(data.draw(st.floats(-1, 2, allow_nan=False))),
        login_shell=data.draw(st.booleans()),
        max_output_bytes=data.draw(st.integers(-5, 1 << 40)),
        wait=duration(data.draw(st.floats(-1, 2, allow_nan=False))),
    )
    if data.draw(st.booleans()):
        request.shell = data.draw(st.one_of(text, st.sampled_from(["echo hi", "exit 7", "cat", "sleep 0.2", ""])))
    else:
        request.argv.args.extend(data.draw(st.lists(text, max_size=4)))
    started = call(stub.StartExec, request)
    exec_id = started.exec.exec_id if started else data.draw(names)
    call(stub.GetExec, pb.GetExecRequest(exec_id=exec_id))
    call(stub.WaitExec, pb.WaitExecRequest(exec_id=exec_id, timeout=duration(data.draw(st.floats(-1, 1)))))
    call(stub.StreamExec, pb.StreamExecRequest(exec_id=exec_id))
    call(stub.CancelExec, pb.CancelExecRequest(exec_id=exec_id))


@FUZZ
@given(data=st.data())
def test_fuzz_files_and_patches(server: tuple[env_pb2_grpc.EnvServiceStub, str], data: st.DataObject) -> None:
    """UploadFile (random part order), DownloadFile, ListFiles and ApplyPatch with random paths and content."""
    stub, _ = server
    sid = data.draw(sandbox_ids(server))
    parts = data.draw(
        st.lists(
            st.one_of(
                st.builds(
                    lambda p, m: pb.UploadFileRequest(header=pb.FileHeader(sandbox_id=sid, path=p, mode=m)),
                    paths,
                    st.integers(0, 2**32 - 1),
                ),
                st.builds(lambda b: pb.UploadFileRequest(chunk=b), st.binary(max_size=256)),
            ),
            max_size=4,
        )
    )
    call(stub.UploadFile, iter(parts))
    call(stub.DownloadFile, pb.DownloadFileRequest(sandbox_id=sid, path=data.draw(paths)))
    call(stub.ListFiles, pb.ListFilesRequest(sandbox_id=sid, path=data.draw(paths)))
    patch = data.draw(st.one_of(text, st.just("--- a/x\n+++ b/x\n@@ -1 +1 @@\n-a\n+b\n")))
    call(
        stub.ApplyPatch,
        pb.ApplyPatchRequest(
            sandbox_id=sid, patch=patch, cwd=data.draw(paths), timeout=duration(data.draw(st.floats(-1, 5)))
        ),
    )


@FUZZ
@given(data=st.data())
def test_fuzz_browser_and_pty(server: tuple[env_pb2_grpc.EnvServiceStub, str], data: st.DataObject) -> None:
    """Screenshot, Act, GetPageContent and OpenPty with random inputs answer deliberately."""
    stub, _ = server
    sid = data.draw(sandbox_ids(server))
    call(stub.Screenshot, pb.ScreenshotRequest(sandbox_id=sid, full_page=data.draw(st.booleans())))
    call(
        stub.Act,
        pb.ActRequest(
            sandbox_id=sid,
            action=cast(pb.ActionType, data.draw(st.integers(0, 12))),  # unknown actions too
            selector=data.draw(text),
            x=data.draw(st.floats(allow_nan=True)),
            url=data.draw(text),
        ),
    )
    call(stub.GetPageContent, pb.GetPageContentRequest(sandbox_id=sid))
    first = data.draw(st.sampled_from(["start", "input", "resize"]))
    messages = {
        "start": pb.OpenPtyRequest(
            start=pb.PtyStart(
                sandbox_id=sid,
                argv=["bash", "-c", "echo pty; exit 0"],
                rows=data.draw(st.integers(0, 2000)),
                cols=data.draw(st.integers(0, 2000)),
            )
        ),
        "input": pb.OpenPtyRequest(input=data.draw(st.binary(max_size=16))),
        "resize": pb.OpenPtyRequest(resize=pb.PtyResize(rows=5, cols=5)),
    }
    call(stub.OpenPty, iter([messages[first]]))


@FUZZ
@given(data=st.data())
def test_fuzz_snapshots(server: tuple[env_pb2_grpc.EnvServiceStub, str], data: st.DataObject) -> None:
    """SnapshotSandbox, Get/List/DeleteSnapshot and CreateSandbox from_snapshot with random inputs."""
    stub, _ = server
    taken = call(
        stub.SnapshotSandbox,
        pb.SnapshotSandboxRequest(
            sandbox_id=data.draw(sandbox_ids(server)),
            snapshot_id=data.draw(names),
            labels=data.draw(small_maps),
            request_id=data.draw(text),
        ),
    )
    snapshot_id = taken.snapshot.snapshot_id if taken else data.draw(names)
    call(stub.GetSnapshot, pb.GetSnapshotRequest(snapshot_id=snapshot_id))
    call(
        stub.ListSnapshots,
        pb.ListSnapshotsRequest(
            label_selector=data.draw(small_maps),
            page_size=data.draw(st.integers(-(2**31), 2**31 - 1)),
            page_token=data.draw(text),
        ),
    )
    forked = call(stub.CreateSandbox, pb.CreateSandboxRequest(image=data.draw(names), from_snapshot=snapshot_id))
    call(stub.DeleteSnapshot, pb.DeleteSnapshotRequest(snapshot_id=snapshot_id))
    if forked:
        call(stub.DeleteSandbox, pb.DeleteSandboxRequest(sandbox_id=forked.sandbox.sandbox_id))


def test_service_still_works_after_fuzzing(server: tuple[env_pb2_grpc.EnvServiceStub, str]) -> None:
    """After all the random input, a plain command in a new sandbox runs."""
    stub, _ = server
    sid = stub.CreateSandbox(pb.CreateSandboxRequest(image="host"), timeout=30).sandbox.sandbox_id
    ex = stub.StartExec(pb.StartExecRequest(sandbox_id=sid, shell="echo alive", wait=duration(10)), timeout=30).exec
    assert (ex.state, ex.stdout) == (pb.EXEC_STATE_SUCCEEDED, b"alive\n")
    stub.DeleteSandbox(pb.DeleteSandboxRequest(sandbox_id=sid), timeout=30)
