"""RL jobs (trainers/rl_job.py) through the real trainer gRPC API, with real env, inference and reward services
and real sandboxes: a tiny random-init model (trainer_service_helpers.tiny_model, SmolLM2's tokenizer) is both the
inference service's policy and the job's base model, a step is one or two short ToyRepair groups. The tiny model
never solves a task (every reward is -1), so the tests that need the weights to move use weight decay or an OPD
teacher (a second tiny model) for a gradient; the pure helpers of the recipe are tested first, without I/O."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import signal
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
import pytest_asyncio
import torch
from env_helpers import EnvServer, needs_image, needs_sandboxes
from experience_helpers import NatsServer
from google.protobuf.duration_pb2 import Duration
from trainer_service_helpers import tiny_model, trainer_service

from orchard.errors import InvalidArgument, Unimplemented
from orchard.inference.v1 import inference_pb2 as ipb
from orchard.inference.v1 import inference_pb2_grpc
from orchard.reward.v1 import reward_pb2 as rpb
from orchard.runtime import GrpcServer
from orchard.services.inference.server import build as build_inference
from orchard.services.inference.settings import InferenceSettings
from orchard.services.reward.server import build as build_reward
from orchard.services.reward.settings import RewardSettings
from orchard.tasks import load_instances
from orchard.trainer.v1 import trainer_pb2 as pb
from orchard.trainers import bar, optim, rl, rl_job
from orchard.types.v1 import types_pb2 as tpb

TASKS = load_instances("toyrepair")


# -- pure helpers -------------------------------------------------------------------------------------------------


def test_step_prompts_are_distinct_seeded_and_cover_the_pool() -> None:
    steps = [rl_job.step_prompts(8, k, 3, seed=5) for k in range(8)]
    assert all(len(set(p)) == 3 for p in steps)
    assert steps == [rl_job.step_prompts(8, k, 3, seed=5) for k in range(8)]  # a resumed job sees the same
    assert steps[0] != rl_job.step_prompts(8, 0, 3, seed=6)
    first_pass = [i for p in steps[:2] for i in p] + rl_job.step_prompts(8, 2, 3, seed=5)[:2]
    assert sorted(first_pass) == list(range(8))  # one pass covers the pool before any instance repeats
    assert sorted(rl_job.step_prompts(2, 4, 5, seed=1)) == [0, 1]  # never more than the pool


def test_trajectory_row_keeps_exact_tokens_up_to_the_last_sampled_one() -> None:
    traj = tpb.Trajectory(prompt_tokens=tpb.TokenSpan(token_ids=[1, 2, 3], mask=[0, 0, 0]))
    traj.steps.add(tokens=tpb.TokenSpan(token_ids=[4, 5, 6, 7], logprobs=[-0.5, -0.25, 0.0, 0.0], mask=[1, 1, 0, 0]))
    traj.steps.add(tokens=tpb.TokenSpan(token_ids=[8, 9, 10], logprobs=[-1.0, 0.0, 0.0], mask=[1, 0, 0]))
    row = rl_job.trajectory_row(traj, advantage=0.75)
    assert row.token_ids == [1, 2, 3, 4, 5, 6, 7, 8]  # the observation after the last sample has no loss
    assert row.mask == [0, 0, 0, 1, 1, 0, 0, 1]
    assert row.logprobs == [0, 0, 0, -0.5, -0.25, 0, 0, -1.0]
    assert (row.prompt_len, row.advantage) == (3, 0.75)
    empty = rl_job.trajectory_row(tpb.Trajectory(prompt_tokens=tpb.TokenSpan(token_ids=[1, 2], mask=[0, 0])))
    assert (empty.token_ids, empty.prompt_len) == ([], 0)


def test_sampled_logprobs_equal_the_full_forward_at_sampled_tokens(tiny: Path) -> None:
    from transformers import AutoModelForCausalLM

    from orchard.trainers.sft import token_logprobs

    model = AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32)
    rows = [
        rl_job.Row(list(range(200, 212)), [0] * 5 + [1] * 3 + [0, 0, 1, 1], [0.0] * 12, 5),
        rl_job.Row(list(range(300, 307)), [0, 0, 0, 1, 1, 1, 1], [0.0] * 7, 3),
    ]
    t = rl_job.batch_tensors(rows, pad_id=0)
    assert t["mask"][1].tolist() == [0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0, 0]  # right padding has no loss
    with torch.no_grad():
        full = token_logprobs(model(input_ids=t["ids"], attention_mask=t["attention"].long()).logits, t["ids"])
        sampled = rl_job.sampled_logprobs(model, t["ids"], t["attention"], t["mask"])
    assert torch.allclose(sampled, full * t["mask"], atol=1e-5)


def test_several_updates_per_step_move_the_policy_further_within_the_clip_range(tiny: Path) -> None:
    """updates_per_step passes over one batch: the first pass is on-policy (its log-prob gap is 0), later ones move
    the policy further (a larger KL) until the clip range holds the sampled tokens back (clipped in the last pass)."""
    from transformers import AutoModelForCausalLM

    def run(updates: int) -> tuple[dict[str, float], torch.Tensor]:
        model = AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32)
        rows = [
            rl_job.Row(list(range(200, 212)), [0] * 4 + [1] * 8, [0.0] * 12, 4, advantage=1.0),
            rl_job.Row(list(range(300, 312)), [0] * 4 + [1] * 8, [0.0] * 12, 4, advantage=-1.0),
        ]
        t = rl_job.batch_tensors(rows, pad_id=0)
        with torch.no_grad():
            behaviour = rl_job.sampled_logprobs(model, t["ids"], t["attention"], t["mask"])
        rows = [dataclasses.replace(r, logprobs=behaviour[i, : len(r.token_ids)].tolist()) for i, r in enumerate(rows)]
        o = optim.resolve(pb.Hyperparameters(seed=0, micro_batch_size=2, weight_decay=0.0), pb.JOB_KIND_RL)
        s = rl_job.settings(pb.JobConfig(kind=pb.JOB_KIND_RL, rl=pb.RlConfig(updates_per_step=updates)), o)
        figures = rl_job.update(model, optim.optimizer(model, o), rows, s, o, 3e-3, pad_id=0)
        with torch.no_grad():
            after = rl_job.sampled_logprobs(model, t["ids"], t["attention"], t["mask"])
        return figures, ((after - behaviour) * t["mask"]).sum(-1) / t["mask"].sum(-1)

    one, moved_one = run(1)
    many, moved_many = run(12)
    assert one["logprob_diff_max"] < 1e-5 and many["logprob_diff_max"] < 1e-5  # the first pass is on-policy
    assert one["clip_fraction"] == 0.0 and many["clip_fraction"] > 0.5, (one, many)
    assert many["kl"] > 4 * one["kl"] > 0, (one, many)
    # The advantaged row's tokens gained and the other's lost, more with more passes. (The clip range does not
    # bound the move exactly: a clipped token has no gradient, but Adam's momentum carries on.)
    assert moved_many[0] > moved_one[0] > 0 > moved_one[1] > moved_many[1], (moved_one, moved_many)
    assert many["trained_tokens"] == one["trained_tokens"] == 16


def test_rows_without_advantage_are_skipped_and_the_update_is_unchanged(tiny: Path) -> None:
    """A row with advantage 0 has no gradient: update() leaves it out of the passes (about half the rows with
    negative_advantage_scale 0) but not out of the token-mean denominator, so the step equals the loss over every
    row computed in one batch by hand, and the figures count only the rows that went through."""
    from transformers import AutoModelForCausalLM

    rows = [
        rl_job.Row(list(range(200, 212)), [0] * 4 + [1] * 8, [0.0] * 12, 4, advantage=1.5),
        rl_job.Row(list(range(300, 310)), [0] * 4 + [1] * 6, [0.0] * 10, 4, advantage=0.0),
        rl_job.Row(list(range(400, 409)), [0] * 3 + [1] * 6, [0.0] * 9, 3, advantage=-0.5),
    ]
    o = optim.resolve(pb.Hyperparameters(seed=0, micro_batch_size=1, weight_decay=0.0), pb.JOB_KIND_RL)
    s = rl_job.settings(pb.JobConfig(kind=pb.JOB_KIND_RL, rl=pb.RlConfig()), o)
    model = AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32)
    t = rl_job.batch_tensors(rows, pad_id=0)
    with torch.no_grad():
        behaviour = rl_job.sampled_logprobs(model, t["ids"], t["attention"], t["mask"])
    rows = [dataclasses.replace(r, logprobs=behaviour[i, : len(r.token_ids)].tolist()) for i, r in enumerate(rows)]
    # SGD, so the step is linear in the gradient (Adam's first step is its sign, which rounding can flip).
    figures = rl_job.update(model, torch.optim.SGD(model.parameters()), rows, s, o, 0.1, pad_id=0)
    assert (figures["trained_tokens"], figures["trained_trajectories"]) == (8 + 6, 2)  # not the zero row's 6

    reference = AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32)
    opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    t = rl_job.batch_tensors(rows, pad_id=0)  # with the behaviour log-probs
    logp = rl_job.sampled_logprobs(reference, t["ids"], t["attention"], t["mask"])
    advantages = torch.tensor([r.advantage for r in rows])
    loss, _ = rl.policy_loss(logp, t["old"], advantages, t["mask"], s.clip_low, s.clip_high, s.aggregation)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(reference.parameters(), o.max_grad_norm)
    opt.step()
    moved = [(a - b).abs().max() for a, b in zip(model.parameters(), reference.parameters(), strict=True)]
    assert max(moved) < 1e-6, max(moved)
    untouched = AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32)
    assert any((a - b).abs().max() > 1e-5 for a, b in zip(model.parameters(), untouched.parameters(), strict=True))


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        (tpb.OUTCOME_STATUS_RESOLVED, 2.0),
        (tpb.OUTCOME_STATUS_UNRESOLVED, 0.0),
        (tpb.OUTCOME_STATUS_TRUNCATED, -1.0),
        (tpb.OUTCOME_STATUS_ERROR, None),
    ],
)
def test_outcome_value_maps_each_status(status: tpb.OutcomeStatus, expected: float | None) -> None:
    reward = tpb.Reward(kind=tpb.REWARD_KIND_OUTCOME, outcome=tpb.OutcomeDetails(status=status))
    assert rl_job.outcome_value(reward, (2.0, 0.0, -1.0)) == expected


def test_settings_fill_defaults_and_refuse_what_cannot_run() -> None:
    o = optim.resolve(pb.Hyperparameters(seed=3), pb.JOB_KIND_RL)
    s = rl_job.settings(pb.JobConfig(kind=pb.JOB_KIND_RL, rl=pb.RlConfig()), o)
    assert (s.group_size, s.prompts_per_step, s.bar, s.max_staleness, s.updates_per_step) == (4, 2, None, 0, 1)
    assert s.negative_scale == 1.0
    s = rl_job.settings(pb.JobConfig(kind=pb.JOB_KIND_RL, rl=pb.RlConfig(negative_advantage_scale=0.0)), o)
    assert s.negative_scale == 0.0  # set to 0, not unset
    assert (s.clip_low, s.clip_high, s.outcome, s.alpha, s.opd_coef) == (0.2, 0.28, (1.0, -1.0, -1.0), 0.0, 0.0)
    assert (s.sampling.temperature, s.sampling.top_p, s.sampling.seed) == (0.95, 0.95, 3)
    assert s.group_filter == bar.GroupFilter.DEFAULT
    rl = pb.RlConfig(
        group_size=2,
        bar=pb.BarConfig(max_group_size=4, stride=2, rho_max=0.5),
        judge=rpb.JudgeConfig(),
        opd=pb.OpdConfig(opd_only=True),
        max_staleness=1,
    )
    s = rl_job.settings(pb.JobConfig(kind=pb.JOB_KIND_RL, rl=rl), o)
    assert s.bar == bar.BarConfig(n=2, n_max=4, stride=2, rho_min=0.0, rho_max=0.5)
    assert (s.alpha, s.opd_coef, s.opd_only, s.max_staleness) == (0.5, 1.0, True, 1)
    for bad, error in [
        (pb.RlConfig(max_staleness=2), InvalidArgument),
        (pb.RlConfig(updates_per_step=65), InvalidArgument),
        (pb.RlConfig(updates_per_step=-1), InvalidArgument),
        (pb.RlConfig(negative_advantage_scale=1.5), InvalidArgument),
        (pb.RlConfig(bar=pb.BarConfig(max_group_size=4)), InvalidArgument),
        (pb.RlConfig(group_size=4, bar=pb.BarConfig(max_group_size=4, rho_max=1)), InvalidArgument),
        (pb.RlConfig(algorithm=pb.RL_ALGORITHM_RLOO), Unimplemented),
        (pb.RlConfig(entropy_coef=1e-4), Unimplemented),
        (pb.RlConfig(harness="mini-swe-agent"), InvalidArgument),
    ]:
        with pytest.raises(error):
            rl_job.settings(pb.JobConfig(kind=pb.JOB_KIND_RL, rl=bad), o)


# -- jobs through the services ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_model(tmp_path_factory.mktemp("model") / "tiny")


@pytest.fixture(scope="module")
def teacher_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_model(tmp_path_factory.mktemp("teacher") / "teacher", seed=1)


@dataclass
class Inference:
    address: str
    stub: inference_pb2_grpc.InferenceServiceStub


async def start_inference(model: Path) -> tuple[GrpcServer, Inference, grpc.aio.Channel]:
    server, _ = await build_inference(
        InferenceSettings(port=0, model=str(model), log_format="text", grace_period_s=1.0)
    )
    port = await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    return server, Inference(f"127.0.0.1:{port}", inference_pb2_grpc.InferenceServiceStub(channel)), channel


@pytest_asyncio.fixture
async def policy(tiny: Path) -> AsyncIterator[Inference]:
    """The inference service the jobs sample from and push to, serving the tiny model."""
    server, inference, channel = await start_inference(tiny)
    yield inference
    await channel.close()
    await server.stop()


def rl_config(model: Path, steps: int, **rl: Any) -> pb.JobConfig:
    """A short RL job on ToyRepair: one prompt, a group of two two-turn rollouts of 8-token replies per step."""
    fields: dict[str, Any] = {
        "group_size": 2,
        "prompts_per_step": 1,
        "group_filter": pb.GROUP_FILTER_NONE,
        "max_turns": 2,
        "max_concurrent_rollouts": 4,
        "sampling": ipb.SamplingParams(temperature=1.0, max_tokens=8),
        **rl,
    }
    # Every reward is -1 (no advantage): a large weight decay still moves the weights each step.
    return pb.JobConfig(
        kind=pb.JOB_KIND_RL,
        base_model=str(model),
        dataset=pb.DatasetSource(path="toyrepair"),
        hyperparameters=pb.Hyperparameters(max_steps=steps, learning_rate=0.05, weight_decay=2.0, seed=11),
        rl=pb.RlConfig(**fields),
    )


async def run_job(
    stub,
    job_id: str,  # type: ignore[no-untyped-def]
    config: pb.JobConfig,
) -> list[pb.StreamJobEventsResponse]:
    await stub.CreateJob(pb.CreateJobRequest(config=config, job_id=job_id))
    return [e async for e in stub.StreamJobEvents(pb.StreamJobEventsRequest(job_id=job_id), timeout=120)]


def of(events: list[pb.StreamJobEventsResponse], kind: str) -> list:  # type: ignore[type-arg]
    return [getattr(e, kind) for e in events if e.WhichOneof("event") == kind]


def sequence_logprobs(model_dir: str, ids: list[int]) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        return torch.log_softmax(model(input_ids=torch.tensor([ids])).logits[0, :-1], -1).gather(
            -1, torch.tensor(ids[1:])[:, None]
        )[:, 0]


@pytest.mark.timeout(90)
@needs_sandboxes
@needs_image(TASKS[0].image)
async def test_rl_job_pushes_every_step_and_samples_on_policy(
    env: EnvServer, policy: Inference, tiny: Path, tmp_path: Path
) -> None:
    env_address = f"127.0.0.1:{env.server.port}"
    async with trainer_service(tmp_path / "jobs", inference_address=policy.address, env_address=env_address) as stub:
        events = await run_job(stub, "rl-1", rl_config(tiny, steps=2, updates_per_step=3))
    job = events[-1].job
    assert job.state == pb.JOB_STATE_SUCCEEDED, job.error
    progress, checkpoints = of(events, "progress"), of(events, "checkpoint")
    assert [p.step for p in progress] == [1, 2] and progress[-1].total_steps == 2
    assert [c.version for c in checkpoints] == ["rl-1-step-1", "rl-1-step-2"] and checkpoints[-1].is_final
    for p in progress:
        m = p.metrics
        assert (m["rollouts"], m["env_steps"], m["groups_kept_fraction"]) == (2, 4, 1.0)  # 2 rollouts of 2 turns
        assert (m["reward_mean"], m["reward_std"], m["nonzero_variance_groups"]) == (-1.0, 0.0, 0.0)
        assert m["trained_trajectories"] == 2 and m["trained_tokens"] == 2 * 2 * 8
        assert m["updates"] == 3  # the job's setting reached its worker (the service stores configs as JSON)
        assert m["clip_fraction"] == 0.0 and m["tokens_per_second"] > 0 and m["rollout_seconds"] > 0
        assert m["stale_turn_fraction"] == 0.0  # step 2 sampled only with the step-1 weights
        # The trainer's log-probs of the sampled tokens are the inference service's: the same weights, at step 1
        # the base model, at step 2 the step-1 checkpoint the job pushed.
        assert m["logprob_diff_max"] < 1e-3, m
        # Every group is uniform (all -1): no advantage, and the step's KL on its tokens is reported (k3, >= 0).
        assert m["advantage_abs_mean"] == 0.0 and m["kl"] >= 0.0, m
    served = (await policy.stub.ListModels(ipb.ListModelsRequest(), timeout=10)).models[0]
    assert (served.weights_version, served.checkpoint_path) == ("rl-1-step-2", checkpoints[-1].path)
    # The step-1 weights are far from the base ones, so matching them at step 2 means they were served.
    ids = list(range(100, 140))
    moved = (sequence_logprobs(checkpoints[0].path, ids) - sequence_logprobs(str(tiny), ids)).abs().max()
    assert moved > 0.05, moved


@pytest.mark.slow
@pytest.mark.timeout(120)
@needs_sandboxes
@needs_image("claw")
async def test_rl_job_runs_on_assistant_tasks(env: EnvServer, policy: Inference, tiny: Path, tmp_path: Path) -> None:
    """rl.harness orchard-assistant samples the Claw tasks in sandboxes with real mail and calendar servers: each
    rollout is scored by its task's checks (the tiny model passes none: -1 each) and trained on."""
    env_address = f"127.0.0.1:{env.server.port}"
    config = rl_config(tiny, steps=1, harness="orchard-assistant")
    config.dataset.path = "claw"
    async with trainer_service(tmp_path / "jobs", inference_address=policy.address, env_address=env_address) as stub:
        events = await run_job(stub, "rl-claw", config)
    job = events[-1].job
    assert job.state == pb.JOB_STATE_SUCCEEDED, job.error
    [progress] = of(events, "progress")
    m = progress.metrics
    assert (m["rollouts"], m["env_steps"], m["reward_mean"]) == (2, 4, -1.0), dict(m)
    assert m["trained_trajectories"] == 2 and m["logprob_diff_max"] < 1e-3
    judged = rl_config(tiny, steps=1, harness="orchard-assistant", judge=rpb.JudgeConfig(alpha=0.5))
    with pytest.raises(Unimplemented, match="leave rl.judge unset"):
        rl_job.settings(judged, optim.resolve(judged.hyperparameters, pb.JOB_KIND_RL))


@pytest.mark.slow
@pytest.mark.timeout(120)
@needs_sandboxes
@needs_image(TASKS[0].image)
async def test_rl_job_with_bar_judge_teacher_and_staleness(
    env: EnvServer, policy: Inference, tiny: Path, teacher_model: Path, tmp_path: Path
) -> None:
    """BAR groups, the RPR judge and an OPD teacher through a real reward service (on a second inference service
    with a different tiny model, so the OPD term has a gradient), with rollouts overlapping training."""
    env_address = f"127.0.0.1:{env.server.port}"
    server, teacher, channel = await start_inference(teacher_model)
    reward = build_reward(
        RewardSettings(
            port=0, log_format="text", grace_period_s=1.0, inference_address=teacher.address, env_address=env_address
        )
    )
    reward_port = await reward.start()
    try:
        bar_config = pb.BarConfig(max_group_size=4, stride=2, rho_min=0.25, rho_max=0.75)  # needs one positive
        config = rl_config(
            tiny,
            steps=2,
            group_size=2,
            bar=bar_config,
            judge=rpb.JudgeConfig(alpha=0.5, max_tokens=8),
            opd=pb.OpdConfig(kl_coef=1.0),
            max_staleness=1,
        )
        config.hyperparameters.weight_decay = 0.0
        async with trainer_service(
            tmp_path / "jobs",
            inference_address=policy.address,
            env_address=env_address,
            reward_address=f"127.0.0.1:{reward_port}",
        ) as stub:
            events = await run_job(stub, "rl-mix", config)
    finally:
        await reward.stop()
        await channel.close()
        await server.stop()
    job = events[-1].job
    assert job.state == pb.JOB_STATE_SUCCEEDED, job.error
    progress = of(events, "progress")
    assert [p.step for p in progress] == [1, 2]
    for p in progress:
        m = p.metrics
        # BAR: all -1 at every stride, so both rounds run (4 rollouts) and the relaxed group of 2 is trained.
        assert (m["rollouts"], m["trained_trajectories"]) == (4, 2)
        # The tiny judge never writes rubric JSON: every score falls back to the outcome reward, as designed.
        assert m["judge_fallback_fraction"] == 1.0 and m["reward_mean"] == -1.0
        # OPD gave signal (its sign follows the sampled tokens, which the per-task seeds redrew)
        assert m["opd_loss"] != 0 and m["teacher_logprob_gap"] != 0 and m["grad_norm"] > 0
    assert progress[0].metrics["logprob_diff_max"] < 1e-3  # step 1 samples the base weights
    # Step 2's rollouts started while step 1 trained: at least their first turns used the base weights.
    assert progress[1].metrics["stale_turn_fraction"] > 0
    served = (await policy.stub.ListModels(ipb.ListModelsRequest(), timeout=10)).models[0]
    assert served.weights_version == "rl-mix-step-2"


@pytest.mark.slow
@pytest.mark.timeout(120)
@needs_sandboxes
@needs_image(TASKS[0].image)
async def test_a_killed_rl_worker_resumes_from_its_checkpoint(
    env: EnvServer, policy: Inference, tiny: Path, tmp_path: Path, nats_server: NatsServer
) -> None:
    """...and every rollout of both workers reaches the experience store through NATS under run id = job id,
    each with its own trajectory id (the resumed worker never reuses its predecessor's)."""
    from orchard.experience.v1 import experience_pb2 as epb
    from orchard.experience.v1 import experience_pb2_grpc
    from orchard.services.experience.server import build as build_experience
    from orchard.services.experience.settings import ExperienceSettings

    experience, store = await build_experience(
        ExperienceSettings(
            port=0,
            nats_url=nats_server.url,
            store_url=f"sqlite:///{tmp_path / 'e.db'}",
            log_format="text",
            grace_period_s=1,
        )
    )
    experience_port = await experience.start()
    jobs = tmp_path / "jobs"
    env_address = f"127.0.0.1:{env.server.port}"
    async with trainer_service(
        jobs, inference_address=policy.address, env_address=env_address, nats_url=nats_server.url
    ) as stub:
        await stub.CreateJob(pb.CreateJobRequest(config=rl_config(tiny, steps=2), job_id="rl-crash"))
        async for event in stub.StreamJobEvents(pb.StreamJobEventsRequest(job_id="rl-crash"), timeout=120):
            if event.WhichOneof("event") == "progress":  # step 1 pushed; the worker now samples step 2
                break
        os.killpg(int((jobs / "rl-crash" / "worker.pid").read_text()), signal.SIGKILL)
        done = (
            await stub.WaitJob(pb.WaitJobRequest(job_id="rl-crash", timeout=Duration(seconds=100)), timeout=110)
        ).job
    assert done.state == pb.JOB_STATE_SUCCEEDED, done.error
    log = (jobs / "rl-crash" / "worker.log").read_text()
    assert "resuming rl-crash from step 1 " in log and "inference now serves rl-crash-step-1 " in log, log[-2000:]
    events = [json.loads(line) for line in (jobs / "rl-crash" / "events.jsonl").read_text().splitlines()]
    progress = [e for e in events if e["kind"] == "progress"]
    assert [e["step"] for e in progress] == [1, 2]  # step 1 is not run again
    assert progress[-1]["metrics"]["logprob_diff_max"] < 1e-3
    served = (await policy.stub.ListModels(ipb.ListModelsRequest(), timeout=10)).models[0]
    assert served.weights_version == "rl-crash-step-2"
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{experience_port}") as channel:
            store_stub = experience_pb2_grpc.ExperienceServiceStub(channel)
            request = epb.ListTrajectoriesRequest(
                filter=epb.TrajectoryFilter(run_ids=["rl-crash"]), view=epb.TRAJECTORY_VIEW_BASIC
            )
            for _ in range(100):  # the store takes the events a moment after they were published
                finished = (await store_stub.ListTrajectories(request, timeout=10)).trajectories
                if len(finished) >= 4:
                    break
                await asyncio.sleep(0.1)
    finally:
        await experience.stop()
    # Steps 1 and 2 of the trained run: 2 rollouts each, all finished and graded; the killed worker's unfinished
    # step-2 rollouts (if it got that far) keep their own ids and are not among the finished ones.
    assert len(finished) == 4 and len({t.trajectory_id for t in finished}) == 4
    assert all(t.rewards for t in finished)
    resumed = [t for t in finished if t.sample_index >= 2 * 2]  # attempt 1 starts at (1 * T + 1) * P = 6
    assert len(resumed) == 2 and min(t.sample_index for t in resumed) >= 6


@pytest.mark.timeout(90)
@needs_sandboxes
@needs_image(TASKS[0].image)
async def test_a_cancelled_rl_job_never_changes_the_served_weights(
    env: EnvServer, policy: Inference, tiny: Path, tmp_path: Path
) -> None:
    """A cancel that comes while a step samples stops the job at its next check (before the update, or at the latest
    before the push): the inference service keeps serving the weights it served when the job was cancelled."""
    env_address = f"127.0.0.1:{env.server.port}"
    async with trainer_service(tmp_path / "jobs", inference_address=policy.address, env_address=env_address) as stub:
        await stub.CreateJob(pb.CreateJobRequest(config=rl_config(tiny, steps=3), job_id="rl-stop"))
        async for event in stub.StreamJobEvents(pb.StreamJobEventsRequest(job_id="rl-stop"), timeout=60):
            if event.WhichOneof("event") == "progress":  # step 1 pushed; the worker now samples step 2
                break
        served = (await policy.stub.ListModels(ipb.ListModelsRequest(), timeout=10)).models[0]
        assert served.weights_version == "rl-stop-step-1"
        job = (await stub.CancelJob(pb.CancelJobRequest(job_id="rl-stop"), timeout=30)).job
    assert job.state == pb.JOB_STATE_CANCELLED and job.progress.step == 1, job
    served = (await policy.stub.ListModels(ipb.ListModelsRequest(), timeout=10)).models[0]
    assert served.weights_version == "rl-stop-step-1"
