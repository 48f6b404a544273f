"""The engine's Prometheus collectors; the daemon serves them on /metrics."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


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
