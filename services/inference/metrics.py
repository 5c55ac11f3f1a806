"""The inference service's Prometheus metrics: batch sizes and tokens generated."""

from __future__ import annotations

from prometheus_client import Counter, Histogram

BATCH_SIZE = Histogram(
    "orchard_inference_batch_size",
    "Sequences decoded together in one engine step.",
    buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256),
)
TOKENS = Counter("orchard_inference_generated_tokens", "Tokens generated, over all requests.")
