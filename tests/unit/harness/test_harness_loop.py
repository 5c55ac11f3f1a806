"""The agent loop with the scripted model (a deterministic fake shipped for tests) and an in-memory harness
(nothing to run, so no sandbox): token bookkeeping, budgets, format errors, events and the concurrency bound."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

import pytest

from orchard.harness import (
    ActionResult,
    AgentLoop,
    Harness,
    Limits,
    ListSink,
    SamplingConfig,
    ScriptedModel,
    SWEHarness,
    call,
    replay,
    run_rollouts,
    tool,
)
from orchard.harness.model import Sample, step_seed
from orchard.harness.runner import run_one
from orchard.harness.scripted import IM_END, LOGPROB, decode
from orchard.sdk import AsyncSandboxClient
from orchard.tasks import load_instances
from orchard.tasks.grading import GradeResult
from orchard.types.v1 import types_pb2 as tpb

pytestmark = pytest.mark.timeout(30)

ECHO = '<tool_call>{"name": "echo", "arguments": {"text": "hi"}}</tool_call>'
SUBMIT = '<tool_call>{"name": "submit", "arguments": {}}</tool_call>'


class EchoHarness(Harness):
    """An in-memory harness: `echo` returns its text, `submit` ends with the answer "done"."""

    name = "echo"
    task_set = "unit"
    tools = [
        tool("echo", "Echo text.", {"text": {"type": "string"}}, ["text"]),
        tool("submit", "Submit.", {}, []),
    ]

    def __init__(self, task_id: str = "t1", delay_s: float = 0.0) -> None:
        self.task_id = task_id
        self.delay_s = delay_s
        self.closed = False

    async def setup(self) -> None:
        return None

    def initial_messages(self) -> list[tpb.Message]:
        return [tpb.Message(role=tpb.ROLE_SYSTEM, content="Be brief."), tpb.Message(role=tpb.ROLE_USER, content="Go.")]

    async def execute(self, action: tpb.ToolCall) -> ActionResult:
        if action.name == "submit":
            return ActionResult("", status=tpb.ACTION_STATUS_SUBMITTED, submitted=True)
        await asyncio.sleep(self.delay_s)
        return ActionResult(f"echo: {json.loads(action.arguments)['text']}", exit_code=0)

    async def submission(self) -> tuple[str, str]:
        return "", "done"

    async def close(self) -> None:
        self.closed = True


def sequence(trajectory: tpb.Trajectory) -> list[int]:
    return [*trajectory.prompt_tokens.token_ids, *(t for s in trajectory.steps for t in s.tokens.token_ids)]


async def test_submitting_rollout_records_tokens_logprobs_and_mask() -> None:
    model = ScriptedModel(replay([ECHO, "no action here", SUBMIT]))
    sink = ListSink()
    harness = EchoHarness()
    traj = await AgentLoop(model, sink=sink, run_id="r").run(harness, sample_index=2, group_id="g")
    assert traj.stop_reason == tpb.STOP_REASON_SUBMITTED and traj.final_answer == "done" and harness.closed
    assert [s.action_status for s in traj.steps] == [
        tpb.ACTION_STATUS_OK,
        tpb.ACTION_STATUS_PARSE_ERROR,
        tpb.ACTION_STATUS_SUBMITTED,
    ]
    # The prompt is exactly the rendered opening conversation; every step's arrays are parallel.
    opening = await model.render(harness.initial_messages(), harness.tools, add_generation_prompt=True)
    assert list(traj.prompt_tokens.token_ids) == opening.token_ids and set(traj.prompt_tokens.mask) == {0}
    for step in traj.steps:
        n = len(step.tokens.token_ids)
        assert len(step.tokens.logprobs) == len(step.tokens.mask) == n
        model_ids = [t for t, m in zip(step.tokens.token_ids, step.tokens.mask, strict=True) if m == 1]
        assert len(model_ids) == step.completion_token_count and model_ids[-1] == IM_END
        assert all(lp == (LOGPROB if m else 0.0) for lp, m in zip(step.tokens.logprobs, step.tokens.mask, strict=True))
        assert step.tokens.mask[: len(model_ids)] == [1] * len(model_ids)  # the reply comes first, then context
    # The whole sequence is what the template gives for the conversation (observations rendered in place).
    text = decode(sequence(traj))
    assert text.count("<|im_start|>tool\necho: hi<|im_end|>\n<|im_start|>assistant\n") == 1
    assert "<|im_start|>user\nFormat error: no <tool_call> block found" in text
    assert text.endswith(SUBMIT + "<|im_end|>")
    assert traj.token_count == len(sequence(traj)) and traj.step_count == 3
    # The OpenAI-format messages pair each call with its tool message.
    assistant, observation = traj.messages[2], traj.messages[3]
    assert assistant.tool_calls[0].name == "echo" and observation.tool_call_id == assistant.tool_calls[0].id
    assert traj.steps[0].observations[0].exit_code == 0 and traj.sample_index == 2 and traj.group_id == "g"
    assert [e.event_id for e in sink.events] == [
        f"{traj.trajectory_id}.{s}" for s in ("started", "step.0", "step.1", "step.2", "finished")
    ]
    assert sink.events[-1].rollout_finished.trajectory == traj


@pytest.mark.parametrize(
    ("limits", "sampling", "replies", "reason", "steps"),
    [
        (Limits(max_steps=3), SamplingConfig(), [ECHO], tpb.STOP_REASON_STEP_LIMIT, 3),
        (Limits(max_tokens=600), SamplingConfig(), [ECHO], tpb.STOP_REASON_TOKEN_LIMIT, None),
        (Limits(max_format_errors=2), SamplingConfig(), ["hmm"], tpb.STOP_REASON_FORMAT_ERROR, 2),
        # A reply cut by max_step_tokens loses its closing tag and JSON: a format error, with the close appended.
        (Limits(max_steps=1), SamplingConfig(max_step_tokens=10), [ECHO], tpb.STOP_REASON_STEP_LIMIT, 1),
    ],
)
async def test_budgets(
    limits: Limits, sampling: SamplingConfig, replies: list[str], reason: int, steps: int | None
) -> None:
    traj = await AgentLoop(ScriptedModel(replay(replies)), limits, sampling).run(EchoHarness())
    assert traj.stop_reason == reason and len(traj.steps) == (steps or len(traj.steps)), traj.stop_detail
    if reason == tpb.STOP_REASON_TOKEN_LIMIT:  # it stopped once the sequence reached the budget, not before
        assert len(traj.steps) >= 2 and traj.token_count >= limits.max_tokens
        assert traj.token_count - len(traj.steps[-1].tokens.token_ids) < limits.max_tokens


async def test_cut_reply_gets_the_turn_close_as_context() -> None:
    traj = await AgentLoop(ScriptedModel(replay([ECHO])), Limits(max_steps=1), SamplingConfig(max_step_tokens=10)).run(
        EchoHarness()
    )
    step = traj.steps[0]
    assert step.completion_token_count == 10 and IM_END not in step.tokens.token_ids[:10]
    assert step.tokens.token_ids[10] == IM_END and step.tokens.mask[10] == 0


async def test_wall_clock_budget_and_unknown_tool() -> None:
    unknown = '<tool_call>{"name": "rm", "arguments": {}}</tool_call>'
    traj = await AgentLoop(ScriptedModel(replay([unknown, ECHO]), delay_s=0.05), Limits(wall_clock_s=0.5)).run(
        EchoHarness(delay_s=0.2)
    )
    assert traj.stop_reason == tpb.STOP_REASON_TIME_LIMIT and "0.5s" in traj.stop_detail
    assert traj.steps[0].action_status == tpb.ACTION_STATUS_UNKNOWN_TOOL
    assert "Unknown tool 'rm'" in traj.steps[0].observations[0].message.content


async def test_runner_bounds_concurrency() -> None:
    model = ScriptedModel(replay([ECHO, SUBMIT]), delay_s=0.02)
    loop = AgentLoop(model, run_id="run")
    instances = load_instances("toyrepair")[:3]
    results = await run_rollouts(
        instances,
        4,
        loop=loop,
        client=cast(AsyncSandboxClient, None),  # no sandbox: the echo harness needs none and nothing is graded
        grade_patches=False,
        make_harness=lambda i: EchoHarness(i.instance_id),
        concurrency=3,
    )
    assert len(results) == 12 and model.max_in_flight == 3
    assert [(r.trajectory.task_id, r.trajectory.sample_index) for r in results] == [
        (i.instance_id, s) for i in instances for s in range(4)
    ]
    assert all(r.trajectory.stop_reason == tpb.STOP_REASON_SUBMITTED for r in results)


@dataclass(frozen=True)
class NamedTask:
    """A task that is not a repository task: an id and nothing to grade it by."""

    instance_id: str


class JudgingHarness(EchoHarness):
    """Judges its own rollout, as the web and assistant harnesses do."""

    def outcome(self) -> GradeResult | None:
        return GradeResult(self.task_id, patch_exists=False, patch_applied=False, resolved=True)


async def test_runner_takes_any_task_its_harness_judges_and_refuses_to_guess_a_grade() -> None:
    """Tasks of any kind run; one whose harness judges it is graded by it, and a submitted non-repository task whose
    harness judges nothing is an error naming the task (never graded as a repository task)."""
    loop = AgentLoop(ScriptedModel(replay([SUBMIT])), run_id="run")
    no_client = cast(AsyncSandboxClient, None)  # nothing reaches a sandbox: the harness judges, or the runner refuses
    [judged] = await run_rollouts(
        [NamedTask("web-1")], 1, loop=loop, client=no_client, make_harness=lambda t: JudgingHarness(t.instance_id)
    )
    assert judged.grade is not None and judged.grade.resolved
    assert judged.trajectory.rewards[-1].name == "task_check"
    with pytest.raises(TypeError, match="task 'web-2' is not a repository task"):
        await run_one(loop, no_client, lambda t: EchoHarness(t.instance_id), NamedTask("web-2"), 0)


@pytest.mark.parametrize(
    ("text", "name", "arguments"),
    [
        ('<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call>', "bash", {"command": "ls"}),
        (
            '<tool_call>{"name": "editor", "arguments": {"command": "view", "path": "a.py"}}',
            "editor",
            {"command": "view", "path": "a.py"},
        ),  # closing tag cut off
        ("Let me look.\n```bash\ngrep -rn foo .\n```", "bash", {"command": "grep -rn foo ."}),
        ("```bash\nsubmit\n```", "submit", {}),
    ],
)
def test_swe_parse(text: str, name: str, arguments: dict[str, str]) -> None:
    harness = SWEHarness(load_instances("toyrepair")[0], client=None)  # type: ignore[arg-type]
    parsed = harness.parse(text)
    assert not parsed.error and [(c.name, json.loads(c.arguments)) for c in parsed.calls] == [(name, arguments)]


@pytest.mark.parametrize("text", ["just words", "<tool_call>not json</tool_call>", "```python\nprint(1)\n```x"])
def test_swe_parse_errors(text: str) -> None:
    harness = SWEHarness(load_instances("toyrepair")[0], client=None)  # type: ignore[arg-type]
    assert harness.parse(text).error and not harness.parse(text).calls


def test_call_and_tool_helpers() -> None:
    made = call("bash", command="ls")
    assert made.id.startswith("call_") and json.loads(made.arguments) == {"command": "ls"}
    assert json.loads(tool("x", "d", {}, []).parameters) == {"type": "object", "properties": {}, "required": []}


class PictureHarness(EchoHarness):
    """EchoHarness as a GUI harness shapes it: the task shows a picture, and each echo answers with one."""

    def __init__(self) -> None:
        super().__init__()
        self.echoes = 0

    def initial_messages(self) -> list[tpb.Message]:
        system, user = super().initial_messages()
        user.parts.add(text=user.content)
        user.parts.add(image=tpb.Image(data=b"task", mime_type="image/png"))
        user.content = ""
        return [system, user]

    async def execute(self, action: tpb.ToolCall) -> ActionResult:
        result = await super().execute(action)
        if result.submitted:
            return result
        self.echoes += 1
        return ActionResult(
            result.output, exit_code=0, images=[tpb.Image(data=f"echo{self.echoes}".encode(), mime_type="image/png")]
        )


class RecordingModel(ScriptedModel):
    """The scripted fake, also recording the images each generate call gets (a scripted policy cannot see them)."""

    def __init__(self, replies: list[str]) -> None:
        super().__init__(replay(replies))
        self.images: list[list[bytes]] = []
        self.seeds: list[int | None] = []

    async def generate(
        self,
        token_ids: list[int],
        max_tokens: int,
        seed: int | None,
        labels: dict[str, str],
        images: Sequence[tpb.Image] = (),
    ) -> Sample:
        self.images.append([image.data for image in images])
        self.seeds.append(seed)
        return await super().generate(token_ids, max_tokens, seed, labels, images)


@pytest.mark.parametrize(
    ("harness", "expected"),
    [
        (PictureHarness, [[b"task"], [b"task", b"echo1"], [b"task", b"echo1", b"echo2"]]),
        (EchoHarness, [[], [], []]),
    ],
)
async def test_loop_passes_the_conversations_images(harness: type[EchoHarness], expected: list[list[bytes]]) -> None:
    """Every generate call gets all images of the conversation so far, in message order; tokens are kept as ever."""
    model = RecordingModel([ECHO, ECHO, SUBMIT])
    traj = await AgentLoop(model).run(harness())
    assert traj.stop_reason == tpb.STOP_REASON_SUBMITTED and model.images == expected
    assert decode(sequence(traj)).count("<|im_start|>tool\necho: hi<|im_end|>\n<|im_start|>assistant\n") == 2
    assert traj.token_count == len(sequence(traj))


async def test_seeded_rollouts_draw_their_own_streams_per_task_sample_and_step() -> None:
    """Step s of sample i of a task gets step_seed(base, task, i, s): the same sample of two tasks no longer shares
    one random stream (a seed's luck was every task's at once), and seed - s still names the sample."""
    seeds: dict[tuple[str, int], list[int | None]] = {}
    for task in ("t1", "t2"):
        for sample in (0, 1):
            model = RecordingModel([ECHO, SUBMIT])
            await AgentLoop(model, sampling=SamplingConfig(seed=5)).run(EchoHarness(task), sample_index=sample)
            seeds[task, sample] = model.seeds
            assert model.seeds == [step_seed(5, task, sample, 0), step_seed(5, task, sample, 1)]
            assert model.seeds[1] - 1 == model.seeds[0]  # type: ignore[operator]
    drawn = [s for pair in seeds.values() for s in pair]
    assert len(set(drawn)) == len(drawn) == 8
    assert all(0 <= s < 2**63 for s in drawn if s is not None)  # an int64 on the wire
    assert step_seed(5, "t1", 0, 0) - step_seed(0, "t1", 0, 0) == 5  # the base still shifts every stream
    model = RecordingModel([SUBMIT])
    await AgentLoop(model).run(EchoHarness())
    assert model.seeds == [None]  # unseeded: the engine draws
