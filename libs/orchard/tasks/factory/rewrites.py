"""Bugs a model writes (the `model_rewrite` strategy): one function at a time, through the inference service, asked
to come back with one subtle bug in it. The reply becomes a candidate like any procedural bug (mutations.py's
`rewrite_mutation`), or is counted with the reason it could not be one."""

from __future__ import annotations

import ast
from typing import Any

from orchard.tasks.factory.ask import ask
from orchard.tasks.factory.mutations import Mutation, functions, rewrite_mutation

REWRITE_SYSTEM = (
    "You prepare debugging exercises. Rewrite the Python function the user gives with exactly one subtle bug in it "
    "(a wrong comparison, a wrong index, a dropped step), keeping its name and signature. Reply with the whole "
    "function in one ```python block and nothing else."
)


class ModelRewriter:
    """Asks the served model for a buggy version of a function (`--strategies ...,model_rewrite`)."""

    def __init__(self, inference: Any, *, seed: int = 0, temperature: float = 0.8) -> None:
        self.inference = inference  # an orchard.clients transport to the inference service
        self.seed = seed
        self.temperature = temperature

    async def propose(self, path: str, source: str, function: str, index: int) -> Mutation | str:
        """The model's bug in `function` of the file, or why its reply is none."""
        node = dict(functions(ast.parse(source))).get(function)
        if node is None:
            return f"no function {function} in {path}"
        code = ast.get_source_segment(source, node, padded=True) or ""
        choice = await ask(
            self.inference,
            REWRITE_SYSTEM,
            f"```python\n{code}\n```",
            seed=self.seed,
            index=index,
            temperature=self.temperature,
            max_tokens=min(1024, 64 + 2 * len(code) // 3),  # about the function's own length, and some slack
            purpose="task-factory-rewrite",
            timeout_s=600,
        )
        return rewrite_mutation(path, source, function, choice.text if choice is not None else "")
