"""The value service over real gRPC with real value checkpoints (the embedded all-MiniLM-L6-v2 backbone with a fixed
head, built once for the module): Score equals the model's own scores in request order, Rerank's exclusions and
cluster tie-break, LoadModel's switch, no-op and failed loads, concurrent requests sharing forwards, bad input,
`orchard status`, and `orchard serve value` as a process."""

from __future__ import annotations

import asyncio
import json
import math
import re
import shutil
import signal
import socket
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
import pytest_asyncio
from grpc_health.v1 import health_pb2, health_pb2_grpc

from orchard.cli.status import value_row
from orchard.errors import from_rpc_error
from orchard.services.value.server import build
from orchard.services.value.servicer import ValueServicer
from orchard.services.value.settings import ValueSettings
from orchard.types.v1 import types_pb2 as tpb
from orchard.value.metrics import TIE_MARGIN, normalise_patch, rank, sigmoid
from orchard.value.model import HEAD_FILE, ValueModel, resolve_backbone
from orchard.value.render import render_candidate
from orchard.value.v1 import value_pb2 as pb
from orchard.value.v1 import value_pb2_grpc

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.timeout(120)]

ORCHARD = str(Path(sys.executable).with_name("orchard"))
TASK = "calc.add(2, 3) returns -1 instead of 5. Fix add in calc.py."
V2_VERSION = "value-job-step-4"


@dataclass
class Checkpoints:
    v1: Path
    """value_config.json records version "v1"."""
    v2: Path
    """The head negated, with the trainer's manifest.json naming version, job and metrics."""
    direct: dict[str, ValueModel]
    """The same checkpoints loaded outside the service, by version."""


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> Checkpoints:
    import torch

    root = tmp_path_factory.mktemp("value")
    model = ValueModel.load(resolve_backbone("")[0])
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():  # a fixed head that spreads the scores of different texts apart
        model.head.weight.copy_(10 * torch.randn(model.head.weight.shape, generator=generator))
        model.head.bias.fill_(0.25)
    model.config.version = "v1"
    model.save(root / "v1")
    shutil.copytree(root / "v1", root / "v2")
    with torch.no_grad():
        model.head.weight.neg_()
    from safetensors.torch import save_file

    save_file({k: v.detach().contiguous() for k, v in model.head.state_dict().items()}, str(root / "v2" / HEAD_FILE))
    (root / "v2" / "manifest.json").write_text(
        json.dumps(
            {
                "format": 1,
                "job_id": "value-job",
                "version": V2_VERSION,
                "step": 4,
                "kind": "JOB_KIND_VALUE",
                "metrics": {"auc": 0.8, "best_at_8": 0.5},
                "is_final": True,
                "create_time": time.time(),
            }
        )
    )
    return Checkpoints(
        root / "v1", root / "v2", {"v1": ValueModel.load(root / "v1"), V2_VERSION: ValueModel.load(root / "v2")}
    )


@dataclass
class Service:
    stub: value_pb2_grpc.ValueServiceStub
    servicer: ValueServicer
    address: str
    channel: grpc.aio.Channel


@asynccontextmanager
async def value_service(**overrides: Any) -> AsyncIterator[Service]:
    """A value service on a free port (with no model unless `checkpoint` is given), stopped after."""
    settings = ValueSettings(**{"port": 0, "log_format": "text", "grace_period_s": 1.0, **overrides})
    server, servicer = await build(settings)
    port = await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            yield Service(value_pb2_grpc.ValueServiceStub(channel), servicer, f"127.0.0.1:{port}", channel)
    finally:
        await server.stop()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def service(checkpoints: Checkpoints) -> AsyncIterator[Service]:
    """The service serving v1, with small limits so the tests can reach them."""
    async with value_service(
        checkpoint=checkpoints.v1,
        max_batch=8,
        batch_wait_ms=30,
        max_candidates=16,
        max_queued_candidates=64,
        max_text_chars=50_000,
    ) as running:
        yield running


def patch(line: str, name: str = "calc.py") -> str:
    return (
        f"diff --git a/{name} b/{name}\nindex 3f2a1b0..9c8d7e6 100644\n--- a/{name}\n+++ b/{name}\n"
        f"@@ -1,2 +1,2 @@\n def add(a, b):\n-    return a - b\n+    {line}\n"
    )


def long_patch(mark: str) -> str:
    """A patch over 4,000 chars whose only difference is `mark` in its middle: the renderer keeps a long patch's head
    and tail only, so two marks render to the same text (equal scores) yet are different patches (clusters)."""
    before = [f"+CONSTANT_{i:03d} = {i:05d}" for i in range(150)]
    after = [f"+LIMIT_{i:03d} = {i:05d}" for i in range(100)]
    return patch("return a + b") + "\n".join([*before, f"+MARK = {mark!r}", *after]) + "\n"


def trajectory(command: str, output: str, final_patch: str = "") -> tpb.Trajectory:
    return tpb.Trajectory(
        messages=[
            tpb.Message(role=tpb.ROLE_USER, content=TASK),
            tpb.Message(role=tpb.ROLE_ASSISTANT, content=f"Let me look.\n```bash\n{command}\n```"),
            tpb.Message(role=tpb.ROLE_TOOL, content=f"<returncode>0</returncode>\n{output}"),
        ],
        final_patch=final_patch,
    )


def candidate(candidate_id: str, line: str = "return a + b", **fields: Any) -> pb.Candidate:
    fields.setdefault("trajectory", trajectory("python -m pytest -q", "4 passed in 0.02s"))
    fields.setdefault("patch", patch(line))
    return pb.Candidate(candidate_id=candidate_id, **fields)


def direct_logits(model: ValueModel, candidates: list[pb.Candidate], problem: str = "") -> list[float]:
    texts = [render_candidate(c.trajectory, problem=c.problem_statement or problem, patch=c.patch) for c in candidates]
    return model.score(texts)


async def test_health_and_model(service: Service, checkpoints: Checkpoints) -> None:
    """The service is SERVING in health; GetModel describes the checkpoint it serves."""
    health = await health_pb2_grpc.HealthStub(service.channel).Check(
        health_pb2.HealthCheckRequest(service="orchard.value.v1.ValueService"), timeout=5
    )
    assert health.status == health_pb2.HealthCheckResponse.SERVING
    model = (await service.stub.GetModel(pb.GetModelRequest(), timeout=10)).model
    assert (model.name, model.version, model.checkpoint_path) == ("valueModel", "v1", str(checkpoints.v1))
    assert model.base_model == checkpoints.direct["v1"].config.base_model and model.max_context_tokens == 512
    assert model.job == "" and dict(model.metrics) == {}
    assert 0 < time.time() - model.load_time.ToSeconds() < 600


async def test_score_matches_the_model_in_request_order(service: Service, checkpoints: Checkpoints) -> None:
    """Scores are sigmoid(logit) of the model's own logits, in request order; the task defaults to the trajectory's
    first user message and the patch to its final_patch."""
    candidates = [
        candidate("wrong", "return a - b + 0"),
        candidate("right", problem_statement="Make add return the sum."),
        candidate(
            "from-trajectory",
            patch="",
            trajectory=trajectory("cat calc.py", "def add(a, b): ...", final_patch=patch("return b + a")),
        ),
        candidate("no-steps", trajectory=tpb.Trajectory(), problem_statement=TASK, patch=patch("return sum((a, b))")),
    ]
    reply = await service.stub.Score(pb.ScoreRequest(candidates=candidates), timeout=60)
    expected = direct_logits(checkpoints.direct["v1"], candidates)
    assert reply.model_version == "v1"
    assert [s.candidate_id for s in reply.scores] == ["wrong", "right", "from-trajectory", "no-steps"]
    assert [s.logit for s in reply.scores] == pytest.approx(expected, abs=1e-4)
    assert [s.score for s in reply.scores] == pytest.approx([sigmoid(x) for x in expected], abs=1e-5)
    assert len({round(s.logit, 3) for s in reply.scores}) == 4  # the head tells these texts apart


async def test_rerank_excludes_failed_checks_and_breaks_ties_by_cluster(
    service: Service, checkpoints: Checkpoints
) -> None:
    """Excluded candidates go last with score 0 and a reason, unscored; the rest by score, and equal scores by
    patch-cluster size (then input order), with tie margin 0."""
    same = trajectory("python -m pytest -q", "4 passed in 0.02s")
    passing = pb.CandidateChecks(patch_applies=True, repro_tests_pass=True, regression_tests_pass=True)
    candidates = [
        pb.Candidate(candidate_id="lonely", trajectory=same, patch=long_patch("B")),  # same text as a1/a2, own cluster
        candidate("x-apply", "return a * b", checks=pb.CandidateChecks(patch_applies=False)),
        pb.Candidate(candidate_id="a1", trajectory=same, patch=long_patch("A")),
        candidate("f", "return b + a"),
        candidate("x-empty", patch="", trajectory=trajectory("ls", "calc.py")),
        pb.Candidate(candidate_id="a2", trajectory=same, patch=long_patch("A")),
        candidate("g", "return sum([a, b])", checks=passing),
        candidate(
            "x-tests",
            "return a + b + 0",
            checks=pb.CandidateChecks(patch_applies=True, repro_tests_pass=False, regression_tests_pass=False),
        ),
    ]
    assert normalise_patch(long_patch("A")) != normalise_patch(long_patch("B"))
    assert render_candidate(same, problem=TASK, patch=long_patch("A")) == render_candidate(
        same, problem=TASK, patch=long_patch("B")
    )
    texts_before = service.servicer.batcher.stats.texts
    reply = await service.stub.Rerank(
        pb.RerankRequest(task_id="calc-1", problem_statement=TASK, candidates=candidates, tie_margin=0.0), timeout=60
    )
    assert reply.tie_margin == 0.0
    # Five scored candidates, three of them one text: three texts go through the model.
    assert service.servicer.batcher.stats.texts - texts_before == 3
    kept = [c for c in candidates if not c.candidate_id.startswith("x-")]
    logits = dict(zip([c.candidate_id for c in kept], direct_logits(checkpoints.direct["v1"], kept, TASK), strict=True))
    logits["lonely"] = logits["a2"] = logits["a1"]
    clusters = {"a1": 2, "a2": 2}
    index = {c.candidate_id: i for i, c in enumerate(candidates)}
    expected = sorted(logits, key=lambda c: (-logits[c], -clusters.get(c, 1), index[c]))
    ranked = list(reply.ranked)
    assert [r.candidate_id for r in ranked] == [*expected, "x-apply", "x-empty", "x-tests"]
    assert [r.rank for r in ranked] == list(range(1, 9))
    assert reply.best_candidate_id == expected[0] and reply.model_version == "v1"
    by_id = {r.candidate_id: r for r in ranked}
    for c in expected:
        assert by_id[c].score == pytest.approx(sigmoid(logits[c]), abs=1e-5) and not by_id[c].excluded
        assert by_id[c].exclusion_reason == ""
    assert by_id["a1"].score == by_id["a2"].score == by_id["lonely"].score  # a tie, broken by cluster size
    assert expected.index("a1") + 1 == expected.index("a2") == expected.index("lonely") - 1
    assert by_id["a1"].cluster_id == by_id["a2"].cluster_id != by_id["lonely"].cluster_id
    assert (by_id["a1"].cluster_size, by_id["lonely"].cluster_size, by_id["f"].cluster_size) == (2, 1, 1)
    assert {
        c: (by_id[c].excluded, by_id[c].score, by_id[c].exclusion_reason) for c in ("x-apply", "x-empty", "x-tests")
    } == {
        "x-apply": (True, 0.0, "the patch does not apply"),
        "x-empty": (True, 0.0, "the patch is empty (nothing was submitted)"),
        "x-tests": (True, 0.0, "the reproduction tests fail; regression tests fail"),
    }
    assert by_id["x-empty"].cluster_id == "" and by_id["x-apply"].cluster_id != ""


async def test_rerank_with_every_candidate_excluded_names_no_best(service: Service) -> None:
    texts = service.servicer.batcher.stats.texts
    reply = await service.stub.Rerank(
        pb.RerankRequest(
            problem_statement=TASK,
            candidates=[candidate("a", patch=""), candidate("b", checks=pb.CandidateChecks(repro_tests_pass=False))],
        ),
        timeout=30,
    )
    assert reply.best_candidate_id == "" and [r.candidate_id for r in reply.ranked] == ["a", "b"]
    assert all(r.excluded and r.score == 0 for r in reply.ranked)
    assert service.servicer.batcher.stats.texts == texts  # nothing was scored


async def test_concurrent_small_requests_share_forwards(service: Service, checkpoints: Checkpoints) -> None:
    """Eight one-candidate Scores sent at once are scored in fewer forwards than requests, each with its own
    result."""
    candidates = [candidate(f"c{i}", f"return a + b + {i} - {i}") for i in range(8)]
    stats = service.servicer.batcher.stats
    forwards, started = stats.forwards, time.monotonic()
    replies = await asyncio.gather(
        *(service.stub.Score(pb.ScoreRequest(candidates=[c]), timeout=60) for c in candidates)
    )
    elapsed, used = time.monotonic() - started, stats.forwards - forwards
    expected = direct_logits(checkpoints.direct["v1"], candidates)
    assert [r.scores[0].candidate_id for r in replies] == [c.candidate_id for c in candidates]
    assert [r.scores[0].logit for r in replies] == pytest.approx(expected, abs=1e-4)
    assert used < len(candidates) and stats.max_batch >= 2, (used, stats)
    print(f"8 concurrent Scores: {used} forward(s), largest {stats.max_batch}, {elapsed * 1000:.0f} ms in all")


def many_steps(n: int) -> tpb.Trajectory:
    messages = [tpb.Message(role=tpb.ROLE_USER, content=TASK)]
    for i in range(n):
        messages += [
            tpb.Message(role=tpb.ROLE_ASSISTANT, content=f"{'think ' * 100}\n```bash\necho {i}\n```"),
            tpb.Message(role=tpb.ROLE_TOOL, content=f"<returncode>1</returncode>\n{'x' * 1500}"),
        ]
    return tpb.Trajectory(messages=messages, final_patch=patch("return a + b"))


async def test_rerank_gives_near_ties_to_the_larger_patch_cluster(service: Service) -> None:
    """Unset, the margin is the service's setting (0.05); scores within the margin of the best remaining one go to
    the larger cluster first (the rule of orchard.value.metrics.rank, which the unit tests pin). A margin of 1 makes
    every score a tie: a majority vote. A margin outside [0, 1] is refused."""
    candidates = [
        candidate("solo", "return a + b"),
        candidate("p1", "return b + a", trajectory=trajectory("ls", "x")),
        candidate("p2", "return b + a"),
        candidate("other", "return sum([a, b])"),
    ]
    patches = [c.patch for c in candidates]
    for margin in (None, 0.0, 0.2, 1.0):
        reply = await service.stub.Rerank(
            pb.RerankRequest(problem_statement=TASK, candidates=candidates, tie_margin=margin), timeout=60
        )
        used = TIE_MARGIN if margin is None else margin
        assert reply.tie_margin == pytest.approx(used)
        score = {r.candidate_id: r.score for r in reply.ranked}
        ranked = rank([score[c.candidate_id] for c in candidates], patches, tie_margin=used)
        expected = [candidates[r.index].candidate_id for r in ranked]
        assert [r.candidate_id for r in reply.ranked] == expected, (margin, score)
        if margin == 1.0:  # the pair first, whatever the scores
            assert sorted(expected[:2]) == ["p1", "p2"] and reply.ranked[0].cluster_size == 2
    for bad in (-0.1, 1.5, math.nan):
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await service.stub.Rerank(
                pb.RerankRequest(problem_statement=TASK, candidates=candidates, tie_margin=bad), timeout=30
            )
        err = from_rpc_error(caught.value)
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT and err.field == "tie_margin"
        assert "within [0, 1]" in err.message


BAD = [
    ([], "candidates", "candidates is empty"),
    ([candidate(f"c{i}") for i in range(17)], "candidates", "17 candidates exceed the limit of 16"),
    ([candidate("a"), candidate("")], "candidates[1].candidate_id", "is empty"),
    (
        [candidate("a"), candidate("b"), candidate("a")],
        "candidates[2].candidate_id",
        r"'a' is given twice \(candidates\[0\] and candidates\[2\]\)",
    ),
    ([candidate("a", trajectory=tpb.Trajectory())], "candidates[0].problem_statement", "no task statement"),
    (
        [candidate("a"), candidate("long", trajectory=many_steps(40))],
        "candidates[1].trajectory",
        "over the limit of 50000",
    ),
]


@pytest.mark.parametrize("method", ["Score", "Rerank"])
@pytest.mark.parametrize(("candidates", "field", "message"), BAD)
async def test_bad_input_names_the_field(
    service: Service, method: str, candidates: list[pb.Candidate], field: str, message: str
) -> None:
    request = pb.ScoreRequest(candidates=candidates) if method == "Score" else pb.RerankRequest(candidates=candidates)
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await getattr(service.stub, method)(request, timeout=30)
    err = from_rpc_error(caught.value)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT and err.field == field
    assert re.search(message, err.message), err.message
    ok = await service.stub.Score(pb.ScoreRequest(candidates=[candidate("fine")]), timeout=30)  # still serving
    assert ok.model_version == "v1"


async def test_load_model_switches_is_idempotent_and_survives_bad_checkpoints(
    checkpoints: Checkpoints, tmp_path: Path
) -> None:
    """Without a model Score/Rerank/GetModel say how to load one; LoadModel loads, a retry is a no-op, a bad path or
    a broken checkpoint is refused naming it while the old model keeps serving, and a switch serves the new
    version's scores, with what its manifest records."""
    probe = [candidate("a"), candidate("b", "return b + a")]
    async with value_service(batch_wait_ms=1) as service:
        stub = service.stub
        for call in (
            stub.Score(pb.ScoreRequest(candidates=probe), timeout=10),
            stub.Rerank(pb.RerankRequest(problem_statement=TASK, candidates=probe), timeout=10),
            stub.GetModel(pb.GetModelRequest(), timeout=10),
        ):
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await call
            assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert "LoadModel" in (caught.value.details() or "") and "--checkpoint" in (caught.value.details() or "")
        assert (await value_row(service.address, None)).detail == "SERVING, no model loaded (LoadModel or --checkpoint)"

        loaded = await stub.LoadModel(pb.LoadModelRequest(checkpoint_path=str(checkpoints.v1)), timeout=60)
        assert (loaded.model.version, loaded.previous_version) == ("v1", "")
        again = await stub.LoadModel(pb.LoadModelRequest(checkpoint_path=str(checkpoints.v1)), timeout=60)
        assert again.model == loaded.model and again.previous_version == "v1"  # no-op: same load_time

        not_dir = tmp_path / "plain"
        not_dir.mkdir()
        (not_dir / "config.json").write_text("{}")
        broken = tmp_path / "broken"
        shutil.copytree(checkpoints.v1, broken)
        (broken / HEAD_FILE).write_bytes(b"not safetensors")
        missing = tmp_path / "missing"
        for path, code, text in (
            ("", grpc.StatusCode.INVALID_ARGUMENT, "checkpoint_path is empty"),
            (str(missing), grpc.StatusCode.NOT_FOUND, f"value checkpoint {missing} not found"),
            (
                str(not_dir),
                grpc.StatusCode.INVALID_ARGUMENT,
                f"{not_dir} is not a value checkpoint (no value_config.json, value_head.safetensors)",
            ),
            (str(resolve_backbone("")[0]), grpc.StatusCode.INVALID_ARGUMENT, "is not a value checkpoint"),
            (str(broken), grpc.StatusCode.INVALID_ARGUMENT, f"cannot load value checkpoint {broken}"),
        ):
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await stub.LoadModel(pb.LoadModelRequest(checkpoint_path=path, version="other"), timeout=60)
            assert caught.value.code() == code and text in (caught.value.details() or ""), caught.value.details()
            assert from_rpc_error(caught.value).field == "checkpoint_path"
        assert (await stub.GetModel(pb.GetModelRequest(), timeout=10)).model == loaded.model
        before = await stub.Score(pb.ScoreRequest(candidates=probe), timeout=30)
        assert before.model_version == "v1"
        assert [s.logit for s in before.scores] == pytest.approx(
            direct_logits(checkpoints.direct["v1"], probe), abs=1e-4
        )

        # A switch while a request is in flight: that request is answered wholly by one model, the one it names.
        busy = [candidate(f"c{i}", f"return a + b + {i} - {i}") for i in range(12)]
        scored, switched = await asyncio.gather(
            stub.Score(pb.ScoreRequest(candidates=busy), timeout=60),
            stub.LoadModel(pb.LoadModelRequest(checkpoint_path=str(checkpoints.v2)), timeout=60),
        )
        assert [s.logit for s in scored.scores] == pytest.approx(
            direct_logits(checkpoints.direct[scored.model_version], busy), abs=1e-4
        )
        model = switched.model
        assert (model.version, switched.previous_version, model.job) == (V2_VERSION, "v1", "jobs/value-job")
        assert dict(model.metrics) == {"auc": 0.8, "best_at_8": 0.5} and model.checkpoint_path == str(checkpoints.v2)
        after = await stub.Score(pb.ScoreRequest(candidates=probe), timeout=30)
        assert after.model_version == V2_VERSION
        # v2's head weights are v1's negated (the bias 0.25 kept): logit_v2 = 0.5 - logit_v1.
        assert [s.logit for s in after.scores] == pytest.approx([0.5 - s.logit for s in before.scores], abs=1e-3)
        assert (await value_row(service.address, None)).detail.startswith(f"SERVING, model: {V2_VERSION} (")

        named = await stub.LoadModel(
            pb.LoadModelRequest(checkpoint_path=str(checkpoints.v1), version="v1-again"), timeout=60
        )
        assert (named.model.version, named.previous_version) == ("v1-again", V2_VERSION)


async def test_start_up_with_a_bad_checkpoint_fails_naming_it(tmp_path: Path) -> None:
    with pytest.raises(Exception, match=f"value checkpoint {tmp_path / 'nope'} not found"):
        await build(ValueSettings(port=0, checkpoint=tmp_path / "nope"))


async def test_status_row_of_an_unreachable_service() -> None:
    row = await value_row(f"127.0.0.1:{_free_port()}", None)
    assert not row.ok and row.name == "value" and row.detail.startswith("UNAVAILABLE")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def orchard(*args: str) -> tuple[int, str, str]:
    """Run the `orchard` command; (exit code, stdout, stderr)."""
    proc = await asyncio.create_subprocess_exec(
        ORCHARD, *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    async with asyncio.timeout(60):
        out, err = await proc.communicate()
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


@pytest.mark.slow
async def test_orchard_serve_value_serves_and_stops_on_sigterm(checkpoints: Checkpoints) -> None:
    """`orchard serve value --checkpoint` serves the checkpoint (as `orchard status --value-address` shows) and exits
    0 on SIGTERM; a missing checkpoint is one line, not a traceback."""
    code, _, err = await orchard("serve", "value", "--port", "0", "--checkpoint", "/nonexistent/ckpt")
    assert code != 0 and "Traceback" not in err
    assert "orchard serve value: value checkpoint /nonexistent/ckpt not found" in err
    port = _free_port()
    proc = await asyncio.create_subprocess_exec(
        ORCHARD, "serve", "value", "--port", str(port), "--checkpoint", str(checkpoints.v1), "--log-format", "text"
    )
    try:
        deadline = time.monotonic() + 90
        while not (await value_row(f"127.0.0.1:{port}", None)).ok:
            assert proc.returncode is None and time.monotonic() < deadline, "orchard serve value did not start"
            await asyncio.sleep(0.2)
        _, out, _ = await orchard("status", "--value-address", f"127.0.0.1:{port}")
        (row,) = [line for line in out.splitlines() if line.startswith("value ")]
        assert " up " in row and "SERVING, model: v1 (" in row
        proc.send_signal(signal.SIGTERM)
        async with asyncio.timeout(30):
            assert await proc.wait() == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
