"""The `orchard` command against a real env service started with `orchard serve env`, and `orchard train` and
`orchard eval --compare` against real experience, trainer and inference services."""

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import grpc
import pytest
from experience_helpers import NatsServer
from grpc_health.v1 import health_pb2, health_pb2_grpc

ORCHARD = str(Path(sys.executable).with_name("orchard"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def orchard(*args: str, address: str | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    if address:
        env["ORCHARD_ENV_ADDRESS"] = address
    return subprocess.run([ORCHARD, *args], check=False, capture_output=True, text=True, timeout=timeout, env=env)


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, subprocess.Popen[bytes], Path]]:
    """`orchard serve env` on a free port with its own state dir; yields (address, process, state dir)."""
    port = _free_port()
    state = tmp_path_factory.mktemp("cli-state")
    proc = subprocess.Popen(
        [ORCHARD, "serve", "env", "--port", str(port), "--state-dir", str(state), "--log-format", "text"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    address = f"127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    with grpc.insecure_channel(address) as channel:
        while True:
            assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
            try:
                reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=1)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    break
            except grpc.RpcError:
                pass
            assert time.monotonic() < deadline, "orchard serve env did not become healthy"
            time.sleep(0.1)
    yield address, proc, state
    if proc.poll() is None:
        proc.kill()
        proc.wait()


@pytest.mark.timeout(120)
def test_sandbox_commands(service: tuple[str, subprocess.Popen[bytes], Path]) -> None:
    """create prints an id, ls shows it with labels, exec streams output and exits with the code, rm removes it."""
    address = service[0]
    created = orchard("sandbox", "create", "host", "--label", "team=cli", address=address)
    assert created.returncode == 0, created.stderr
    sandbox_id = created.stdout.strip()
    assert sandbox_id.startswith("sb-")

    listed = orchard("sandbox", "ls", "--label", "team=cli", address=address)
    assert sandbox_id in listed.stdout and "team=cli" in listed.stdout and "ready" in listed.stdout

    ran = orchard("sandbox", "exec", sandbox_id, "--", "echo out; echo err >&2; exit 7", address=address)
    assert (ran.returncode, ran.stdout, ran.stderr) == (7, "out\n", "err\n")
    argv = orchard("sandbox", "exec", sandbox_id, "--", "printf", "%s|", "a b", "it's", address=address)
    assert argv.stdout == "a b|it's|"

    removed = orchard("sandbox", "rm", sandbox_id, address=address)
    assert removed.returncode == 0
    assert sandbox_id not in orchard("sandbox", "ls", address=address).stdout
    gone = orchard("sandbox", "exec", sandbox_id, "--", "true", address=address)
    assert gone.returncode == 1 and f"sandbox '{sandbox_id}' not found" in gone.stderr


def test_clear_errors() -> None:
    """Unknown services, bad settings and an unreachable address are one clear line each, not a traceback."""
    unknown = orchard("serve", "nope")
    assert unknown.returncode != 0 and "unknown service 'nope'; available: env" in unknown.stderr
    bad = orchard("serve", "env", "--max-concurrent-execs", "0")
    assert bad.returncode != 0 and "max_concurrent_execs" in bad.stderr and "Traceback" not in bad.stderr
    start = time.monotonic()
    down = orchard("sandbox", "ls", address=f"127.0.0.1:{_free_port()}")
    assert down.returncode == 1 and "127.0.0.1" in down.stderr and "orchard up" in down.stderr
    assert time.monotonic() - start < 45  # one CLI start (seconds on a busy machine), not a retry loop


def test_image_ls_lists_host_and_recipes() -> None:
    """`orchard image ls` shows the host image and every recipe with its status."""
    listed = orchard("image", "ls")
    assert listed.returncode == 0
    assert "host" in listed.stdout and "python:3.11-slim" in listed.stdout


@pytest.mark.timeout(60)
def test_sigterm_drains_and_removes_sandboxes(service: tuple[str, subprocess.Popen[bytes], Path]) -> None:
    """SIGTERM stops the service with exit 0 and leaves no sandbox files or processes behind."""
    address, proc, state = service
    created = orchard("sandbox", "create", "host", address=address)
    sandbox_id = created.stdout.strip()
    orchard("sandbox", "exec", sandbox_id, "--", "sleep 600 >/dev/null 2>&1 &", address=address)
    assert (state / "sandboxes" / sandbox_id).exists()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0
    assert list((state / "sandboxes").iterdir()) == []
    leftovers = subprocess.run(["pgrep", "-f", f"ORCHARD_SANDBOX_ID {sandbox_id}"], check=False, capture_output=True)
    assert leftovers.returncode == 1


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_serve_inference_grpc_and_openai() -> None:
    """`orchard serve inference --http-port` serves the embedded model over gRPC and to the real openai client."""
    import openai

    from orchard.inference.v1 import inference_pb2, inference_pb2_grpc
    from orchard.types.v1 import types_pb2

    port, http_port = _free_port(), _free_port()
    proc = subprocess.Popen(
        [ORCHARD, "serve", "inference", "--port", str(port), "--http-port", str(http_port), "--log-format", "text"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 150
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            while True:
                assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
                try:
                    reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=1)
                    if reply.status == health_pb2.HealthCheckResponse.SERVING:
                        break
                except grpc.RpcError:
                    pass
                assert time.monotonic() < deadline, "orchard serve inference did not become healthy"
                time.sleep(0.2)
            question = types_pb2.Message(role=types_pb2.ROLE_USER, content="What is the capital of France?")
            chat = inference_pb2_grpc.InferenceServiceStub(channel).Chat(
                inference_pb2.ChatRequest(
                    messages=[question], sampling=inference_pb2.SamplingParams(max_tokens=12, temperature=0)
                ),
                timeout=60,
            )
        assert "Paris" in chat.choices[0].message.content
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{http_port}/v1", api_key="unused", max_retries=0)
        reply = client.chat.completions.create(
            model="SmolLM2-135M-Instruct",
            max_tokens=12,
            temperature=0,
            messages=[{"role": "user", "content": "What is the capital of France?"}],
        )
        assert reply.choices[0].message.content == chat.choices[0].message.content
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _task_file(path: Path, ids: list[str]) -> Path:
    """A task set naming `ids` (enough for reports over stored rollouts; nothing here runs them)."""
    path.write_text(
        "".join(
            json.dumps({"instance_id": i, "repo": "o/r", "problem_statement": "p", "FAIL_TO_PASS": ["t::a"]}) + "\n"
            for i in ids
        )
    )
    return path


@pytest.fixture
async def experience(tmp_path: Path, nats_server: NatsServer) -> AsyncIterator[str]:
    """A real experience service holding run "before" (task-a resolved once of 2, task-b never; weights v1) and run
    "after" (both tasks resolved once of 2; weights v2); yields its address."""
    from experience_helpers import publish_and_store, rollout

    from orchard.services.experience.server import build
    from orchard.services.experience.settings import ExperienceSettings
    from orchard.types.v1 import types_pb2 as tpb

    settings = ExperienceSettings(
        port=0,
        nats_url=nats_server.url,
        store_url=f"sqlite:///{tmp_path / 'e.db'}",
        log_format="text",
        grace_period_s=1,
    )
    server, store = await build(settings)
    port = await server.start()
    yes, no = tpb.OUTCOME_STATUS_RESOLVED, tpb.OUTCOME_STATUS_UNRESOLVED
    published = []
    for run, version, statuses in [("before", "v1", [yes, no, no, no]), ("after", "v2", [yes, no, yes, no])]:
        for i, status in enumerate(statuses):
            published += rollout(
                run, f"{run}-{i}", ["task-a", "task-b"][i // 2], status=status, weights_version=version
            )
    await publish_and_store(nats_server.url, published, store)
    yield f"127.0.0.1:{port}"
    await server.stop()


async def orchard_async(*args: str, timeout: float = 120) -> tuple[int, str, str]:
    """The CLI in a subprocess while this test's event loop keeps serving the in-process services."""
    proc = await asyncio.create_subprocess_exec(
        ORCHARD, *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    async with asyncio.timeout(timeout):
        out, err = await proc.communicate()
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


@pytest.mark.slow
@pytest.mark.timeout(120)
async def test_eval_compare_sets_two_runs_side_by_side(experience: str, tmp_path: Path) -> None:
    """`orchard eval --run after --compare before`: the usual report, then each figure of both runs."""
    tasks = _task_file(tmp_path / "tasks.jsonl", ["task-a", "task-b"])
    code, out, err = await orchard_async(
        "eval", "--run", "after", "--compare", "before", "--tasks", str(tasks), "--experience-address", experience
    )
    assert code == 0, out + err
    block = out[out.index("before/after:") :].splitlines()
    assert [line.split() for line in block] == [
        ["before/after:", "run", "before", "->", "run", "after"],
        ["resolved", "1/4", "->", "2/4"],
        ["pass@1", "0.250", "->", "0.500"],
        ["pass@2", "0.500", "->", "1.000"],
        ["mean", "reward", "-0.500", "->", "0.000"],
        ["weights", "v1", "->", "v2"],
    ]
    assert out.index("resolved 2/4") < out.index("before/after:")  # after the after-run's own report
    code, out, err = await orchard_async(
        "eval",
        "--run",
        "after",
        "--compare",
        "nope",
        "--tasks",
        str(tasks),
        "--experience-address",
        experience,
        "--wait",
        "0",
    )
    assert code == 1 and "run 'nope' has no rollouts" in err


@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_train_follows_the_job_and_pushes_its_checkpoint(experience: str, tmp_path: Path) -> None:
    """`orchard train --push` against real experience, trainer and inference services (a tiny model, so steps take
    milliseconds): progress per step, the result, the new weights served; a failed job exits 1 with its error;
    Ctrl-C cancels the job."""
    from trainer_service_helpers import tiny_model

    from orchard.inference.v1 import inference_pb2, inference_pb2_grpc
    from orchard.services.inference import server as inference_server
    from orchard.services.inference.settings import InferenceSettings
    from orchard.services.trainer import server as trainer_server
    from orchard.services.trainer.settings import TrainerSettings
    from orchard.trainer.v1 import trainer_pb2 as pb
    from orchard.trainer.v1 import trainer_pb2_grpc

    tiny = tiny_model(tmp_path / "tiny")
    inference, _ = await inference_server.build(
        InferenceSettings(port=0, model=str(tiny), log_format="text", grace_period_s=1)
    )
    inference_address = f"127.0.0.1:{await inference.start()}"
    trainer, _ = await trainer_server.build(
        TrainerSettings(
            port=0,
            jobs_dir=tmp_path / "jobs",
            log_format="text",
            grace_period_s=1,
            experience_address=experience,
            inference_address=inference_address,
        )
    )
    trainer_address = f"127.0.0.1:{await trainer.start()}"
    try:
        async with grpc.aio.insecure_channel(trainer_address) as channel:
            stub = trainer_pb2_grpc.TrainerServiceStub(channel)
            addresses = [
                "--trainer-address",
                trainer_address,
                "--inference-address",
                inference_address,
                "--base-model",
                str(tiny),
            ]
            code, out, err = await orchard_async(
                "train",
                "--run",
                "before",
                "--epochs",
                "2",
                "--batch",
                "2",
                "--lr",
                "1e-3",
                "--warmup",
                "0.5",
                "--job-id",
                "cli-sft",
                "--push",
                "--report",
                str(tmp_path / "sft.json"),
                *addresses,
            )
            assert code == 0, out + err
            report = json.loads((tmp_path / "sft.json").read_text())
            assert (report["job_id"], report["kind"], report["steps"]) == ("cli-sft", "sft", 4)
            assert report["checkpoint"]["version"] == "cli-sft-step-4" and report["metrics"]["samples"] == 4
            assert [s["step"] for s in report["per_step"]][-1] == 4 and "loss" in report["per_step"][-1]
            # --warmup 0.5: the first half of the 4 steps rises to the peak (--lr), then the cosine decays it.
            assert [round(s["learning_rate"], 6) for s in report["per_step"][:3]] == [5e-4, 1e-3, 1e-3]
            assert "job cli-sft: sft of" in err and "rollouts of run before" in err
            steps = [line for line in err.splitlines() if line.startswith("[")]
            # Not a terminal: plain lines (no \r frames), at most one every few seconds, the last step always.
            assert "\r" not in err and 1 <= len(steps) <= 4 and "step 4/4 " in steps[-1], err
            assert "step 4/4  loss " in err and "tokens/s" in err and "job cli-sft SUCCEEDED" in err
            assert "job cli-sft SUCCEEDED in " in out and "4 steps on 4 samples, final loss " in out
            assert "checkpoint cli-sft-step-4 at " in out
            assert "served weights version: cli-sft-step-4" in out
            async with grpc.aio.insecure_channel(inference_address) as channel:
                models = await inference_pb2_grpc.InferenceServiceStub(channel).ListModels(
                    inference_pb2.ListModelsRequest(), timeout=10
                )
            assert [m.weights_version for m in models.models] == ["cli-sft-step-4"]
            status = await orchard_async(
                "status", "--env-address", f"127.0.0.1:{_free_port()}", "--trainer-address", trainer_address
            )
            assert "SERVING, jobs: 1 (0 running)" in status[1]

            # A job that fails: non-zero exit with the job's error.
            code, out, err = await orchard_async("train", "--run", "no-such-run", "--job-id", "cli-empty", *addresses)
            assert code == 1 and "job cli-empty FAILED" in err and "selects no records" in err

            # Ctrl-C while it trains: the job is cancelled before the command exits. A terminal's Ctrl-C reaches a
            # foreground command whose SIGINT is not ignored: the child starts with SIGINT at its default and
            # unblocked, whatever this test process inherited or a library set below Python.
            def default_sigint() -> None:
                signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
                signal.signal(signal.SIGINT, signal.SIG_DFL)

            proc = await asyncio.create_subprocess_exec(
                ORCHARD,
                "train",
                "--run",
                "before",
                "--epochs",
                "100000",
                "--batch",
                "2",
                "--job-id",
                "cli-long",
                *addresses,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                preexec_fn=default_sigint,
            )
            assert proc.stderr is not None and proc.stdout is not None
            lines: list[bytes] = []

            async def read_stderr() -> None:  # all of it, kept even if the wait below times out
                assert proc.stderr is not None
                while line := await proc.stderr.readline():
                    lines.append(line)

            reader = asyncio.create_task(read_stderr())
            async with asyncio.timeout(120):
                while not any(b"step " in line for line in lines):
                    await asyncio.sleep(0.05)
            proc.send_signal(signal.SIGINT)
            try:
                async with asyncio.timeout(90):
                    await proc.wait()
                    await reader
            except TimeoutError:  # say where it hung: what it printed last, its signal state, the job's state
                proc_status = (
                    Path(f"/proc/{proc.pid}/status").read_text() if Path(f"/proc/{proc.pid}/status").exists() else ""
                )
                signals = [line for line in proc_status.splitlines() if line.startswith(("SigBlk", "SigIgn", "SigCgt"))]
                proc.kill()
                await proc.wait()
                reader.cancel()
                job = (await stub.GetJob(pb.GetJobRequest(job_id="cli-long"))).job
                raise AssertionError(
                    f"orchard train did not exit within 90 s of SIGINT (job "
                    f"{pb.JobState.Name(job.state)}, step {job.progress.step}; {signals}); its "
                    f"stderr ends: {b''.join(lines).decode()[-1500:]}"
                ) from None
            await proc.stdout.read()
            err_b = b"".join(lines)
            assert proc.returncode == 130, err_b.decode()
            assert "cancelling job cli-long" in err_b.decode() and "job cli-long CANCELLED at step" in err_b.decode()
            job = (await stub.GetJob(pb.GetJobRequest(job_id="cli-long"))).job
            assert job.state == pb.JOB_STATE_CANCELLED and 0 < job.progress.step < 200000
    finally:
        await trainer.stop()
        await inference.stop()


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["train", "--run", "r", "--epochs", "0"], "--epochs: must be at least 1, got 0"),
        (["train", "--run", "r", "--lr=-1"], "--lr: must be above 0"),
        (["train", "--run", "r", "--batch", "two"], "--batch: 'two' is not a whole number"),
        (["train", "--run", "r", "--warmup", "2"], "--warmup: must be from 0 to 1, got 2"),
        (["train", "--run", "r", "--kind", "dpo"], "invalid choice: 'dpo'"),
        (["train", "--kind", "rl", "--tasks", "toyrepair", "--group-size", "1"], "--group-size: must be at least 2"),
        (["learn", "--held-out", "0"], "--held-out: must be at least 1, got 0"),
    ],
)
def test_train_refuses_bad_arguments(args: list[str], words: str) -> None:
    bad = orchard(*args)
    assert bad.returncode == 2 and words in bad.stderr, bad.stderr


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["train"], "--kind sft trains on stored rollouts: give --run (--tasks is for --kind rl)"),
        (["train", "--run", "r", "--kind", "rl"], "--kind rl trains on --tasks (it rolls out itself), not on stored"),
        (["train", "--kind", "rl", "--tasks", "toyrepair", "--exclude-ids", "x"], "--kind rl trains on --tasks (use"),
        (["train", "--kind", "rl", "--tasks", "toyrepair", "--ids", "no-such-task"], "no-such-task"),
        (["train", "--kind", "value", "--run", "r", "--base-model", "served"], "a value model has its own"),
        (["learn", "--held-out", "8"], "--held-out 8 leaves none of the 8 tasks to train on"),
        (["learn", "--run-id", "Mine"], "--run-id 'Mine' must be lowercase letters, digits and '-'"),
    ],
)
def test_train_and_learn_refuse_what_cannot_run(args: list[str], words: str) -> None:
    """Checked before anything is started or reached: one line, exit code 1."""
    bad = orchard(*args, "--trainer-address", f"127.0.0.1:{_free_port()}")
    assert bad.returncode == 1 and words in bad.stderr and "Traceback" not in bad.stderr, bad.stderr


def test_train_and_eval_say_what_is_wrong() -> None:
    """An unreachable trainer or inference service, and --compare without --run: one clear line each, quickly."""
    start = time.monotonic()
    port = _free_port()
    down = orchard("train", "--run", "r", "--trainer-address", f"127.0.0.1:{port}")
    assert down.returncode == 1 and f"cannot reach the trainer service at 127.0.0.1:{port}" in down.stderr
    assert "orchard up" in down.stderr and "Traceback" not in down.stderr
    no_push = orchard("train", "--run", "r", "--push", "--inference-address", f"127.0.0.1:{port}")
    assert no_push.returncode == 1 and f"cannot reach the inference service at 127.0.0.1:{port}" in no_push.stderr
    assert time.monotonic() - start < 90  # two CLI starts, not retry loops
    compare = orchard("eval", "rollouts.jsonl", "--compare", "before")
    assert compare.returncode == 1 and "give the later one with --run" in compare.stderr
