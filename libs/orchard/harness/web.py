"""The web harness: a web task in a browser sandbox, driven by tool calls named after the env service's browser
actions (click, double_click, type, key_press, scroll, navigate, back, wait) plus `done`. After each action the
agent sees the page as text (URL, title and the accessibility tree: text-only models), as a screenshot
(vision-language models), or both. `done` ends the rollout; the task's check then judges the page the agent left,
before the sandbox goes, and that is the rollout's grade (no patch to grade)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Literal

from orchard.errors import (
    DeadlineExceeded,
    FailedPrecondition,
    InvalidArgument,
    PermissionDenied,
)
from orchard.harness.base import ActionResult, Harness, call_arguments, create_retried, tool
from orchard.harness.model import ModelError
from orchard.harness.reference import tool_call
from orchard.harness.scripted import ScriptedModel
from orchard.sdk import AsyncSandbox, AsyncSandboxClient
from orchard.tasks.grading import GradeResult
from orchard.tasks.web import CheckResult, WebTask
from orchard.types.v1 import types_pb2 as tpb

Observe = Literal["text", "screenshot", "both"]
OBSERVE_MODES: tuple[Observe, ...] = ("text", "screenshot", "both")

SYSTEM_PROMPT = (
    "You are a web agent using a browser. Each turn you see the page (its URL, title and accessibility tree, "
    "and/or a screenshot); reply with exactly one tool call. Elements are best addressed with a selector: CSS "
    '("#search", "button.add") or Playwright\'s text and role selectors ("text=Checkout", '
    "\"role=button[name='Add to cart']\"). When the goal is reached, call done."
)
TASK_PROMPT = "Goal: {goal}\n\nThe page now:\n{page}"

_SELECTOR = {"type": "string", "description": 'A CSS or Playwright selector, e.g. "#name" or "text=Next".'}
_X = {"type": "number", "description": "X in CSS pixels, instead of a selector."}
_Y = {"type": "number", "description": "Y in CSS pixels, instead of a selector."}
TOOLS = [
    tool("click", "Click an element (by selector) or a point (x, y).", {"selector": _SELECTOR, "x": _X, "y": _Y}, []),
    tool(
        "double_click",
        "Double-click an element (by selector) or a point (x, y).",
        {"selector": _SELECTOR, "x": _X, "y": _Y},
        [],
    ),
    tool(
        "type",
        "Type text into the element matching selector (or the focused one).",
        {"text": {"type": "string"}, "selector": _SELECTOR},
        ["text"],
    ),
    tool("key_press", 'Press a key or chord, e.g. "Enter", "Tab", "Control+A".', {"key": {"type": "string"}}, ["key"]),
    tool(
        "scroll",
        "Scroll the page by delta_y (down is positive) and delta_x pixels.",
        {"delta_y": {"type": "number"}, "delta_x": {"type": "number"}},
        ["delta_y"],
    ),
    tool("navigate", "Go to a URL.", {"url": {"type": "string"}}, ["url"]),
    tool("back", "Go back one page in history.", {}, []),
    tool(
        "wait",
        "Wait for an element to appear (selector) or for some seconds.",
        {"selector": _SELECTOR, "seconds": {"type": "number"}},
        [],
    ),
    tool(
        "done",
        "The goal is reached (or cannot be): end the task, with an answer when the goal asks a question.",
        {"answer": {"type": "string"}},
        [],
    ),
]
ARGUMENTS = {
    "click": {"selector", "x", "y"},
    "double_click": {"selector", "x", "y"},
    "type": {"text", "selector"},
    "key_press": {"key"},
    "scroll": {"delta_x", "delta_y"},
    "navigate": {"url"},
    "back": set(),
    "wait": {"selector", "seconds"},
}
"""The arguments each browser tool takes (the `act` keywords, except `seconds`, which becomes a timeout)."""
AGENT_ERRORS = (InvalidArgument, DeadlineExceeded, PermissionDenied)
"""Errors of an action the agent chose badly (a bad selector, a timeout): shown to it."""
PAGE_ERRORS = frozenset({"EGRESS_DENIED", "NAVIGATION_FAILED"})
"""FAILED_PRECONDITION reasons that are the page's, not the sandbox's (a site the policy does not admit, one that
does not load): shown to the agent too. Any other FAILED_PRECONDITION (its browser crashed) ends the rollout."""


class WebHarness(Harness):
    """One rollout of a web task in its own browser sandbox."""

    name = "orchard-web"
    tools = TOOLS

    def __init__(
        self,
        task: WebTask,
        client: AsyncSandboxClient,
        site: str,
        *,
        task_set: str = "web",
        observe: Observe = "text",
        max_page_chars: int = 4000,
        action_timeout_s: float = 10.0,
        create_timeout_s: float = 60.0,
        create_attempts: int = 3,
        sandbox_ttl_s: float = 3600.0,
    ) -> None:
        if observe not in OBSERVE_MODES:
            raise InvalidArgument(
                f"observe must be one of {', '.join(OBSERVE_MODES)}, not {observe!r}", field="observe"
            )
        self.task = task
        self.client = client
        self.site = site.rstrip("/")
        self.task_id = task.task_id
        self.task_set = task_set
        self.observe = observe
        self.max_page_chars = max_page_chars
        self.action_timeout_s = action_timeout_s
        self.create_timeout_s = create_timeout_s
        self.create_attempts = create_attempts
        self.sandbox_ttl_s = sandbox_ttl_s
        self.sandbox: AsyncSandbox | None = None
        self._first_page: tuple[str, list[tpb.Image]] = ("", [])
        self._answer = ""
        self._grade: GradeResult | None = None

    def allow(self) -> list[str]:
        """The browser's egress allowlist: the site server's host and port, and the hosts the task names."""
        host_port = self.site.split("://", 1)[-1].split("/", 1)[0]
        return [host_port, *self.task.allow_hosts]

    async def setup(self) -> None:
        """Create the browser sandbox (bounded, retried on transient errors) and open the task's start page."""
        self.sandbox = await create_retried(
            lambda: self.client.create_browser(
                self.allow(),
                timeout=self.sandbox_ttl_s,
                labels={"orchard.role": "rollout", "orchard.task": self.task_id[:63]},
            ),
            attempts=self.create_attempts,
            timeout_s=self.create_timeout_s,
        )
        await self.sandbox.act("navigate", url=self.task.url(self.site), timeout=self.action_timeout_s)
        self._first_page = await self.observation()

    def initial_messages(self) -> list[tpb.Message]:
        text, images = self._first_page
        user = tpb.Message(role=tpb.ROLE_USER, content=TASK_PROMPT.format(goal=self.task.goal, page=text))
        if images:
            user.parts.add(text=user.content)
            user.parts.extend(tpb.ContentPart(image=i) for i in images)
            user.content = ""
        return [tpb.Message(role=tpb.ROLE_SYSTEM, content=SYSTEM_PROMPT), user]

    async def observation(self, prefix: str = "") -> tuple[str, list[tpb.Image]]:
        """The page as the agent sees it: text (URL, title, accessibility tree) and/or a screenshot."""
        assert self.sandbox is not None
        images: list[tpb.Image] = []
        if self.observe in ("screenshot", "both"):
            shot = await self.sandbox.screenshot()
            images.append(tpb.Image(data=shot.png, mime_type="image/png", width=shot.width, height=shot.height))
            text = f"URL: {shot.url}\nTitle: {shot.title}"
        if self.observe in ("text", "both"):
            page = await self.sandbox.page_content()
            tree = page.accessibility_tree
            if len(tree) > self.max_page_chars:
                tree = f"{tree[: self.max_page_chars]}\n[... {len(tree) - self.max_page_chars} characters cut ...]"
            text = f"URL: {page.url}\nTitle: {page.title}\n{tree}"
        return prefix + text, images

    async def execute(self, action: tpb.ToolCall) -> ActionResult:
        assert self.sandbox is not None, "setup() first"
        args = call_arguments(action)
        if isinstance(args, ActionResult):
            return args
        if action.name == "done":
            self._answer = str(args.get("answer") or "")
            self._grade = await self.judge()
            return ActionResult("", status=tpb.ACTION_STATUS_SUBMITTED, submitted=True)
        unknown = sorted(set(args) - ARGUMENTS[action.name])
        if unknown:
            return ActionResult(
                f"{action.name} takes {sorted(ARGUMENTS[action.name]) or 'no arguments'}; unknown: {unknown}.",
                status=tpb.ACTION_STATUS_PARSE_ERROR,
            )
        timeout = self.action_timeout_s
        if "seconds" in args:
            try:
                timeout = max(0.0, min(float(args.pop("seconds")), self.action_timeout_s))
            except (TypeError, ValueError):
                return ActionResult("seconds must be a number.", status=tpb.ACTION_STATUS_PARSE_ERROR)
        try:
            await self.sandbox.act(action.name, timeout=timeout, **args)
        except (*AGENT_ERRORS, FailedPrecondition) as err:
            if isinstance(err, FailedPrecondition) and err.reason not in PAGE_ERRORS:
                raise  # the sandbox itself failed (its browser crashed): the rollout ends with ENV_ERROR
            status = tpb.ACTION_STATUS_TIMED_OUT if isinstance(err, DeadlineExceeded) else tpb.ACTION_STATUS_ENV_ERROR
            text, images = await self.observation(f"Error: {err.message}\n\n")
            return ActionResult(text, status=status, images=images)
        except (TypeError, ValueError) as err:  # a wrongly typed argument the SDK refused
            return ActionResult(f"Bad arguments for {action.name}: {err}.", status=tpb.ACTION_STATUS_PARSE_ERROR)
        text, images = await self.observation()
        return ActionResult(text, images=images)

    async def judge(self) -> GradeResult:
        """The task's check on the page as the agent left it."""
        assert self.sandbox is not None
        began = time.monotonic()
        page = await self.sandbox.page_content()
        result: CheckResult = self.task.check.evaluate(page.url, page.title, page.text)
        log = "\n".join([f"final page: {page.url} ({page.title})", *result.reasons])
        return GradeResult(
            instance_id=self.task_id,
            patch_exists=False,
            patch_applied=False,
            resolved=result.passed,
            log_tail=log,
            duration_s=time.monotonic() - began,
        )

    def outcome(self) -> GradeResult | None:
        return self._grade

    async def submission(self) -> tuple[str, str]:
        return "", self._answer

    async def close(self) -> None:
        if self.sandbox is not None:
            await self.sandbox.delete()


class WebScriptModel(ScriptedModel):
    """A scripted web policy: it follows each task's bundled solution, one action per turn, then calls done.
    The task is the one whose goal is in the prompt's first user message. For tests and for checking a task set
    end to end through real browsers; it is no model."""

    def __init__(self, tasks: Sequence[WebTask], site: str, name: str = "web-script") -> None:
        super().__init__(self.reply, name=name)
        self.tasks = list(tasks)
        self.site = site.rstrip("/")

    def task_of(self, prompt: str) -> WebTask:
        first = prompt.split("<|im_start|>user\n", 1)[-1].split("<|im_end|>", 1)[0]
        for task in self.tasks:
            if f"Goal: {task.goal}\n" in first:
                return task
        raise ModelError(
            f"the scripted web policy does not know the task in this prompt (it knows {len(self.tasks)} tasks)"
        )

    def reply(self, prompt: str, step: int) -> str:
        actions = self.task_of(prompt).actions(self.site)
        if step >= len(actions):
            return "The goal is reached.\n" + tool_call("done")
        action = dict(actions[step])
        return tool_call(str(action.pop("action")), **action)
