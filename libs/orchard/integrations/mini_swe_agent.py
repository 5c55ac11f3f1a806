"""mini-swe-agent (PyPI `mini-swe-agent` 2.4) on Orchard: `OrchardEnvironment` runs its commands in an Orchard Env
sandbox, and `run_mini_swe_agent` drives its DefaultAgent with a model behind an OpenAI-compatible endpoint.

mini-swe-agent builds environments by dotted path, so its own CLI works unmodified too:

    mini --environment-class orchard.integrations.mini_swe_agent.OrchardEnvironment \\
         -c mini.yaml -c environment.image=python:3.11-slim -c model.model_name=openai/SmolLM2-135M-Instruct ...
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Self

from minisweagent.exceptions import Submitted
from minisweagent.utils.serialize import recursive_merge
from pydantic import BaseModel, ConfigDict

from orchard.errors import OrchardError
from orchard.sdk import Sandbox, SandboxClient

log = logging.getLogger(__name__)

ENVIRONMENT_CLASS = f"{__name__}.OrchardEnvironment"
"""The dotted path mini-swe-agent's `environment.environment_class` takes."""
SUBMIT_MARKER = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
"""A command whose output starts with this line (and exits 0) submits the rest of its output."""
UNAME_FIELDS = ("system", "node", "release", "version", "machine")


class OrchardEnvironmentConfig(BaseModel):
    """The `environment` section of a mini-swe-agent config.

    Unknown keys are ignored, not refused: stock mini configs carry keys for its own environments
    (interpreter, run_args, forward_env, ...), and they must load unchanged.
    """

    model_config = ConfigDict(extra="ignore")

    image: str = "python:3.11-slim"
    """The sandbox's image (`orchard image build <image>`)."""
    cwd: str = ""
    """Where commands run unless execute() names a directory; empty: the sandbox's workdir (/workspace)."""
    timeout: int = 30
    """Seconds a command may run before its whole process tree is killed."""
    env: dict[str, str] = {}
    """Variables every command gets on top of the sandbox's clean environment (passed as given, BASH_ENV too)."""
    address: str | None = None
    """The env service, "host:port"; None: ORCHARD_ENV_ADDRESS, else 127.0.0.1:50051."""


class OrchardEnvironment:
    """mini-swe-agent's environment contract over one Orchard Env sandbox, created here and deleted by close().

    Every command runs in a fresh non-interactive, non-login `bash -c` (nothing persists between commands but
    files), with stdout and stderr merged in the order written.
    """

    def __init__(
        self,
        *,
        config_class: type[OrchardEnvironmentConfig] = OrchardEnvironmentConfig,
        sandbox_id: str | None = None,
        **kwargs: Any,
    ) -> None:
        """kwargs: the `environment` section of a mini config; sandbox_id: run in that sandbox (one a task was set
        up in) instead of creating one from the image. Either way, close() deletes it."""
        self.config = config_class(**kwargs)
        # environment_class is mini's own key (which class to build); the rest are other environments' keys.
        if ignored := sorted(set(kwargs) - set(config_class.model_fields) - {"environment_class"}):
            log.info("ignoring mini-swe-agent environment keys Orchard Env does not use: %s", ", ".join(ignored))
        self._client = SandboxClient(self.config.address)
        self._closed = False
        try:
            self.sandbox: Sandbox = (
                self._client.get_sandbox(sandbox_id) if sandbox_id else self._client.create_sandbox(self.config.image)
            )
            self._uname = self._system_info()
        except BaseException:
            self._client.close()
            raise

    def _system_info(self) -> dict[str, str]:
        """The sandbox's `uname` fields, named as platform.uname() names them (mini's prompts show them)."""
        job = self.sandbox.exec("uname -s; uname -n; uname -r; uname -v; uname -m", timeout=30)
        return dict(zip(UNAME_FIELDS, job.stdout.splitlines(), strict=True))

    def execute(self, action: dict, cwd: str = "", *, timeout: int | None = None) -> dict[str, Any]:
        """Run action["command"] with bash; raises Submitted when its output starts with SUBMIT_MARKER."""
        timeout = timeout or self.config.timeout
        # `exec 2>&1` first: the shell's stderr and everything it starts share stdout, in the order written.
        command = "exec 2>&1\n" + action.get("command", "")
        try:
            job = self.sandbox.exec(command, timeout=timeout, cwd=cwd or self.config.cwd or None, env=self.config.env)
        except OrchardError as err:
            output = _failed("", f"An error occurred while executing the command: {err}", err)
        else:
            if job.timed_out:
                message = f"The command timed out after {timeout} seconds and was killed (with all it started)."
                output = _failed(job.stdout, message, TimeoutError(message))
            elif job.exit_code is None:  # cancelled, or it never started
                message = f"The command did not run to its end: {job.error or job.status}"
                output = _failed(job.stdout + job.stderr, message, RuntimeError(message))
            else:
                output = {"output": job.stdout, "returncode": job.exit_code, "exception_info": ""}
        self._check_finished(output)
        return output

    def _check_finished(self, output: dict[str, Any]) -> None:
        """Raise Submitted (carrying the rest of the output) when the first line is the marker; as mini's own."""
        lines = output.get("output", "").lstrip().splitlines(keepends=True)
        if lines and lines[0].strip() == SUBMIT_MARKER and output["returncode"] == 0:
            submission = "".join(lines[1:])
            raise Submitted(
                {"role": "exit", "content": submission, "extra": {"exit_status": "Submitted", "submission": submission}}
            )

    def get_template_vars(self, **kwargs: Any) -> dict[str, Any]:
        """What mini's prompt templates may use: the config and the sandbox's system, release, machine, ..."""
        return recursive_merge(self.config.model_dump(), self._uname, kwargs)

    def serialize(self) -> dict[str, Any]:
        """This environment as mini-swe-agent's trajectory files record it."""
        return {
            "info": {
                "config": {"environment": self.config.model_dump(mode="json"), "environment_type": ENVIRONMENT_CLASS},
                "orchard_sandbox_id": self.sandbox.sandbox_id,
            }
        }

    def close(self) -> None:
        """Delete the sandbox and close the connection; closing twice is fine."""
        if self._closed:
            return
        self._closed = True
        try:
            self.sandbox.delete()
        finally:
            self._client.close()

    cleanup = close
    """mini's name for it (its own environments' cleanup())."""

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"OrchardEnvironment(sandbox_id={self.sandbox.sandbox_id!r}, image={self.config.image!r})"


def _failed(output: str, message: str, err: BaseException) -> dict[str, Any]:
    """The result of a command that could not end normally, shaped as mini's local environment shapes it."""
    return {
        "output": output,
        "returncode": -1,
        "exception_info": message,
        "extra": {"exception_type": type(err).__name__, "exception": str(err)},
    }


@dataclass(frozen=True)
class MiniRun:
    """How a mini-swe-agent run ended."""

    exit_status: str
    """"Submitted", "LimitsExceeded", "RepeatedFormatError", ... (mini's names)."""
    submission: str
    """What the agent submitted (with the SWE-bench prompts: a git diff); empty unless it submitted."""
    api_calls: int
    """Model calls made."""
    messages: list[dict[str, Any]]
    """The conversation as mini records it (each message's "extra" holds raw responses and outputs)."""


def mini_config(
    model: str,
    api_base: str,
    *,
    api_key: str = "orchard",
    textbased: bool = False,
    image: str = "python:3.11-slim",
    cwd: str = "/testbed",
    address: str | None = None,
    step_limit: int = 30,
) -> dict[str, Any]:
    """A whole mini-swe-agent config: its stock SWE-bench prompts, `model` behind `api_base`, and OrchardEnvironment.

    Args:
        model: The model id the endpoint serves (sent as "openai/<model>", i.e. through litellm's OpenAI client).
        api_base: The endpoint's /v1 URL, e.g. "http://127.0.0.1:8000/v1" for the inference service's --http-port.
        textbased: Actions in ```mswea_bash_command blocks (mini's `litellm_textbased`, its swebench_backticks
            prompts) instead of tool calls, for models that do not emit tool calls reliably.
        cwd: Where the repository is in the sandbox; mini's SWE-bench prompts name /testbed.
    """
    from minisweagent.config import get_config_from_spec

    stock = get_config_from_spec("swebench_backticks.yaml" if textbased else "swebench.yaml")
    # BASH_ENV is left out: it points at the image's .bashrc for SWE-bench's conda images, and where that file
    # runs `pyenv init` every python command hangs. Orchard sandboxes start commands with a clean environment.
    env = {k: v for k, v in stock["environment"]["env"].items() if k != "BASH_ENV"}
    return {
        "agent": {**stock["agent"], "step_limit": step_limit},
        "model": {
            **stock["model"],
            "model_name": f"openai/{model}",
            "model_class": "litellm_textbased" if textbased else "litellm",
            "model_kwargs": {**stock["model"].get("model_kwargs", {}), "api_base": api_base, "api_key": api_key},
            "cost_tracking": "ignore_errors",  # litellm knows no price for a local model
        },
        "environment": {
            "environment_class": ENVIRONMENT_CLASS,
            "image": image,
            "cwd": cwd,
            "timeout": stock["environment"]["timeout"],
            "env": env,
            "address": address,
        },
    }


def run_mini_swe_agent(task: str, config: dict[str, Any], env: OrchardEnvironment | None = None) -> MiniRun:
    """Run mini-swe-agent's DefaultAgent on `task` with `config` (see mini_config) and return how it ended.

    env: an environment already prepared (the repository put in place); None: one is built from
    config["environment"] and its sandbox deleted after the run.
    """
    # Imported litellm fetches its price list from GitHub unless told not to (offline: seconds of retries);
    # prices are not used here (cost_tracking is ignore_errors).
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    from minisweagent.agents.default import DefaultAgent
    from minisweagent.models import get_model

    model = get_model(config=config["model"])
    owned = env is None
    if env is None:
        env = OrchardEnvironment(**config["environment"])
    try:
        agent = DefaultAgent(model, env, **config["agent"])
        info = agent.run(task)
    finally:
        if owned:
            env.close()
    return MiniRun(
        exit_status=info.get("exit_status", ""),
        submission=info.get("submission", ""),
        api_calls=agent.n_calls,
        messages=agent.messages,
    )


MINI_HARNESS = "mini-swe-agent"
"""The `harness` of a trajectory mini-swe-agent made."""


def trajectory_of(
    run: MiniRun, *, run_id: str, instance_id: str, task_set: str, sample: int, model: str, seconds: float
) -> Any:
    """mini's conversation as an Orchard Trajectory: each assistant message a step, the next user message (the
    command's output) its observation; the submission is the final patch."""
    from orchard.prototime import duration
    from orchard.types.v1 import types_pb2 as tpb

    trajectory_id = f"{run_id}-{instance_id}-{sample}"
    roles = {"system": tpb.ROLE_SYSTEM, "user": tpb.ROLE_USER, "assistant": tpb.ROLE_ASSISTANT, "tool": tpb.ROLE_TOOL}
    traj = tpb.Trajectory(
        name=f"runs/{run_id}/trajectories/{trajectory_id}",
        trajectory_id=trajectory_id,
        run_id=run_id,
        task_id=instance_id,
        task_set=task_set,
        harness=MINI_HARNESS,
        policy=tpb.Policy(model=model),
        group_id=f"{run_id}/{instance_id}",
        sample_index=sample,
        final_patch=run.submission,
        metadata={"mini_exit_status": run.exit_status, "mini_api_calls": str(run.api_calls)},
    )
    messages = [m for m in run.messages if m.get("role") in roles]
    head = 0
    while head < len(messages) and messages[head]["role"] != "assistant":
        traj.messages.append(tpb.Message(role=roles[messages[head]["role"]], content=str(messages[head]["content"])))
        head += 1
    for message in messages[head:]:
        if message["role"] == "assistant":
            traj.steps.append(
                tpb.Step(
                    index=len(traj.steps),
                    model_output=tpb.Message(role=tpb.ROLE_ASSISTANT, content=str(message.get("content") or "")),
                )
            )
        elif traj.steps:
            traj.steps[-1].observations.append(
                tpb.Observation(
                    message=tpb.Message(role=roles[message["role"]], content=str(message.get("content") or ""))
                )
            )
    traj.step_count = len(traj.steps)
    traj.stop_reason = (
        tpb.STOP_REASON_SUBMITTED
        if run.exit_status == "Submitted"
        else tpb.STOP_REASON_STEP_LIMIT
        if run.exit_status == "LimitsExceeded"
        else tpb.STOP_REASON_FORMAT_ERROR
        if "Format" in run.exit_status
        else tpb.STOP_REASON_MODEL_ERROR
    )
    traj.stop_detail = run.exit_status
    traj.duration.CopyFrom(duration(seconds))
    traj.end_time.GetCurrentTime()
    return traj


async def mini_rollout(
    client: Any,
    instance: Any,
    sample: int,
    *,
    run_id: str,
    task_set: str,
    config: dict[str, Any],
    test_timeout_s: float = 600.0,
) -> Any:
    """One rollout of a task by mini-swe-agent, as any Orchard rollout: the task's sandbox set up (its repository
    at base, its environment forked when it has one), mini's DefaultAgent run in it, the submission graded in a
    fresh sandbox; returns a RolloutResult (the trajectory with its outcome reward)."""
    import asyncio
    import time

    from orchard.harness.runner import RolloutResult, ungraded
    from orchard.tasks.environments import task_sandbox
    from orchard.tasks.grading import grade

    sandbox, _ = await task_sandbox(
        client, instance, labels={"orchard.role": "rollout", "orchard.task": instance.instance_id[:63]}, timeout=7200
    )
    environment = {**config["environment"], "cwd": instance.workdir}
    started = time.monotonic()

    def run() -> MiniRun:
        env = OrchardEnvironment(sandbox_id=sandbox.sandbox_id, **environment)
        try:
            return run_mini_swe_agent(instance.problem_statement, config, env)
        finally:
            env.close()

    try:
        done = await asyncio.to_thread(run)
    except BaseException:
        await asyncio.shield(sandbox.delete())
        raise
    model = config["model"]["model_name"].removeprefix("openai/")
    traj = trajectory_of(
        done,
        run_id=run_id,
        instance_id=instance.instance_id,
        task_set=task_set,
        sample=sample,
        model=model,
        seconds=time.monotonic() - started,
    )
    from orchard.types.v1 import types_pb2 as tpb

    if traj.stop_reason == tpb.STOP_REASON_SUBMITTED:
        result = await grade(client, instance, traj.final_patch, sample_index=sample, test_timeout_s=test_timeout_s)
        reward = result.to_reward()
    else:
        result, reward = ungraded(traj)
    traj.rewards.append(reward)
    traj.metadata["verify_status"] = "resolved" if result.resolved else "unresolved"
    return RolloutResult(traj, result)
