"""Per-account quotas: tokens per UTC day, dollars per UTC month (SPEC §16).

A turn that would start with its account's usage already at or over a limit calls no
model: it ends as an error naming the quota and when it resets. The sums come from a
:class:`QuotaCounter`; the local one reads this daemon's state file (exact with one
daemon). A shared counter (Redis, §18) implements the same two methods.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

from turns.limits import Quota
from turns.outcomes import TurnFailed
from turns.state import StateDB

__all__ = ["Clock", "LocalQuotaCounter", "Quota", "QuotaCounter", "QuotaExceeded", "QuotaGate"]

Clock = Callable[[], datetime]  # an aware UTC datetime; injectable for the day boundary


def utc_now() -> datetime:
    return datetime.now(UTC)


class QuotaExceeded(TurnFailed):
    """The turn is refused before any model call."""


def day_window(now: datetime) -> tuple[datetime, datetime]:
    start = now.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    return start, start + timedelta(days=1)


def month_window(now: datetime) -> tuple[datetime, datetime]:
    start = now.astimezone(UTC).replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    if start.month == 12:
        return start, start.replace(year=start.year + 1, month=1)
    return start, start.replace(month=start.month + 1)


def iso_utc(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class QuotaCounter(Protocol):
    async def totals(self, did: str, now: datetime) -> tuple[int, float]:
        """(tokens used in ``now``'s UTC day, USD spent in ``now``'s UTC month)."""
        ...

    async def add(self, did: str, at: datetime, tokens: int, cost: float) -> None:
        """Count a model call (the local counter reads the usage rows instead)."""
        ...


class LocalQuotaCounter:
    """Sums of the usage rows in this daemon's state file."""

    def __init__(self, state: StateDB) -> None:
        self._state = state

    async def totals(self, did: str, now: datetime) -> tuple[int, float]:
        day, _ = day_window(now)
        month, _ = month_window(now)
        # Rows are stamped by the same clock; a row from "the future" of an injected
        # clock (a test moving it back) must not count, hence the upper bound.
        _, end = day_window(now)
        return await self._state.usage_totals(
            did, day.timestamp(), month.timestamp(), end.timestamp()
        )

    async def add(self, did: str, at: datetime, tokens: int, cost: float) -> None:
        pass  # the row itself is what totals() reads


class QuotaGate:
    """Whether an account may start a turn now, and what /api/usage shows of its quota."""

    def __init__(
        self,
        limits: Callable[[str], Quota | None],
        counter: QuotaCounter,
        clock: Clock = utc_now,
    ) -> None:
        self._limits = limits
        self.counter = counter
        self.clock = clock

    def limits(self, did: str) -> Quota | None:
        quota = self._limits(did)
        return None if quota is None or quota.empty else quota

    async def check(self, did: str) -> None:
        """Raise :class:`QuotaExceeded` when a limit is reached; no query without a quota."""
        quota = self.limits(did)
        if quota is None:
            return
        now = self.clock()
        tokens, cost = await self.counter.totals(did, now)
        reasons = []
        if quota.tokens_per_day is not None and tokens >= quota.tokens_per_day:
            _, resets = day_window(now)
            reasons.append(
                f"tokensPerDay ({tokens} of {_number(quota.tokens_per_day)} tokens used today); "
                f"resets at {iso_utc(resets)}"
            )
        if quota.cost_per_month is not None and cost >= quota.cost_per_month:
            _, resets = month_window(now)
            reasons.append(
                f"costPerMonth ({cost:.4f} of {_number(quota.cost_per_month)} USD used this "
                f"month); resets at {iso_utc(resets)}"
            )
        if reasons:
            raise QuotaExceeded("quota exceeded: " + "; ".join(reasons))

    async def status(self, did: str) -> dict[str, Any] | None:
        """``{tokensPerDay: {used, limit, resetsAt}, costPerMonth: {…}}`` for the set limits."""
        quota = self.limits(did)
        if quota is None:
            return None
        now = self.clock()
        tokens, cost = await self.counter.totals(did, now)
        out: dict[str, Any] = {}
        if quota.tokens_per_day is not None:
            out["tokensPerDay"] = {
                "used": tokens,
                "limit": _number(quota.tokens_per_day),
                "resetsAt": iso_utc(day_window(now)[1]),
            }
        if quota.cost_per_month is not None:
            out["costPerMonth"] = {
                "used": round(cost, 8),
                "limit": quota.cost_per_month,
                "resetsAt": iso_utc(month_window(now)[1]),
            }
        return out


def _number(value: float) -> int | float:
    return int(value) if float(value).is_integer() else value
