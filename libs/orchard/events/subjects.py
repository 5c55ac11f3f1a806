"""The rollout event stream's names and settings, shared by the publisher and the experience consumer."""

from __future__ import annotations

import re

from nats.js import JetStreamContext
from nats.js.api import StorageType, StreamConfig
from nats.js.errors import BadRequestError, NotFoundError

from orchard.experience.v1.experience_pb2 import RolloutEvent

STREAM = "ORCHARD_ROLLOUTS"
"""The JetStream stream every rollout event goes to."""
SUBJECT_PREFIX = "orchard.rollouts"
DUPLICATE_WINDOW_S = 600.0
"""How long JetStream remembers a Nats-Msg-Id: a publish retried within it is stored once. Ten minutes covers
a NATS restart and the publisher's longest backoff with room to spare."""

# The subject token after the run id, by the member of RolloutEvent's `event` oneof.
EVENT_TOKENS = {
    "rollout_started": "started",
    "rollout_step": "step",
    "rollout_finished": "finished",
    "reward_added": "reward",
    "model_call_recorded": "call",
}
_RUN_TOKEN = re.compile(r"[^.*>\s]+")


def subject_of(event: RolloutEvent) -> str:
    """`orchard.rollouts.<run>.<event>`; ValueError when the event has no kind, id or a run id unfit for a subject."""
    kind = event.WhichOneof("event")
    if kind is None:
        raise ValueError(f"event {event.event_id!r} has no event set (rollout_started, rollout_step, ...)")
    if not event.event_id:
        raise ValueError("event has no event_id; it is the Nats-Msg-Id that makes retries safe")
    if not _RUN_TOKEN.fullmatch(event.run_id):
        raise ValueError(
            f"run id {event.run_id!r} is not a valid subject token: it must be non-empty, "
            "without '.', '*', '>' or whitespace"
        )
    return f"{SUBJECT_PREFIX}.{event.run_id}.{EVENT_TOKENS[kind]}"


def stream_config() -> StreamConfig:
    """File storage (survives restarts) and a dedupe window. No size or age limit: the stream is the durable
    hand-off to the experience store and must not discard what the consumer has not stored; operators who
    want retention set limits on the stream themselves (this leaves an existing stream alone)."""
    return StreamConfig(
        name=STREAM, subjects=[f"{SUBJECT_PREFIX}.>"], storage=StorageType.FILE, duplicate_window=DUPLICATE_WINDOW_S
    )


async def ensure_stream(js: JetStreamContext) -> None:
    """Create the stream if missing; an existing one is left as its operator configured it."""
    try:
        await js.stream_info(STREAM)
    except NotFoundError:
        try:
            await js.add_stream(stream_config())
        except BadRequestError:
            # Another process created it between our two calls (publisher and consumer start together).
            await js.stream_info(STREAM)
