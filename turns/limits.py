"""An account's quota, as the config states it (SPEC §16); checked by :mod:`turns.quota`.

A leaf module: the config imports it, and nothing here may pull in the model client.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Quota:
    tokens_per_day: float | None = None  # input + output tokens
    cost_per_month: float | None = None  # USD

    @property
    def empty(self) -> bool:
        return self.tokens_per_day is None and self.cost_per_month is None
