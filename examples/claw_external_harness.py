"""An external agent on the Claw environment: a plain OpenAI tool-calling loop (the official `openai` client, not
Orchard's harness library) whose model calls go through the recording proxy, one recorded rollout per task.

    orchard serve proxy --upstream-url http://127.0.0.1:8000/v1 --port 8090    # in front of any OpenAI endpoint
    python examples/claw_external_harness.py --model <model id> --ids reply-question-000 update-csv-007

Each task gets a fresh Claw sandbox (the env service and the `claw` image, as `bash scripts/main.sh` sets up);
the model sees `orchard.assistant.TOOLS`, each tool call runs in the sandbox, and its reply without a tool call is
the final answer. The world the run leaves is then graded as Claw-Eval does. The proxy files the model calls of
task T under rollout `<run id>-T` (the X-Orchard-Rollout-Id header), so any harness's runs become training data.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from typing import cast

from openai import AsyncOpenAI
from openai.types.chat import (
    ChatCompletionFunctionToolParam,
    ChatCompletionMessageFunctionToolCall,
    ChatCompletionMessageParam,
)

from orchard.assistant import TOOLS, AssistantEnv
from orchard.sdk import AsyncSandboxClient
from orchard.tasks.assistant import AssistantTask, grade, load_tasks


async def solve(
    model: AsyncOpenAI, model_name: str, task: AssistantTask, env: AssistantEnv, max_steps: int
) -> tuple[str, int]:
    """Run the tool-calling loop; (the final answer, "" if the step budget ran out; the number of tool calls)."""
    messages: list[ChatCompletionMessageParam] = [
        {"role": "system", "content": task.system_prompt()},
        {"role": "user", "content": task.instruction},
    ]
    tools = cast(list[ChatCompletionFunctionToolParam], TOOLS)  # OpenAI function tool specs, as plain dicts
    calls = 0
    for _ in range(max_steps):
        reply = await model.chat.completions.create(model=model_name, messages=messages, tools=tools)
        message = reply.choices[0].message
        if not message.tool_calls:
            return message.content or "", calls
        messages.append(cast(ChatCompletionMessageParam, message.model_dump(exclude_none=True)))
        for call in message.tool_calls:
            assert isinstance(call, ChatCompletionMessageFunctionToolCall)  # only function tools are offered
            try:
                args = json.loads(call.function.arguments or "{}")
                result = await env.call(call.function.name, args)
            except json.JSONDecodeError as err:
                result = json.dumps({"error": f"the arguments are not valid JSON: {err}"})
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
            calls += 1
    return "", calls


async def run(args: argparse.Namespace) -> dict[str, float]:
    """Every chosen task once, each in its own sandbox and rollout; the score of each, by task id."""
    scores: dict[str, float] = {}
    async with AsyncSandboxClient(args.env_address) as sandboxes:
        for task in load_tasks(ids=args.ids):
            rollout_id = f"{args.run_id}-{task.task_id}"
            model = AsyncOpenAI(
                base_url=args.base_url,
                api_key=args.api_key,
                timeout=300,
                default_headers={"X-Orchard-Rollout-Id": rollout_id},
            )
            env = await AssistantEnv.start(sandboxes, task.fixture, labels={"rollout": rollout_id})
            try:
                answer, calls = await solve(model, args.model, task, env, args.max_steps)
                result = grade(task, await env.state(), answer)
            finally:
                await env.close()
                await model.close()
            scores[task.task_id] = result.score
            print(f"{task.task_id}: score {result.score:.2f} after {calls} tool calls (rollout {rollout_id})")
            for reason in result.reasons:
                print(f"    {reason}")
    if scores:
        print(f"mean score {sum(scores.values()) / len(scores):.3f} over {len(scores)} tasks")
    return scores


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="A plain OpenAI tool-calling agent on Claw assistant tasks.")
    parser.add_argument(
        "--base-url",
        default="http://127.0.0.1:8090/v1",
        help="any OpenAI-compatible /v1 URL (default: the recording proxy)",
    )
    parser.add_argument("--model", default="SmolLM2-135M-Instruct", help="the model id the endpoint serves")
    parser.add_argument("--api-key", default="orchard", help="the key the endpoint (or the proxy's upstream) takes")
    parser.add_argument(
        "--env-address", help="env service host:port (default: ORCHARD_ENV_ADDRESS, else 127.0.0.1:50051)"
    )
    parser.add_argument("--ids", nargs="*", default=["reply-question-000"], help="bundled task ids (none = all 200)")
    parser.add_argument("--max-steps", type=int, default=12, help="model calls per task")
    parser.add_argument("--run-id", default=f"claw-{int(time.time())}", help="rollout ids are <run id>-<task id>")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    asyncio.run(run(parse_args(argv)))


if __name__ == "__main__":
    main()
