"""The agent loop: sample a reply from exact token ids, parse its action, carry it out, append the observation,
until the agent submits or a step, token or wall-clock budget runs out. It records what RL needs: every token
id, the sampled tokens' log-probs, and a mask (1 = model token, 0 = prompt, tool or observation token), as a
`types.v1.Trajectory`.

Observation tokens come from the chat template itself: the conversation is rendered without and with the new
observation and the difference is appended, so the sequence is exactly what the template would give (with
the model's own sampled tokens in place of a re-tokenization of its text).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from dataclasses import dataclass

from orchard import events
from orchard.chat.tools import TOOL_BLOCK
from orchard.errors import OrchardError
from orchard.harness.base import ActionResult, Harness
from orchard.harness.events import EventSink, NullSink
from orchard.harness.model import Model, ModelError, SamplingConfig, step_seed
from orchard.prototime import duration as _seconds
from orchard.types.v1 import types_pb2 as tpb

log = logging.getLogger("orchard.harness")

PROBE = "orchard-probe-7d1e"
"""Assistant text used once per rollout to find how the template closes an assistant turn."""
CLOSE_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class Limits:
    """A rollout's budgets."""

    max_steps: int = 30
    """Model calls before the rollout stops with STEP_LIMIT."""
    max_tokens: int = 8192
    """Tokens in the whole sequence (prompt, replies, observations) before TOKEN_LIMIT."""
    wall_clock_s: float = 1800.0
    """Seconds from start (sandbox setup included) before TIME_LIMIT."""
    max_format_errors: int = 3
    """Consecutive unparsable replies before FORMAT_ERROR."""


class AgentLoop:
    """Runs rollouts of one model; one instance serves many concurrent `run` calls."""

    def __init__(
        self,
        model: Model,
        limits: Limits | None = None,
        sampling: SamplingConfig | None = None,
        sink: EventSink | None = None,
        run_id: str = "",
    ) -> None:
        self.model = model
        self.limits = limits or Limits()
        self.sampling = sampling or SamplingConfig()
        self.sink: EventSink = sink or NullSink()
        self.run_id = run_id or uuid.uuid4().hex[:12]

    async def run(
        self,
        harness: Harness,
        *,
        sample_index: int = 0,
        group_id: str = "",
        trajectory_id: str = "",
        metadata: dict[str, str] | None = None,
    ) -> tpb.Trajectory:
        """One rollout of `harness`; always returns the trajectory (with its stop reason), and closes the harness.

        Cancelling it closes the harness and re-raises.
        """
        tid = trajectory_id or uuid.uuid4().hex
        traj = tpb.Trajectory(
            name=f"runs/{self.run_id}/trajectories/{tid}",
            trajectory_id=tid,
            run_id=self.run_id,
            task_id=harness.task_id,
            task_set=harness.task_set,
            harness=harness.name,
            policy=tpb.Policy(model=self.model.name),
            group_id=group_id,
            sample_index=sample_index,
            tools=harness.tools,
            metadata=metadata or {},
        )
        traj.start_time.GetCurrentTime()
        start = time.monotonic()
        timer = asyncio.timeout(self.limits.wall_clock_s)
        try:
            async with timer:
                reason, detail = await self._drive(harness, traj)
        except (TimeoutError, OrchardError) as err:
            if timer.expired():
                reason, detail = (
                    tpb.STOP_REASON_TIME_LIMIT,
                    f"the wall-clock budget of {self.limits.wall_clock_s:g}s ran out",
                )
            elif isinstance(err, ModelError):
                reason, detail = tpb.STOP_REASON_MODEL_ERROR, str(err)
            else:
                reason, detail = tpb.STOP_REASON_ENV_ERROR, f"{type(err).__name__}: {err}"
        finally:
            try:
                await asyncio.shield(harness.close())
            except Exception as err:  # noqa: BLE001 - the rollout's own outcome matters more
                log.warning("could not close harness of trajectory %s: %s", tid, err)
        traj.stop_reason, traj.stop_detail = reason, detail
        traj.step_count = len(traj.steps)
        traj.token_count = len(traj.prompt_tokens.token_ids) + sum(len(s.tokens.token_ids) for s in traj.steps)
        traj.end_time.GetCurrentTime()
        traj.duration.CopyFrom(_seconds(time.monotonic() - start))
        await self.emit(events.finished(traj))
        return traj

    async def emit(self, event: object) -> None:
        """Publish a rollout event to the loop's sink; a failure is logged, never raised (a lost event must not
        end the rollout)."""
        try:
            await self.sink.publish(event)  # type: ignore[arg-type]
        except Exception as err:  # noqa: BLE001 - a lost event must not end the rollout
            log.warning("could not publish rollout event %s: %s", getattr(event, "event_id", "?"), err)

    async def _turn_close(self, system: list[tpb.Message], tools: list[tpb.ToolDefinition]) -> list[int]:
        """The tokens the template puts after an assistant turn's text (e.g. "<|im_end|>\\n")."""
        user = [*system, tpb.Message(role=tpb.ROLE_USER, content="x")]
        opened = await self.model.render(user, tools, add_generation_prompt=True)
        closed = await self.model.render(
            [*user, tpb.Message(role=tpb.ROLE_ASSISTANT, content=PROBE)], tools, add_generation_prompt=False
        )
        if not closed.text.startswith(opened.text + PROBE):
            raise ModelError(
                f"model {self.model.name}'s chat template does not render an assistant turn after its "
                f"generation prompt; the harness cannot track tokens with it"
            )
        return await self.model.tokenize(closed.text[len(opened.text) + len(PROBE) :])

    async def _drive(self, harness: Harness, traj: tpb.Trajectory) -> tuple[tpb.StopReason, str]:
        limits, tools = self.limits, list(harness.tools)
        tool_names = {t.name for t in tools}
        await harness.setup()
        messages = harness.initial_messages()
        traj.messages.extend(messages)
        prompt = await self.model.render(messages, tools, add_generation_prompt=True)
        traj.prompt_tokens.token_ids.extend(prompt.token_ids)
        traj.prompt_tokens.mask.extend([0] * len(prompt.token_ids))
        close = await self._turn_close([m for m in messages if m.role == tpb.ROLE_SYSTEM][:1], tools)
        seq = list(prompt.token_ids)
        traj.policy.weights_version = ""
        await self.emit(events.started(traj))
        format_errors = 0
        for index in range(limits.max_steps):
            room = limits.max_tokens - len(seq)
            if room <= 0:
                return tpb.STOP_REASON_TOKEN_LIMIT, f"the sequence reached the token budget of {limits.max_tokens}"
            step = tpb.Step(index=index, prompt_token_count=len(seq))
            step.start_time.GetCurrentTime()
            began = time.monotonic()
            base = self.sampling.seed
            seed = None if base is None else step_seed(base, traj.task_id, traj.sample_index, index)
            # The images of the conversation so far, in message order: seq holds their placeholders.
            images = [p.image for m in traj.messages for p in m.parts if p.HasField("image")]
            sample = await self.model.generate(
                seq,
                min(self.sampling.max_step_tokens, room),
                seed,
                {"trajectory_id": traj.trajectory_id, "step": str(index)},
                images,
            )
            step.model_duration.CopyFrom(_seconds(time.monotonic() - began))
            step.completion_token_count = len(sample.token_ids)
            step.weights_version = sample.weights_version
            if not traj.policy.weights_version:
                traj.policy.weights_version = sample.weights_version
            seq += sample.token_ids
            parsed = harness.parse(sample.text)
            text_form = TOOL_BLOCK.search(sample.text) is None
            if text_form or not parsed.calls:
                assistant = tpb.Message(role=tpb.ROLE_ASSISTANT, content=sample.text)
            else:  # the OpenAI form: tool-call blocks become tool_calls
                assistant = tpb.Message(
                    role=tpb.ROLE_ASSISTANT, content=TOOL_BLOCK.sub("", sample.text).strip(), tool_calls=parsed.calls
                )
            step.model_output.CopyFrom(assistant)
            step.actions.extend(parsed.calls)

            # Act: carry out each call in order, until one is the submission.
            env_began = time.monotonic()
            observations: list[tpb.Message] = []
            submitted = False
            if parsed.error:
                format_errors += 1
                step.action_status, step.action_error = tpb.ACTION_STATUS_PARSE_ERROR, parsed.error
                observations.append(tpb.Message(role=tpb.ROLE_USER, content=harness.format_error(parsed.error)))
            else:
                format_errors = 0
                step.action_status = tpb.ACTION_STATUS_OK
                for action in parsed.calls:
                    acted = time.monotonic()
                    if action.name not in tool_names:
                        result = ActionResult(
                            f"Unknown tool {action.name!r}; the tools are {sorted(tool_names)}.",
                            status=tpb.ACTION_STATUS_UNKNOWN_TOOL,
                        )
                    else:
                        result = await harness.execute(action)
                    if result.status != tpb.ACTION_STATUS_OK and step.action_status == tpb.ACTION_STATUS_OK:
                        step.action_status = result.status
                        step.action_error = result.output[:500] if not result.submitted else ""
                    if result.submitted:
                        submitted = True
                        break
                    message = (
                        tpb.Message(role=tpb.ROLE_USER, content=result.output)
                        if text_form
                        else tpb.Message(
                            role=tpb.ROLE_TOOL, content=result.output, tool_call_id=action.id, name=action.name
                        )
                    )
                    if result.images:
                        message.parts.add(text=result.output)
                        message.parts.extend(tpb.ContentPart(image=i) for i in result.images)
                        message.content = ""
                    observations.append(message)
                    obs = tpb.Observation(
                        tool_call_id="" if text_form else action.id,
                        message=message,
                        truncated=result.truncated,
                        duration=_seconds(time.monotonic() - acted),
                    )
                    if result.exit_code is not None:
                        obs.exit_code = result.exit_code
                    step.observations.append(obs)

            # Record tokens: the sample (mask 1), then the turn close and observation as the template renders them.
            context: list[int] = []
            if observations:
                history = [*traj.messages, assistant]
                before = await self.model.render(history, tools, add_generation_prompt=False)
                after = await self.model.render([*history, *observations], tools, add_generation_prompt=True)
                if after.token_ids[: len(before.token_ids)] != before.token_ids:
                    raise ModelError(
                        f"model {self.model.name}'s chat template re-renders earlier turns when an "
                        f"observation is added; the harness cannot track tokens with it"
                    )
                ended = bool(sample.token_ids) and bool(close) and sample.token_ids[-1] == close[0]
                context = (close[1:] if ended else close) + after.token_ids[len(before.token_ids) :]
            seq += context
            step.tokens.token_ids.extend([*sample.token_ids, *context])
            logprobs = (
                sample.logprobs if len(sample.logprobs) == len(sample.token_ids) else [0.0] * len(sample.token_ids)
            )
            step.tokens.logprobs.extend([*logprobs, *[0.0] * len(context)])
            step.tokens.mask.extend([1] * len(sample.token_ids) + [0] * len(context))
            step.env_duration.CopyFrom(_seconds(time.monotonic() - env_began))
            step.end_time.GetCurrentTime()
            traj.messages.append(assistant)
            traj.messages.extend(observations)
            traj.steps.append(step)
            await self.emit(events.step(traj.run_id, traj.trajectory_id, step))

            if submitted:
                traj.final_patch, traj.final_answer = await harness.submission()
                return tpb.STOP_REASON_SUBMITTED, ""
            if format_errors >= limits.max_format_errors:
                return tpb.STOP_REASON_FORMAT_ERROR, f"{format_errors} unparsable replies in a row: {parsed.error}"
        return tpb.STOP_REASON_STEP_LIMIT, f"the step budget of {limits.max_steps} ran out"
