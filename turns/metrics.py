"""The engine's Prometheus collectors; the daemon serves them on /metrics."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from turns.address import TurnAddress

log = logging.getLogger("turnd.turns")


class TurnMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.turns = Counter(
            "turnd_turns", "Finished turns by final status", ["status"], registry=self.registry
        )
        self.queue = Gauge(
            "turnd_queue_length", "Turns waiting for the rate limit", registry=self.registry
        )
        self.ttft = Histogram(
            "turnd_time_to_first_token_seconds",
            "Claim to first streamed token",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
            registry=self.registry,
        )
        self.subscribers = Gauge(
            "turnd_stream_subscribers", "Open SSE subscriptions", registry=self.registry
        )
        self.running = Gauge("turnd_turns_running", "Turns generating now", registry=self.registry)
        # SPEC §16; model is "provider:id", kind input/output/reasoning/cached.
        self.tokens = Counter(
            "turnd_tokens", "Tokens of model calls", ["model", "kind"], registry=self.registry
        )
        self.cost = Counter(
            "turnd_cost_usd", "USD spent on model calls", ["model"], registry=self.registry
        )

    def subscriber_delta(self, delta: int) -> None:
        self.subscribers.inc(delta)


def observe_turn(
    metrics: TurnMetrics,
    a: TurnAddress,
    model: Mapping[str, str],
    record: Mapping[str, Any],
    ttft: float | None,
    duration: float,
) -> None:
    """A finished turn in the metrics and as one log line (references and numbers only)."""
    status = record["status"]
    metrics.turns.labels(status).inc()
    if ttft is not None:
        metrics.ttft.observe(ttft)
    usage = record.get("usage") or {}
    log.info(
        "turn %s/%s %s:%s %s",
        a.skey,
        a.reply,
        model["provider"],
        model["id"],
        status,
        extra={
            "turn": {
                "conversation": a.skey,
                "key": a.reply,
                "model": f"{model['provider']}:{model['id']}",
                "status": status,
                "ttft_ms": round(ttft * 1000, 1) if ttft is not None else None,
                "duration_ms": round(duration * 1000, 1),
                "input_tokens": usage.get("inputTokens"),
                "output_tokens": usage.get("outputTokens"),
                "error": record.get("error"),
            }
        },
    )
