"""Rollout events on NATS JetStream: the publisher harnesses use, builders for the events, and the stream's names.

from orchard import events
async with events.EventPublisher.connect(nats_url) as publisher:
    await publisher.publish(events.started(trajectory))
"""

from orchard.events.builders import finished, model_call, reward, started, step
from orchard.events.publisher import (
    EventPublisher,
    PublishBackpressure,
    PublisherStats,
    connect_nats,
)
from orchard.events.subjects import STREAM, ensure_stream, subject_of

__all__ = [
    "STREAM",
    "EventPublisher",
    "PublishBackpressure",
    "PublisherStats",
    "connect_nats",
    "ensure_stream",
    "finished",
    "model_call",
    "reward",
    "started",
    "step",
    "subject_of",
]
