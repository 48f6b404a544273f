"""How a model call or a turn can end, and the tokens it used: shared by the step loop
(:mod:`turns.generate`), the model calls (:mod:`turns.steps`) and accounting."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from turns.pricing import reported_cost


class TurnFailed(Exception):
    """The turn ends as ``error``; the message is already short and free of secrets."""


class ModelFailed(TurnFailed):
    """A model call failed; ``started``: after its first token, so no fallback may redo it."""

    def __init__(self, message: str, *, started: bool) -> None:
        super().__init__(message)
        self.started = started


@dataclass
class Usage:
    input: int = 0
    output: int = 0
    reasoning: int = 0
    cached: int = 0
    seen: bool = False
    cached_seen: bool = False  # the provider reported prompt_tokens_details.cached_tokens
    cost: float | None = None  # the provider's own usage.cost, when it sends one
    model: str | None = None  # the model the provider says answered

    def add(self, usage: Mapping[str, Any], model: Any = None) -> None:
        self.seen = True
        if isinstance(model, str):
            self.model = model
        self.input += _int(usage.get("prompt_tokens"))
        self.output += _int(usage.get("completion_tokens"))
        details = usage.get("completion_tokens_details") or {}
        self.reasoning += _int(details.get("reasoning_tokens")) if isinstance(details, dict) else 0
        prompt = usage.get("prompt_tokens_details")
        if isinstance(prompt, dict) and isinstance(prompt.get("cached_tokens"), int):
            self.cached_seen = True
            self.cached += _int(prompt["cached_tokens"])
        cost = reported_cost(usage)
        if cost is not None:
            self.cost = (self.cost or 0.0) + cost

    def merge(self, other: Usage) -> None:
        """Add a step's usage to the turn's."""
        if not other.seen:
            return
        self.seen = True
        self.input += other.input
        self.output += other.output
        self.reasoning += other.reasoning
        self.cached += other.cached
        self.cached_seen = self.cached_seen or other.cached_seen
        self.model = other.model or self.model
        if other.cost is not None:
            self.cost = (self.cost or 0.0) + other.cost

    def record(self) -> dict[str, int] | None:
        if not self.seen:
            return None
        return {"inputTokens": self.input, "outputTokens": self.output, "reasoningTokens": self.reasoning}


def _int(value: Any) -> int:
    return value if isinstance(value, int) and value >= 0 else 0
