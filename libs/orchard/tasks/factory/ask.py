"""One question to the served model, as the factory's model steps ask it (a statement, a rewrite): a system prompt,
one user message, seeded sampling (so a regenerated set asks the same), through the inference service's Chat."""

from __future__ import annotations

from typing import Any

SEED_STRIDE = 100_003
"""Question `index` of a synthesis with seed s samples with seed s * SEED_STRIDE + index."""


async def ask(
    inference: Any,
    system: str,
    user: str,
    *,
    seed: int,
    index: int,
    temperature: float,
    max_tokens: int,
    purpose: str,
    timeout_s: float,
) -> Any:
    """The model's first choice (`.text` raw, `.message.content` parsed), None when it gave none. `inference` is
    an orchard.clients transport to the inference service."""
    from orchard.inference.v1 import inference_pb2 as ipb
    from orchard.types.v1 import types_pb2 as tpb

    request = ipb.ChatRequest(
        messages=[tpb.Message(role=tpb.ROLE_SYSTEM, content=system), tpb.Message(role=tpb.ROLE_USER, content=user)],
        sampling=ipb.SamplingParams(temperature=temperature, max_tokens=max_tokens, seed=seed * SEED_STRIDE + index),
        labels={"purpose": purpose},
    )
    response = await inference.unary("Chat", request, idempotent=True, timeout=timeout_s)
    return response.choices[0] if response.choices else None
