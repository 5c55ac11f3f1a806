"""Outcome rewards from the reward service over real gRPC, graded in real sandboxes of a real env service: a
ToyRepair gold patch resolves (+1), the empty patch does not (-1), configured values apply, rollouts that did not
submit are not graded, and an eval-script spec grades inside a caller's sandbox."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from env_helpers import EnvServer, needs_image, needs_sandboxes

from orchard.reward.v1 import reward_pb2 as pb
from orchard.reward.v1 import reward_pb2_grpc
from orchard.sdk import AsyncSandboxClient
from orchard.services.reward.server import build
from orchard.services.reward.settings import RewardSettings
from orchard.tasks import SANDBOX_ENV, load_instances, setup_repo
from orchard.types.v1 import types_pb2 as tpb

TASKS = load_instances("toyrepair")
LEAP = next(t for t in TASKS if t.instance_id == "toyrepair-leap-year-logic")


pytestmark = [needs_sandboxes, pytest.mark.timeout(180), needs_image(LEAP.image)]


@pytest.fixture
async def reward(env: EnvServer) -> AsyncIterator[reward_pb2_grpc.RewardServiceStub]:
    """A reward service grading in the real env service (no inference service is needed for outcomes)."""
    server = build(
        RewardSettings(
            port=0,
            log_format="text",
            grace_period_s=1.0,
            env_address=f"127.0.0.1:{env.server.port}",
            inference_address="127.0.0.1:9",
        )
    )
    port = await server.start()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        yield reward_pb2_grpc.RewardServiceStub(channel)
    await server.stop()


def request(patch: str, **fields: Any) -> pb.ComputeOutcomeRewardRequest:
    return pb.ComputeOutcomeRewardRequest(
        task_set="toyrepair", task_id=LEAP.instance_id, patch=patch, stop_reason=tpb.STOP_REASON_SUBMITTED, **fields
    )


async def test_gold_patch_resolves_and_empty_patch_does_not(reward: reward_pb2_grpc.RewardServiceStub) -> None:
    gold, empty, zero = await asyncio.gather(
        reward.ComputeOutcomeReward(request(LEAP.patch), timeout=150),
        reward.ComputeOutcomeReward(request(""), timeout=150),
        reward.ComputeOutcomeReward(request("", config=pb.OutcomeRewardConfig(unresolved_reward=0.0)), timeout=150),
    )
    g, e = gold.reward, empty.reward
    assert g.kind == tpb.REWARD_KIND_OUTCOME and g.value == 1.0 and g.outcome.status == tpb.OUTCOME_STATUS_RESOLVED
    assert g.outcome.patch_applied and g.outcome.fail_to_pass_passed == g.outcome.fail_to_pass_total == 2
    assert e.value == -1.0 and e.outcome.status == tpb.OUTCOME_STATUS_UNRESOLVED and not e.outcome.error
    assert e.outcome.fail_to_pass_passed == 0
    assert zero.reward.value == 0.0 and zero.reward.outcome.status == tpb.OUTCOME_STATUS_UNRESOLVED
    print(f"graded 3 patches concurrently; gold {g.outcome.duration.ToTimedelta().total_seconds():.1f}s")


async def test_not_submitted_and_aborted_rollouts_are_not_graded(reward: reward_pb2_grpc.RewardServiceStub) -> None:
    truncated = await reward.ComputeOutcomeReward(
        pb.ComputeOutcomeRewardRequest(
            stop_reason=tpb.STOP_REASON_STEP_LIMIT, config=pb.OutcomeRewardConfig(truncated_reward=-0.5)
        ),
        timeout=5,
    )
    assert truncated.reward.value == -0.5 and truncated.reward.outcome.status == tpb.OUTCOME_STATUS_TRUNCATED
    aborted = await reward.ComputeOutcomeReward(
        pb.ComputeOutcomeRewardRequest(stop_reason=tpb.STOP_REASON_ENV_ERROR), timeout=5
    )
    assert aborted.reward.outcome.status == tpb.OUTCOME_STATUS_ERROR and "mask it out" in aborted.reward.outcome.error


async def test_unknown_task_and_bad_spec(reward: reward_pb2_grpc.RewardServiceStub) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await reward.ComputeOutcomeReward(
            pb.ComputeOutcomeRewardRequest(task_set="toyrepair", task_id="nope"), timeout=10
        )
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND and "nope" in (caught.value.details() or "")
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await reward.ComputeOutcomeReward(pb.ComputeOutcomeRewardRequest(spec=pb.TestSpec(image="x")), timeout=10)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "spec.eval_script is empty" in (caught.value.details() or "")


async def test_eval_script_spec_in_the_callers_sandbox(
    env: EnvServer, reward: reward_pb2_grpc.RewardServiceStub
) -> None:
    """SWE-bench-harness style: the sandbox holds the repo; the eval script applies the hidden tests and runs them."""
    async with AsyncSandboxClient(f"127.0.0.1:{env.server.port}") as client:
        sandbox = await client.create_sandbox(LEAP.image, env=SANDBOX_ENV)
        await setup_repo(sandbox, LEAP)
        script = (
            f"cat > /tmp/test.patch <<'ORCHARD_EOF'\n{LEAP.test_patch}ORCHARD_EOF\n"
            f"git apply /tmp/test.patch\n{LEAP.test_cmd} {' '.join(LEAP.test_files)}\n"
        )
        spec = pb.TestSpec(
            workdir=LEAP.workdir,
            eval_script=script,
            log_parser="pytest_v2",
            fail_to_pass=LEAP.fail_to_pass,
            pass_to_pass=LEAP.pass_to_pass,
        )
        reply = await reward.ComputeOutcomeReward(
            pb.ComputeOutcomeRewardRequest(
                task_id=LEAP.instance_id, spec=spec, patch=LEAP.patch, sandbox_id=sandbox.sandbox_id
            ),
            timeout=120,
        )
        assert reply.reward.value == 1.0, reply.reward.outcome.log_tail
        assert (await sandbox.refresh()).sandbox_id == sandbox.sandbox_id  # the caller's sandbox is kept
