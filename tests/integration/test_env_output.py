"""Large command output through the env service: more than one message holds is returned in part with
`stdout_partial` and read to its end with ReadExecOutput (the SDK does it), streamed whole by StreamExec, spooled
to files that go with their records, and bounded on disk by max_retained_output_bytes."""

from __future__ import annotations

import hashlib

import grpc
import pytest
from env_helpers import EnvServer, StartEnv, create, duration, needs_sandboxes, run, wait

from orchard import AsyncSandboxClient
from orchard.env.v1 import env_pb2 as pb

pytestmark = [needs_sandboxes, pytest.mark.timeout(120)]

MiB = 1 << 20
# n MiB of printable ASCII that shifts from one MiB to the next (not zeros: an offset mistake changes the bytes;
# text: the SDK decodes it).
PATTERN = (
    'python3 -c "import sys; b=bytes(48 + i % 75 for i in range(1 << 20)); '
    '[sys.stdout.buffer.write(b) for _ in range({n})]"'
)
BLOCK = bytes(48 + i % 75 for i in range(1 << 20))


def expected(n: int) -> bytes:
    return BLOCK * n


async def test_output_larger_than_a_message_is_read_whole(env: EnvServer) -> None:
    n = 40  # 40 x ~1 MiB: over the per-message read cap (31.5 MiB with the 64 MiB message limit)
    sb = await create(env.stub)
    ex = await run(env.stub, sb.sandbox_id, PATTERN.format(n=n), max_output_bytes=64 * MiB)
    assert ex.exit_code == 0 and ex.stdout_partial and not ex.stdout_truncated
    assert ex.stdout == expected(n)[: len(ex.stdout)] and len(ex.stdout) == env.manager.commands.read_cap
    rest = await env.stub.ReadExecOutput(
        pb.ReadExecOutputRequest(exec_id=ex.exec_id, stream=pb.OUTPUT_STREAM_STDOUT, offset=len(ex.stdout)), timeout=30
    )
    assert ex.stdout + rest.data == expected(n) and rest.eof and rest.kept_bytes == len(expected(n))
    middle = await env.stub.ReadExecOutput(
        pb.ReadExecOutputRequest(exec_id=ex.exec_id, stream=pb.OUTPUT_STREAM_STDOUT, offset=12345, limit=1000),
        timeout=30,
    )
    assert middle.data == expected(n)[12345:13345] and not middle.eof
    streamed = b"".join([m.stdout async for m in env.stub.StreamExec(pb.StreamExecRequest(exec_id=ex.exec_id))])
    assert hashlib.sha256(streamed).digest() == hashlib.sha256(expected(n)).digest()
    async with AsyncSandboxClient(target=f"127.0.0.1:{env.server.port}") as client:
        sandbox = await client.get_sandbox(sb.sandbox_id)
        result = await sandbox.exec(PATTERN.format(n=n), max_output=64 * MiB)
        assert result.stdout.encode() == expected(n)  # the SDK read past the first message
        assert (await sandbox.get_job(ex.exec_id)).stdout.encode() == expected(n)


@pytest.mark.parametrize(
    "request_, field",
    [
        (pb.ReadExecOutputRequest(stream=pb.OUTPUT_STREAM_UNSPECIFIED), "stream"),
        (pb.ReadExecOutputRequest(stream=pb.OUTPUT_STREAM_STDERR, offset=-1), "offset"),
        (pb.ReadExecOutputRequest(stream=pb.OUTPUT_STREAM_STDOUT, limit=-5), "limit"),
    ],
)
async def test_bad_reads_are_invalid_argument(env: EnvServer, request_: pb.ReadExecOutputRequest, field: str) -> None:
    sb = await create(env.stub)
    ex = await run(env.stub, sb.sandbox_id, "echo hi")
    request_.exec_id = ex.exec_id
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await env.stub.ReadExecOutput(request_, timeout=10)
    assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT and field in (info.value.details() or "")
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await env.stub.ReadExecOutput(
            pb.ReadExecOutputRequest(exec_id="ex-nope", stream=pb.OUTPUT_STREAM_STDOUT), timeout=10
        )
    assert info.value.code() is grpc.StatusCode.NOT_FOUND


async def test_the_largest_output_cap_is_accepted_and_read(env: EnvServer) -> None:
    """max_output_bytes up to the service's max (256 MiB) is never refused for not fitting in a message."""
    sb = await create(env.stub)
    ex = await run(env.stub, sb.sandbox_id, "head -c 1000 /dev/zero", max_output_bytes=env.settings.max_output_bytes)
    assert ex.exit_code == 0 and ex.stdout == bytes(1000) and not ex.stdout_partial


async def test_spooled_output_is_bounded_and_goes_with_its_record(start_env: StartEnv) -> None:
    env = await start_env(max_retained_output_bytes=3 * MiB, exec_output_memory_bytes=1024)
    sb = await create(env.stub)
    spool = env.settings.state_dir / "execs"
    ids = []
    for _ in range(5):
        ex = await run(env.stub, sb.sandbox_id, "head -c 1048576 /dev/zero", max_output_bytes=2 * MiB)
        assert ex.stdout == bytes(MiB)
        ids.append(ex.exec_id)
    kept = [i for i in ids if (spool / i).exists()]
    assert kept == ids[-3:]  # 3 MiB on disk at most: the oldest records were forgotten with their files
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await env.stub.GetExec(pb.GetExecRequest(exec_id=ids[0]), timeout=10)
    assert info.value.code() is grpc.StatusCode.NOT_FOUND and "MiB on disk" in (info.value.details() or "")
    small = await run(env.stub, sb.sandbox_id, "echo small")
    assert small.stdout == b"small\n" and not (spool / small.exec_id).exists()  # within the memory head
    started = await env.stub.StartExec(
        pb.StartExecRequest(sandbox_id=sb.sandbox_id, shell="echo x", timeout=duration(10)), timeout=10
    )
    assert (await wait(env.stub, started.exec.exec_id)).stdout == b"x\n"
