"""What a model call costs, in US dollars (SPEC §16).

Prices are per million tokens, from ``[providers.X.model."ID"]`` in the config. A
provider that reports its own charge (``usage.cost``, as OpenRouter does) is taken at
its word: that is what the account is billed, discounts and routing included.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

PER_TOKENS = 1_000_000
PRICE_KEYS = ("inputPrice", "outputPrice", "cachedInputPrice")


@dataclass(frozen=True, slots=True)
class Price:
    """USD per million tokens. ``cached_input`` None: cached input costs ``input``."""

    input: float = 0.0
    output: float = 0.0
    cached_input: float | None = None

    def cost(self, input_tokens: int, output_tokens: int, cached_tokens: int = 0) -> float:
        """SPEC §16: (input − cached) × input + cached × (cachedInput, else input) + output × output."""
        cached = min(max(cached_tokens, 0), input_tokens)
        cached_price = self.input if self.cached_input is None else self.cached_input
        return (
            (input_tokens - cached) * self.input
            + cached * cached_price
            + output_tokens * self.output
        ) / PER_TOKENS


def check_price(key: str, value: Any) -> float:
    """A price or quota from the config: a finite number >= 0, else ValueError naming ``key``."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{key}: must be a number, got {value!r}")
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{key}: must be a number >= 0, got {value!r}")
    return float(value)


def price_from_table(where: str, table: Mapping[str, Any]) -> Price | None:
    """``{inputPrice, outputPrice, cachedInputPrice}`` -> a Price, or None when none is set.

    A missing input or output price counts as 0 (a model billed on one side only).
    """
    given = {k: check_price(f"{where}.{k}", table[k]) for k in PRICE_KEYS if table.get(k) is not None}
    if not given:
        return None
    return Price(
        input=given.get("inputPrice", 0.0),
        output=given.get("outputPrice", 0.0),
        cached_input=given.get("cachedInputPrice"),
    )


def reported_cost(usage: Mapping[str, Any]) -> float | None:
    """The provider's own ``usage.cost`` when it sends a usable one."""
    cost = usage.get("cost")
    if isinstance(cost, bool) or not isinstance(cost, int | float):
        return None
    return float(cost) if math.isfinite(cost) and cost >= 0 else None
