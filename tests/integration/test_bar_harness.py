"""BAR (docs/training.md §2.3) over the harness: ToyRepair rollouts on a real env service with real sandboxes, each graded
in a fresh sandbox. The policy is the scripted model (a deterministic fake; the real model cannot solve tasks)
that applies the gold fix with a seeded per-task probability p, and otherwise a wrong edit."""

from __future__ import annotations

import json
import random
import time
from collections.abc import AsyncIterator

import pytest
from env_helpers import EnvServer, needs_image, needs_sandboxes
from prometheus_client import REGISTRY

from orchard.harness import AgentLoop, Limits, SamplingConfig, ScriptedModel, SWEHarness
from orchard.sdk import AsyncSandboxClient
from orchard.tasks import TaskInstance, load_instances
from orchard.tasks.grading import patched_files
from orchard.trainers.bar import BarConfig, Mode, Status, collect_batch
from orchard.trainers.bar_source import HarnessRolloutSource
from orchard.types.v1 import types_pb2 as tpb

TASKS = {t.instance_id: t for t in load_instances("toyrepair")}
NEVER, COIN, ALWAYS = "toyrepair-trivial-max-retries", "toyrepair-chunks-off-by-one", "toyrepair-leap-year-logic"
P_SOLVE = {NEVER: 0.0, COIN: 0.5, ALWAYS: 1.0}
SEED = 7
CONFIG = BarConfig(n=4, n_max=8, stride=4, rho_min=0.25, rho_max=0.75)
"""The v2 fork's settings: N / N_max / s = 4 / 8 / 4 (two rounds), strict n+ in [1, 3]."""
WRONG = "# a guess that fixes nothing"

pytestmark = [needs_sandboxes, pytest.mark.timeout(120), needs_image(TASKS[COIN].image)]


def tool_call(name: str, **arguments: object) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


def coin_fixer(tasks: list[TaskInstance]):  # type: ignore[no-untyped-def]
    """A policy that, per rollout, applies the gold patch with probability p (one seeded stream per task, drawn
    once per rollout) or appends a comment to the buggy file, then submits."""
    rngs = {t.instance_id: random.Random(f"{SEED}-{t.instance_id}") for t in tasks}

    def policy(prompt: str, step: int) -> str:
        task = next(t for t in tasks if t.problem_statement in prompt)
        if step > 0:
            return tool_call("submit")
        if rngs[task.instance_id].random() < P_SOLVE[task.instance_id]:
            return tool_call("bash", command=f"cat > /tmp/fix.patch <<'EOF'\n{task.patch}EOF\ngit apply /tmp/fix.patch")
        return tool_call("bash", command=f"echo '{WRONG}' >> {patched_files(task.patch)[0]}")

    return policy


def sandboxes_created() -> float:
    return REGISTRY.get_sample_value("orchard_env_sandboxes_created_total") or 0.0


@pytest.fixture
async def client(env: EnvServer) -> AsyncIterator[AsyncSandboxClient]:
    async with AsyncSandboxClient(f"127.0.0.1:{env.server.port}") as client:
        yield client


@pytest.mark.slow
async def test_bar_balances_harness_rollouts(client: AsyncSandboxClient) -> None:
    tasks = [TASKS[NEVER], TASKS[COIN], TASKS[ALWAYS]]
    model = ScriptedModel(coin_fixer(tasks), delay_s=0.1)
    loop = AgentLoop(model, Limits(max_steps=3), SamplingConfig(max_step_tokens=8192), run_id="bar")
    source = HarnessRolloutSource(loop, client, lambda t: SWEHarness(t, client, task_set="toyrepair"), concurrency=4)
    created_before, started = sandboxes_created(), time.monotonic()

    # The never-solved prompt comes first: its group is dropped and a later prompt takes its place.
    batch = await collect_batch(source, tasks, 1, CONFIG)
    elapsed = time.monotonic() - started
    never, coin, always = batch.results

    # 1. p = 0.5: a strict group within [ceil(.25·4), floor(.75·4)] = [1, 3], found at the first feasible round.
    positives = sum(r.reward > 0 for r in coin.group)
    assert coin.mode == Mode.STRICT and 1 <= positives <= 3 and len(coin.group) == CONFIG.n
    assert coin.generated == CONFIG.stride * coin.rounds
    # 2. p = 0 and p = 1: the whole budget, then the relaxed fallback's one-sided group, which the filter drops.
    for result, reward in ((never, -1.0), (always, 1.0)):
        assert (result.mode, result.rounds, result.generated) == (Mode.RELAXED, 2, CONFIG.n_max)
        assert [r.reward for r in result.group] == [reward] * CONFIG.n
    assert batch.groups == [coin.group]

    # 3. Every rollout submitted, was graded in its own fresh sandbox, and its reward is what the policy did.
    trajectories = source.trajectories
    assert len(trajectories) == batch.generated == 2 * CONFIG.n_max + coin.generated
    assert sandboxes_created() - created_before == 2 * len(trajectories)  # one to roll out, one to grade
    assert not [s async for s in client.list_sandboxes()]
    for traj in trajectories:
        assert traj.stop_reason == tpb.STOP_REASON_SUBMITTED, traj.stop_detail
        (reward,) = traj.rewards
        assert reward.outcome.fail_to_pass_total > 0 and reward.outcome.patch_applied
        assert (reward.value > 0) == (WRONG not in traj.final_patch), (traj.trajectory_id, traj.final_patch)
        assert traj.metadata["verify_status"] == ("resolved" if reward.value > 0 else "unresolved")
    kept = [r for result in batch.results for r in result.group]
    assert all(r.status == Status.COMPLETED and r.length > 0 and r.trajectory in trajectories for r in kept)
    # The seeded policy's draws decide the rewards, whatever order the rollouts ran in.
    for task, result in zip(tasks, batch.results, strict=True):
        rng = random.Random(f"{SEED}-{task.instance_id}")
        solved = sum(rng.random() < P_SOLVE[task.instance_id] for _ in range(result.generated))
        assert sum(t.rewards[0].value > 0 for t in trajectories if t.task_id == task.instance_id) == solved

    # 4. Ids are unique across rounds: sample indices continue per task.
    assert len({t.trajectory_id for t in trajectories}) == len(trajectories)
    for task, result in zip(tasks, batch.results, strict=True):
        indices = sorted(t.sample_index for t in trajectories if t.task_id == task.instance_id)
        assert indices == list(range(result.generated))
    assert model.max_in_flight <= 4
    print(
        f"{len(trajectories)} graded rollouts in {elapsed:.1f}s (coin task: {positives}/4 positive, "
        f"{coin.rounds} round(s); {model.max_in_flight} generating at once)"
    )
