"""ScriptedModel: a deterministic fake policy for tests, shipped as a real `Model`.

It renders with a ChatML template (tools as a system preamble, like the inference service does for templates
without tools), tokenizes bytes (ids 0-255, plus 256 = <|im_start|> and 257 = <|im_end|>, its end of turn),
and "generates" whatever its policy returns, with a fixed log-prob per token. The policy sees the decoded
prompt, so a script can react to observations. Token bookkeeping is thus exercised exactly as with a real model.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Callable, Sequence

from orchard.harness.model import Model, Rendered, Sample
from orchard.types.v1 import types_pb2 as tpb

IM_START, IM_END = 256, 257
SPECIAL = {"<|im_start|>": IM_START, "<|im_end|>": IM_END}
LOGPROB = -0.25
"""The log-prob the fake reports for every token it emits."""
ROLES = {
    tpb.ROLE_SYSTEM: "system",
    tpb.ROLE_DEVELOPER: "system",
    tpb.ROLE_USER: "user",
    tpb.ROLE_ASSISTANT: "assistant",
    tpb.ROLE_TOOL: "tool",
}
_SPECIAL_RE = re.compile("(" + "|".join(re.escape(s) for s in SPECIAL) + ")")

Policy = Callable[[str, int], str]
"""(decoded prompt, step index) -> the reply text."""


def replay(replies: Sequence[str]) -> Policy:
    """A policy that returns `replies` in order (the last one again once they run out)."""
    return lambda prompt, step: replies[min(step, len(replies) - 1)]


def encode(text: str) -> list[int]:
    ids: list[int] = []
    for piece in _SPECIAL_RE.split(text):
        ids += [SPECIAL[piece]] if piece in SPECIAL else list(piece.encode())
    return ids


def decode(ids: Sequence[int]) -> str:
    names = {v: k for k, v in SPECIAL.items()}
    out, run = [], bytearray()
    for i in ids:
        if i in names:
            out.append(run.decode(errors="replace"))
            run = bytearray()
            out.append(names[i])
        else:
            run.append(i)
    out.append(run.decode(errors="replace"))
    return "".join(out)


class ScriptedModel(Model):
    """A deterministic fake model (for tests): replies come from `policy`; see the module docstring."""

    def __init__(self, policy: Policy, name: str = "scripted", delay_s: float = 0.0) -> None:
        self.policy = policy
        self.name = name
        self.delay_s = delay_s
        """Seconds each generate call takes (to test wall-clock budgets and concurrency)."""
        self.calls = 0
        self.in_flight = 0
        self.max_in_flight = 0
        """The most generate calls running at once."""

    async def render(
        self, messages: list[tpb.Message], tools: list[tpb.ToolDefinition], add_generation_prompt: bool
    ) -> Rendered:
        # A message with image parts carries its text in them, as the inference service reads it.
        turns = [(ROLES[m.role], m.content or "".join(p.text for p in m.parts)) for m in messages]
        if tools:
            listed = "\n".join(
                json.dumps(
                    {"name": t.name, "description": t.description, "parameters": json.loads(t.parameters or "{}")}
                )
                for t in tools
            )
            preamble = f"Tools:\n<tools>\n{listed}\n</tools>"
            if turns and turns[0][0] == "system":
                turns[0] = ("system", f"{turns[0][1]}\n\n{preamble}")
            else:
                turns.insert(0, ("system", preamble))
        text = "".join(f"<|im_start|>{role}\n{content}<|im_end|>\n" for role, content in turns)
        if add_generation_prompt:
            text += "<|im_start|>assistant\n"
        return Rendered(text, encode(text))

    async def tokenize(self, text: str) -> list[int]:
        return encode(text)

    async def generate(
        self,
        token_ids: list[int],
        max_tokens: int,
        seed: int | None,
        labels: dict[str, str],
        images: Sequence[tpb.Image] = (),
    ) -> Sample:
        # A scripted policy reads the decoded prompt only; the images are not shown to it.
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            step = int(labels.get("step", "0"))
            reply = self.policy(decode(token_ids), step)
            self.calls += 1
            if self.delay_s:
                await asyncio.sleep(self.delay_s)
        finally:
            self.in_flight -= 1
        ids = [*encode(reply), IM_END]
        finish = "stop"
        if len(ids) > max_tokens:
            ids, finish = ids[:max_tokens], "length"
        text = decode([i for i in ids if i != IM_END])
        return Sample(text, ids, [LOGPROB] * len(ids), finish, weights_version=self.name)
