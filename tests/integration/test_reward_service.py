"""The reward service over real gRPC, calling a real inference service with the embedded model (SmolLM2-135M on
CPU, both loaded once for the module): OPD teacher log-probs, the RPR judge's contract with a real (tiny) judge,
batches, deadlines and bad input; and the judge's test-evidence guards with a scripted judge (the tiny model never
writes usable rubric JSON). Outcome grading in real sandboxes is in test_reward_outcome.py."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import grpc
import pytest
import pytest_asyncio
from prometheus_client import REGISTRY

from orchard.inference.v1 import inference_pb2 as ipb
from orchard.inference.v1 import inference_pb2_grpc
from orchard.reward.v1 import reward_pb2 as pb
from orchard.reward.v1 import reward_pb2_grpc
from orchard.runtime import GrpcServer
from orchard.services.inference.server import build as build_inference
from orchard.services.inference.settings import InferenceSettings
from orchard.services.reward.models import ChatReply, Scores
from orchard.services.reward.server import build as build_reward
from orchard.services.reward.settings import RewardSettings
from orchard.types.v1 import types_pb2 as tpb

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.timeout(120)]

PROMPT = "<|im_start|>user\nWrite a function that adds two numbers.<|im_end|>\n<|im_start|>assistant\n"
ANSWER = "def add(a, b):\n    return a + b\n"
OBSERVATION = "\n<|im_start|>user\n[exit code 0]<|im_end|>\n<|im_start|>assistant\nDone."


@dataclass
class Stack:
    reward: reward_pb2_grpc.RewardServiceStub
    inference: inference_pb2_grpc.InferenceServiceStub
    servers: list[GrpcServer]
    channels: list[grpc.aio.Channel]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def stack() -> AsyncIterator[Stack]:
    """A real inference service and a reward service using it as judge and teacher."""
    inference, _ = await build_inference(
        InferenceSettings(port=0, log_format="text", grace_period_s=1.0, max_batch_size=8)
    )
    inference_port = await inference.start()
    reward = build_reward(
        RewardSettings(
            port=0,
            log_format="text",
            grace_period_s=1.0,
            inference_address=f"127.0.0.1:{inference_port}",
            env_address="127.0.0.1:9",
            max_concurrent_judges=4,
        )
    )
    reward_port = await reward.start()
    channels = [grpc.aio.insecure_channel(f"127.0.0.1:{p}") for p in (reward_port, inference_port)]
    yield Stack(
        reward_pb2_grpc.RewardServiceStub(channels[0]),
        inference_pb2_grpc.InferenceServiceStub(channels[1]),
        [reward, inference],
        channels,
    )
    for channel in channels:
        await channel.close()
    for server in (reward, inference):
        await server.stop()


async def tokens(stack: Stack, text: str) -> list[int]:
    return list((await stack.inference.Tokenize(ipb.TokenizeRequest(text=text), timeout=10)).token_ids)


async def student_sequence(stack: Stack) -> tuple[list[int], list[int], list[int]]:
    """(prompt ids, response ids, mask): model tokens (1), an observation (0), model tokens again (1)."""
    prompt, answer, obs = [await tokens(stack, t) for t in (PROMPT, ANSWER, OBSERVATION)]
    return prompt, answer + obs, [1] * len(answer) + [0] * (len(obs) - 2) + [1, 1]


async def test_teacher_logprobs_equal_score_tokens_and_carry_the_mask(stack: Stack) -> None:
    prompt, response, mask = await student_sequence(stack)
    student = [-0.25 if m else 0.0 for m in mask]
    started = time.monotonic()
    reply = await stack.reward.ComputeTeacherLogprobs(
        pb.ComputeTeacherLogprobsRequest(
            prompt_token_ids=prompt, response=tpb.TokenSpan(token_ids=response, mask=mask, logprobs=student)
        ),
        timeout=60,
    )
    elapsed = time.monotonic() - started
    direct = await stack.inference.ScoreTokens(
        ipb.ScoreTokensRequest(token_ids=ipb.TokenIds(ids=prompt), continuation_token_ids=response), timeout=60
    )
    reward = reply.reward
    t = reward.teacher
    assert reward.kind == tpb.REWARD_KIND_OPD and t.teacher_model == direct.model == "SmolLM2-135M-Instruct"
    assert list(t.teacher_logprobs) == pytest.approx(list(direct.logprobs), abs=1e-4)
    assert list(t.mask) == mask and t.truncated_tokens == 0 and t.teacher_weights_version == direct.weights_version
    used = [lp - s for lp, s, m in zip(t.teacher_logprobs, student, mask, strict=True) if m]
    assert reward.value == pytest.approx(sum(used) / len(used), abs=1e-5)
    print(
        f"teacher scored {len(prompt) + len(response)} tokens in {elapsed * 1000:.0f} ms "
        f"({(len(prompt) + len(response)) / elapsed:.0f} tokens/s incl. RPC)"
    )


async def test_teacher_context_cap_drops_from_the_start(stack: Stack) -> None:
    prompt, response, mask = await student_sequence(stack)
    cap = len(response) + 2
    reply = await stack.reward.ComputeTeacherLogprobs(
        pb.ComputeTeacherLogprobsRequest(
            prompt_token_ids=prompt, response=tpb.TokenSpan(token_ids=response, mask=mask), max_context_tokens=cap
        ),
        timeout=60,
    )
    t = reply.reward.teacher
    assert t.truncated_tokens == len(prompt) - 2 and list(t.mask) == mask and len(t.teacher_logprobs) == len(response)
    assert reply.reward.value == 0.0  # no student log-probs given


async def test_batch_teacher_runs_concurrently_in_order(stack: Stack) -> None:
    prompt, response, mask = await student_sequence(stack)
    requests = [
        pb.ComputeTeacherLogprobsRequest(
            prompt_token_ids=prompt, response=tpb.TokenSpan(token_ids=response[:n], mask=mask[:n])
        )
        for n in (len(response), 5, 12, 3)
    ]
    started = time.monotonic()
    reply = await stack.reward.BatchComputeTeacherLogprobs(
        pb.BatchComputeTeacherLogprobsRequest(requests=requests), timeout=60
    )
    elapsed = time.monotonic() - started
    assert [len(r.teacher.teacher_logprobs) for r in reply.rewards] == [len(response), 5, 12, 3]
    full = list(reply.rewards[0].teacher.teacher_logprobs)
    for r in reply.rewards[1:]:  # a prefix scores the same as the start of the whole sequence
        assert list(r.teacher.teacher_logprobs) == pytest.approx(full[: len(r.teacher.teacher_logprobs)], abs=1e-4)
    n = sum(len(prompt) + len(r.teacher.teacher_logprobs) for r in reply.rewards)
    print(f"batch of 4 scored {n} tokens in {elapsed * 1000:.0f} ms ({n / elapsed:.0f} tokens/s)")


@pytest.mark.parametrize(
    ("request_", "code", "message"),
    [
        (pb.BatchComputeTeacherLogprobsRequest(), grpc.StatusCode.INVALID_ARGUMENT, "requests is empty"),
        (
            pb.BatchComputeTeacherLogprobsRequest(
                requests=[
                    pb.ComputeTeacherLogprobsRequest(
                        prompt_token_ids=[1], response=tpb.TokenSpan(token_ids=[2], mask=[1])
                    ),
                    pb.ComputeTeacherLogprobsRequest(
                        prompt_token_ids=[1], response=tpb.TokenSpan(token_ids=[2, 3], mask=[1])
                    ),
                ]
            ),
            grpc.StatusCode.INVALID_ARGUMENT,
            "requests[1]: response.mask has 1 entries for 2 tokens",
        ),
        (
            pb.BatchComputeTeacherLogprobsRequest(
                requests=[
                    pb.ComputeTeacherLogprobsRequest(
                        prompt_token_ids=[1], response=tpb.TokenSpan(token_ids=[2, 10_000_000], mask=[1, 1])
                    )
                ]
            ),
            grpc.StatusCode.FAILED_PRECONDITION,
            "the teacher cannot score these tokens",
        ),
    ],
)
async def test_teacher_bad_input(
    stack: Stack, request_: pb.BatchComputeTeacherLogprobsRequest, code: grpc.StatusCode, message: str
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stack.reward.BatchComputeTeacherLogprobs(request_, timeout=30)
    assert caught.value.code() == code and message in (caught.value.details() or "")


def judge_request(alpha: float | None = None, max_tokens: int = 40, model: str = "") -> pb.JudgeTrajectoryRequest:
    traj = tpb.Trajectory(
        trajectory_id="t-judge",
        final_patch="diff --git a/m.py b/m.py\n-    return a - b\n+    return a + b\n",
        messages=[tpb.Message(role=tpb.ROLE_USER, content="add() subtracts.")],
    )
    traj.steps.add(
        index=0,
        model_output=tpb.Message(content="Reproduce first."),
        actions=[tpb.ToolCall(name="bash", arguments='{"command": "python -m pytest -q"}')],
        observations=[
            tpb.Observation(message=tpb.Message(content="FAILED test_m.py::test_add\n1 failed in 0.01s"), exit_code=1)
        ],
    )
    config = pb.JudgeConfig(max_tokens=max_tokens, judge_model=model)
    if alpha is not None:
        config.alpha = alpha
    outcome = tpb.Reward(
        kind=tpb.REWARD_KIND_OUTCOME, value=1.0, outcome=tpb.OutcomeDetails(status=tpb.OUTCOME_STATUS_RESOLVED)
    )
    return pb.JudgeTrajectoryRequest(trajectory=traj, outcome=outcome, config=config)


def assert_judge_contract(reward: tpb.Reward, r_bin: float = 1.0, alpha: float = 0.5) -> None:
    """Either a parsed score on the grid with R' = R_bin + alpha * J, or a clean fallback to R_bin with a reason."""
    d = reward.judge
    assert reward.kind == tpb.REWARD_KIND_RPR and d.outcome_reward == r_bin and d.alpha == alpha
    if d.fell_back:
        assert reward.value == r_bin and d.judge_score == 0 and d.fallback_reason and not d.scores
    else:
        assert [s.criterion_id for s in d.scores] == [f"R{i}" for i in range(1, 8)]
        assert all(round(s.score * 10) == pytest.approx(s.score * 10) and 0 <= s.score <= 1 for s in d.scores)
        assert reward.value == pytest.approx(r_bin + alpha * d.judge_score) and 0 <= d.judge_score <= 1


async def test_judge_with_the_real_model_keeps_the_contract(stack: Stack) -> None:
    started = time.monotonic()
    reply = await stack.reward.JudgeTrajectory(judge_request(), timeout=60)
    elapsed = time.monotonic() - started
    assert_judge_contract(reply.reward)
    d = reply.reward.judge
    assert d.judge_model == "SmolLM2-135M-Instruct"
    print(f"judge answered in {elapsed:.2f}s (40 tokens max): fell_back={d.fell_back} {d.fallback_reason[:80]!r}")


async def test_judge_alpha_zero_and_unknown_model(stack: Stack) -> None:
    reply = await stack.reward.JudgeTrajectory(judge_request(alpha=0.0), timeout=10)
    assert reply.reward.value == 1.0 and reply.reward.judge.fallback_reason == "alpha is 0: no judge call made"
    reply = await stack.reward.JudgeTrajectory(judge_request(model="no-such-judge"), timeout=10)
    assert_judge_contract(reply.reward)
    assert reply.reward.judge.fell_back and reply.reward.judge.fallback_reason.startswith("judge call failed")


async def test_batch_judge_honours_the_deadline(stack: Stack) -> None:
    """Judges that cannot finish before the caller's deadline fall back (with the reason) instead of failing."""
    started = time.monotonic()
    reply = await stack.reward.BatchJudgeTrajectories(
        pb.BatchJudgeTrajectoriesRequest(requests=[judge_request(max_tokens=400) for _ in range(3)]), timeout=4
    )
    assert time.monotonic() - started < 4  # answered within the caller's deadline (three judges take minutes)
    assert len(reply.rewards) == 3
    for r in reply.rewards:
        assert_judge_contract(r)
        assert r.judge.fell_back and "timed out" in r.judge.fallback_reason


async def test_batch_judge_in_order(stack: Stack) -> None:
    requests = [judge_request(max_tokens=8), judge_request(alpha=0.0), judge_request(alpha=1.0, max_tokens=8)]
    reply = await stack.reward.BatchJudgeTrajectories(pb.BatchJudgeTrajectoriesRequest(requests=requests), timeout=60)
    for r, alpha in zip(reply.rewards, (0.5, 0.0, 1.0), strict=True):
        assert_judge_contract(r, alpha=alpha)
    assert reply.rewards[1].judge.fallback_reason == "alpha is 0: no judge call made"


async def test_judge_bad_input(stack: Stack) -> None:
    bad = judge_request()
    bad.ClearField("outcome")
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stack.reward.BatchJudgeTrajectories(
            pb.BatchJudgeTrajectoriesRequest(requests=[judge_request(), bad]), timeout=10
        )
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "requests[1]: outcome is required" in (caught.value.details() or "")


class ScriptedJudge:
    """FAKE judge model: always answers with the same rubric JSON. Used because the embedded model cannot write
    rubric JSON and the guards need exact scores; everything else (gRPC, servicer, judge, guards) is real."""

    def __init__(self, answer: str) -> None:
        self.answer = answer

    async def chat(
        self, model: str, system: str, user: str, *, temperature: float, max_tokens: int, timeout: float
    ) -> ChatReply:
        return ChatReply(text=self.answer, model="scripted-judge")

    async def score(self, model: str, context_ids: list[int], continuation_ids: list[int], *, timeout: float) -> Scores:
        raise AssertionError("the scripted judge scores no tokens")

    async def context_length(self, model: str, *, timeout: float) -> int:
        raise AssertionError("the scripted judge has no context length")


GUARD_SCORES = {"R1": 0.8, "R2": 1.0, "R3": 0.5, "R4": 0.7, "R5": 0.6, "R6": 0.0, "R7": 0.9}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def scripted_reward() -> AsyncIterator[reward_pb2_grpc.RewardServiceStub]:
    """A reward service whose judge is the scripted fake; it cites step 0 and scores R2 = 1.0, R4 = 0.7."""
    answer = json.dumps({"reasoning": "Step 0 checks the fix thoroughly.", "scores": GUARD_SCORES})
    server = build_reward(
        RewardSettings(
            port=0, log_format="text", grace_period_s=1.0, env_address="127.0.0.1:9", inference_address="127.0.0.1:9"
        ),
        models=ScriptedJudge(answer),
    )
    port = await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    yield reward_pb2_grpc.RewardServiceStub(channel)
    await channel.close()
    await server.stop()


async def test_judge_guards_cap_a_trajectory_that_ran_no_test(
    scripted_reward: reward_pb2_grpc.RewardServiceStub,
) -> None:
    """A mini-swe-agent-style trajectory that only reads and edits gets R2 and R4 clamped to 0.5 and J capped at 0.3,
    reported in `adjustments`; one whose cited step 0 ran pytest keeps the judge's scores."""
    untested = judge_request()
    untested.trajectory.ClearField("steps")
    untested.trajectory.messages.extend(
        [
            tpb.Message(role=tpb.ROLE_ASSISTANT, content="Read it.\n```bash\ncat m.py\n```"),
            tpb.Message(role=tpb.ROLE_USER, content="<returncode>0</returncode>\n<output>\ndef add(a, b):\n</output>"),
            tpb.Message(role=tpb.ROLE_ASSISTANT, content="Fix it.\n```bash\nsed -i 's/a - b/a + b/' m.py\n```"),
        ]
    )
    capped_before = (
        REGISTRY.get_sample_value("orchard_reward_judge_guard_adjustments_total", {"rubric": "swe", "criterion": "J"})
        or 0.0
    )
    reply = await scripted_reward.BatchJudgeTrajectories(
        pb.BatchJudgeTrajectoriesRequest(requests=[untested, judge_request()]), timeout=10
    )
    capped, kept = reply.rewards
    assert_judge_contract(capped)
    assert not capped.judge.fell_back and capped.judge.judge_score == 0.3
    assert capped.value == pytest.approx(1.0 + 0.5 * 0.3)
    assert list(capped.judge.adjustments) == [
        "R2 capped at 0.5 (judge gave 1): no step ran a test",
        "R4 capped at 0.5 (judge gave 0.7): no step ran a test",
        "J capped at 0.3 (was 0.555): no step ran a test",
    ]
    assert {s.criterion_id: s.score for s in capped.judge.scores if s.criterion_id in ("R2", "R4")} == {
        "R2": 0.5,
        "R4": 0.5,
    }
    assert_judge_contract(kept)
    assert kept.judge.judge_score == pytest.approx(0.675) and not kept.judge.adjustments
    assert (
        REGISTRY.get_sample_value("orchard_reward_judge_guard_adjustments_total", {"rubric": "swe", "criterion": "J"})
        == capped_before + 1
    )
