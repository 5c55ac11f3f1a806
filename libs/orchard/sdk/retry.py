"""When and how the SDK retries a failed call: only UNAVAILABLE (and RESOURCE_EXHAUSTED that carries
RetryInfo), only for idempotent calls, a few times, with jittered exponential backoff."""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable
from typing import TypeVar

from orchard.errors import OrchardError, ResourceExhausted, Unavailable

T = TypeVar("T")
log = logging.getLogger("orchard.sdk")

ATTEMPTS = 3
BASE_DELAY_S = 0.5
MAX_DELAY_S = 30.0


def retryable(err: OrchardError, idempotent: bool) -> bool:
    """True when repeating the call may succeed and cannot do the work twice."""
    if not idempotent:
        return False
    return isinstance(err, Unavailable) or (isinstance(err, ResourceExhausted) and err.retry_after is not None)


def backoff_s(attempt: int, err: OrchardError) -> float:
    """Seconds to wait before retry number `attempt` (0-based): the server's hint, else 0.5 s, 1 s ... jittered."""
    base = err.retry_after if err.retry_after is not None else BASE_DELAY_S * 2**attempt
    return min(base * random.uniform(0.75, 1.5), MAX_DELAY_S)


async def with_retries(call: Callable[[], Awaitable[T]], *, idempotent: bool, what: str) -> T:
    """Await `call()`, retrying it as `retryable` allows; the last error is raised as is."""
    for attempt in range(ATTEMPTS):
        try:
            return await call()
        except OrchardError as err:
            if attempt + 1 == ATTEMPTS or not retryable(err, idempotent):
                raise
            delay = backoff_s(attempt, err)
            log.info(
                "%s failed (%s: %s); retry %d/%d in %.1fs",
                what,
                err.code.name,
                err.message,
                attempt + 1,
                ATTEMPTS - 1,
                delay,
            )
            await asyncio.sleep(delay)
    raise AssertionError("unreachable")
