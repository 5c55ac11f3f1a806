"""Smoke test of the SWE, web and assistant harnesses with the real embedded model (SmolLM2-135M-Instruct on CPU)
through the real
inference service and real sandboxes. The model is too weak to solve tasks; this checks that the loop runs and
that the recorded tokens are consistent: the prompt is the chat template's, log-probs match ScoreTokens on the
exact sequence, and the mask marks exactly the sampled tokens."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from env_helpers import EnvServer, needs_image, needs_sandboxes

from orchard.harness import (
    AgentLoop,
    InferenceModel,
    Limits,
    SamplingConfig,
    SWEHarness,
)
from orchard.harness.assistant import AssistantHarness
from orchard.harness.web import WebHarness
from orchard.inference.v1 import inference_pb2 as ipb
from orchard.runtime import GrpcServer
from orchard.sdk import AsyncSandboxClient
from orchard.services.inference.server import build
from orchard.services.inference.settings import InferenceSettings
from orchard.tasks import load_instances
from orchard.tasks.assistant import load_tasks as load_assistant_tasks
from orchard.tasks.web import SiteServer, load_tasks
from orchard.types.v1 import types_pb2 as tpb

TASK = next(t for t in load_instances("toyrepair") if t.instance_id.startswith("toyrepair-trivial-"))

pytestmark = [needs_sandboxes, pytest.mark.slow, pytest.mark.timeout(300), needs_image(TASK.image)]


@pytest_asyncio.fixture
async def inference() -> AsyncIterator[str]:
    """A real inference server with the embedded model; yields its address."""
    server: GrpcServer
    server, _engine = await build(InferenceSettings(port=0, log_format="text", grace_period_s=1.0))
    port = await server.start()
    yield f"127.0.0.1:{port}"
    await server.stop()


async def test_two_step_rollout_records_consistent_tokens(env: EnvServer, inference: str) -> None:
    model = InferenceModel(inference, sampling=SamplingConfig(temperature=0.7, max_step_tokens=48, seed=7))
    await model.connect()
    try:
        async with AsyncSandboxClient(f"127.0.0.1:{env.server.port}") as client:
            loop = AgentLoop(model, Limits(max_steps=2, wall_clock_s=240), model.sampling)
            traj = await loop.run(SWEHarness(TASK, client))
        assert traj.stop_reason in (
            tpb.STOP_REASON_STEP_LIMIT,
            tpb.STOP_REASON_SUBMITTED,
            tpb.STOP_REASON_FORMAT_ERROR,
        ), traj.stop_detail
        assert traj.policy.model == "SmolLM2-135M-Instruct" and traj.policy.weights_version
        opening = await model.render(list(traj.messages[:2]), list(traj.tools), add_generation_prompt=True)
        assert list(traj.prompt_tokens.token_ids) == opening.token_ids
        sequence = list(traj.prompt_tokens.token_ids)
        for step in traj.steps:
            tokens = step.tokens
            assert len(tokens.token_ids) == len(tokens.logprobs) == len(tokens.mask)
            sampled = [t for t, m in zip(tokens.token_ids, tokens.mask, strict=True) if m]
            assert len(sampled) == step.completion_token_count > 0 and step.prompt_token_count == len(sequence)
            assert tokens.mask[: len(sampled)] == [1] * len(sampled) and set(tokens.mask[len(sampled) :]) <= {0}
            # The behaviour log-probs are the model's own on exactly this sequence.
            scored = await model._call(
                "ScoreTokens",
                ipb.ScoreTokensRequest(token_ids=ipb.TokenIds(ids=sequence), continuation_token_ids=sampled),
                120,
            )
            assert list(scored.logprobs) == pytest.approx(list(tokens.logprobs[: len(sampled)]), abs=2e-3)  # type: ignore[attr-defined]
            sequence += tokens.token_ids
        assert traj.token_count == len(sequence)
        if traj.stop_reason == tpb.STOP_REASON_STEP_LIMIT:
            # The observation tokens are the template's rendering of the conversation so far.
            full = await model.render(list(traj.messages), list(traj.tools), add_generation_prompt=True)
            rendered_tail = full.token_ids[-20:]
            assert sequence[-20:] == rendered_tail
    finally:
        await model.close()


async def test_web_rollout_over_the_accessibility_tree(env: EnvServer, inference: str) -> None:
    """The text-only web path with the real model: it is shown a web task's page as an accessibility tree, its
    replies are parsed into browser actions (or format errors) and the rollout ends inside its budget, with the
    same token bookkeeping as a SWE rollout."""
    [web_task] = load_tasks(ids=["nav-kubernetes"])
    model = InferenceModel(inference, sampling=SamplingConfig(temperature=0.7, max_step_tokens=48, seed=7))
    await model.connect()
    try:
        async with SiteServer() as site, AsyncSandboxClient(f"127.0.0.1:{env.server.port}") as client:
            loop = AgentLoop(model, Limits(max_steps=2, wall_clock_s=240), model.sampling)
            traj = await loop.run(WebHarness(web_task, client, site.url))
            assert [s async for s in client.list_sandboxes()] == []  # the browser sandbox is gone
        assert traj.stop_reason in (
            tpb.STOP_REASON_STEP_LIMIT,
            tpb.STOP_REASON_SUBMITTED,
            tpb.STOP_REASON_FORMAT_ERROR,
        ), traj.stop_detail
        assert traj.harness == "orchard-web" and traj.steps
        opening = traj.messages[1].content
        assert opening.startswith(f"Goal: {web_task.goal}") and 'link "Guides"' in opening
        rendered = await model.render(list(traj.messages[:2]), list(traj.tools), add_generation_prompt=True)
        assert list(traj.prompt_tokens.token_ids) == rendered.token_ids
        assert traj.token_count == len(traj.prompt_tokens.token_ids) + sum(len(s.tokens.token_ids) for s in traj.steps)
    finally:
        await model.close()


@needs_image("claw")
async def test_assistant_rollout_with_the_real_model(env: EnvServer, inference: str) -> None:
    """The Claw path with the real model: the environment's tools reach it through the chat template's tool
    rendering, its replies are parsed into tool calls (or format errors), and the rollout ends inside its budget
    with its sandbox gone."""
    [claw_task] = load_assistant_tasks(ids=["reply-question-000"])
    model = InferenceModel(inference, sampling=SamplingConfig(temperature=0.7, max_step_tokens=48, seed=7))
    await model.connect()
    try:
        async with AsyncSandboxClient(f"127.0.0.1:{env.server.port}") as client:
            loop = AgentLoop(model, Limits(max_steps=2, wall_clock_s=240), model.sampling)
            traj = await loop.run(AssistantHarness(claw_task, client))
            assert [s async for s in client.list_sandboxes()] == []
        assert traj.stop_reason in (
            tpb.STOP_REASON_STEP_LIMIT,
            tpb.STOP_REASON_SUBMITTED,
            tpb.STOP_REASON_FORMAT_ERROR,
        ), traj.stop_detail
        assert traj.harness == "orchard-assistant" and traj.steps
        assert {t.name for t in traj.tools} >= {"send_mail", "search_mail", "find_events", "write_file", "finish"}
        rendered = await model.render(list(traj.messages[:2]), list(traj.tools), add_generation_prompt=True)
        assert list(traj.prompt_tokens.token_ids) == rendered.token_ids and "send_mail" in rendered.text
    finally:
        await model.close()
