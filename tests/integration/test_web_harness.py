"""The web harness on real parts: a real env service with browser sandboxes (real Chromium through Playwright),
the bundled sites served by a real SiteServer, and each rollout judged by its task's check on the page the agent
left. The policies are scripted (the embedded 135M model cannot do these tasks; test_harness_model.py runs it
once over the accessibility tree): one follows each task's bundled solution, one decides from the accessibility
tree it is shown, one makes mistakes."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import AsyncIterator

import pytest
from env_helpers import EnvServer

from orchard.harness import AgentLoop, Limits, ListSink, SamplingConfig, ScriptedModel, run_rollouts
from orchard.harness.web import WebHarness, WebScriptModel
from orchard.sdk import AsyncSandboxClient
from orchard.tasks.web import SiteServer, WebTask, load_tasks
from orchard.types.v1 import types_pb2 as tpb

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
TASKS = load_tasks() + load_tasks("miniwob")  # the bundled sites, and MiniWoB++ pages served locally
PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
async def site() -> AsyncIterator[str]:
    async with SiteServer() as server:
        yield server.url


def tool_call(name: str, **arguments: object) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


def task(task_id: str) -> WebTask:
    return next(t for t in TASKS if t.task_id == task_id)


async def test_the_scripted_policy_completes_every_bundled_and_miniwob_task(env: EnvServer, site: str) -> None:
    sink = ListSink()
    async with AsyncSandboxClient(f"127.0.0.1:{env.server.port}") as client:
        loop = AgentLoop(
            WebScriptModel(TASKS, site),
            Limits(max_steps=40, max_tokens=200_000),
            SamplingConfig(max_step_tokens=4096),
            sink=sink,
            run_id="web-it",
        )
        results = await run_rollouts(
            TASKS,
            1,
            loop=loop,
            client=client,
            concurrency=4,
            make_harness=lambda t: WebHarness(t, client, site),
        )
        left = [s async for s in client.list_sandboxes()]
    failed = {
        r.trajectory.task_id: (r.trajectory.stop_detail, r.grade and r.grade.log_tail)
        for r in results
        if r.grade is None or not r.grade.resolved
    }
    assert not failed, failed
    assert not left  # every browser sandbox was deleted
    for result in results:
        traj = result.trajectory
        assert traj.harness == "orchard-web" and traj.task_set == "web"
        assert traj.stop_reason == tpb.STOP_REASON_SUBMITTED
        assert traj.steps[-1].action_status == tpb.ACTION_STATUS_SUBMITTED  # done
        reward = traj.rewards[-1]
        assert (reward.name, reward.value, reward.outcome.status) == ("task_check", 1.0, tpb.OUTCOME_STATUS_RESOLVED)
        # Every observation is the page as text: its URL on the site, its title and its accessibility tree.
        for step in traj.steps[:-1]:
            shown = step.observations[0].message.content
            assert shown.startswith(f"URL: {site}/") and "\nTitle: " in shown and "- " in shown, shown[:300]
    # The rollouts went out as events like any others: started, each step, finished, then the reward.
    kinds = Counter(event.WhichOneof("event") for event in sink.events)
    assert kinds["rollout_started"] == kinds["rollout_finished"] == kinds["reward_added"] == len(TASKS), kinds
    assert kinds["rollout_step"] == sum(len(r.trajectory.steps) for r in results)


def tree_reader(path: list[str]):  # type: ignore[no-untyped-def]
    """A text policy: it follows the links named in `path` in order, each only once it sees the link in the
    accessibility tree of the page it was shown; it gives up (done) when a link is not there."""

    def policy(prompt: str, step: int) -> str:
        page = prompt.rsplit("<|im_start|>", 2)[-2]
        if step == len(path):
            return "I am there.\n" + tool_call("done")
        if f'link "{path[step]}"' not in page:
            return f"I see no link {path[step]!r}.\n" + tool_call("done", answer="not found")
        return f"Following {path[step]}.\n" + tool_call("click", selector=f'role=link[name="{path[step]}"] >> nth=0')

    return policy


async def test_a_text_policy_finds_its_way_by_the_accessibility_tree(env: EnvServer, site: str) -> None:
    target = task("nav-kubernetes")
    path = ["Guides", "Deployment", "Kubernetes"]
    async with AsyncSandboxClient(f"127.0.0.1:{env.server.port}") as client:
        for links, succeeds in ((path, True), (path[:1] + ["No such page"], False)):
            loop = AgentLoop(
                ScriptedModel(tree_reader(links), name="tree-reader"),
                Limits(max_steps=8),
                SamplingConfig(max_step_tokens=512),
            )
            [result] = await run_rollouts(
                [target],
                1,
                loop=loop,
                client=client,
                make_harness=lambda t: WebHarness(t, client, site),
            )
            assert result.grade is not None and result.grade.resolved is succeeds, result.grade
            assert result.trajectory.final_answer == ("" if succeeds else "not found")
            if not succeeds:
                assert "/docs/guides/deploy-kubernetes.html" in result.grade.log_tail


async def test_screenshots_reach_the_model_as_png_images(env: EnvServer, site: str) -> None:
    target = task("nav-kubernetes")
    async with AsyncSandboxClient(f"127.0.0.1:{env.server.port}") as client:
        loop = AgentLoop(
            WebScriptModel([target], site),
            Limits(max_steps=20, max_tokens=200_000),
            SamplingConfig(max_step_tokens=4096),
        )
        [result] = await run_rollouts(
            [target],
            1,
            loop=loop,
            client=client,
            make_harness=lambda t: WebHarness(t, client, site, observe="both"),
        )
    traj = result.trajectory
    assert result.grade is not None and result.grade.resolved, result.grade
    images = [part.image for m in traj.messages for part in m.parts if part.HasField("image")]
    assert len(images) == len(traj.steps)  # the opening page, then one after every action but done
    assert all(
        i.data.startswith(PNG) and i.mime_type == "image/png" and (i.width, i.height) == (1024, 768) for i in images
    )
    opening = traj.messages[1]
    assert opening.parts[0].text.startswith(f"Goal: {target.goal}") and "URL: " in opening.parts[0].text


async def test_bad_actions_come_back_as_observations(env: EnvServer, site: str) -> None:
    """A missing element, an unknown argument and a blocked site are the agent's mistakes: each is shown to it and
    the rollout goes on; done on the wrong page fails the check with the reason."""
    target = task("shop-blue-mug")
    replies = [
        tool_call("click", selector="#no-such-button"),
        tool_call("click", selector="#x", colour="red"),
        tool_call("navigate", url="http://example.com/"),
        tool_call("done", answer="gave up"),
    ]
    async with AsyncSandboxClient(f"127.0.0.1:{env.server.port}") as client:
        loop = AgentLoop(
            ScriptedModel(lambda prompt, step: replies[step]),
            Limits(max_steps=6, max_tokens=100_000),
            SamplingConfig(max_step_tokens=512),
        )
        [result] = await run_rollouts(
            [target],
            1,
            loop=loop,
            client=client,
            make_harness=lambda t: WebHarness(t, client, site, action_timeout_s=1),
        )
    traj = result.trajectory
    assert traj.stop_reason == tpb.STOP_REASON_SUBMITTED, traj.stop_detail
    missing, unknown, blocked = (s.observations[0].message.content for s in traj.steps[:3])
    assert traj.steps[0].action_status == tpb.ACTION_STATUS_TIMED_OUT and "#no-such-button" in missing
    assert missing.startswith("Error: ") and f"URL: {site}/shop/" in missing  # the page is shown again
    assert traj.steps[1].action_status == tpb.ACTION_STATUS_PARSE_ERROR and "unknown: ['colour']" in unknown
    assert traj.steps[2].action_status != tpb.ACTION_STATUS_OK and "example.com" in blocked
    assert result.grade is not None and not result.grade.resolved
    assert "Order confirmed" in result.grade.log_tail and traj.final_answer == "gave up"
