"""The usage ledger: one row per model call in the state file, metrics, quota counts.

Every model call turnd makes is recorded here, the steps of a turn and the calls made
beside one (titles, summaries: :meth:`UsageLedger.record_call` with ``kind``), so
``GET /api/usage``, ``turnd usage``, ``/metrics`` and the quotas all see the same
numbers. A row holds numbers and references only, never content.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Mapping, Sequence
from datetime import UTC, date, datetime, timedelta
from typing import Any

from turns.metrics import TurnMetrics
from turns.outcomes import Usage
from turns.pricing import Price
from turns.quota import Clock, QuotaCounter, QuotaGate, month_window, utc_now
from turns.state import ReplyTiming, ReplyUsage, StateDB, UsageRow, UsageSum

log = logging.getLogger("turnd.usage")


def model_key(ref: Mapping[str, str]) -> str:
    return f"{ref['provider']}:{ref['id']}"


class UsageLedger:
    def __init__(
        self,
        state: StateDB,
        metrics: TurnMetrics,
        prices: Mapping[str, Price] | None = None,
        counter: QuotaCounter | None = None,
        clock: Clock = utc_now,
    ) -> None:
        self._state = state
        self._metrics = metrics
        self._prices = dict(prices or {})
        self.counter = counter
        self.clock = clock

    def price(self, ref: Mapping[str, str]) -> Price | None:
        return self._prices.get(model_key(ref))

    def cost(self, ref: Mapping[str, str], usage: Usage) -> float | None:
        """The provider's reported cost, else the configured price's, else None."""
        if usage.cost is not None:
            return usage.cost
        price = self.price(ref)
        if price is None:
            return None
        return price.cost(usage.input, usage.output, usage.cached)

    def now(self) -> float:
        """Unix seconds by the ledger's clock (injectable: the quota tests move it)."""
        return self.clock().timestamp()

    def row(
        self,
        did: str,
        skey: str,
        reply_key: str,
        ref: Mapping[str, str],
        usage: Usage,
        *,
        step: int = 0,
        kind: str = "turn",
        started: float | None = None,
        duration: float = 0.0,
        outcome: str = "ok",
    ) -> UsageRow:
        """One model call as a row, its cost computed; :meth:`save` stores it."""
        return UsageRow(
            did=did,
            skey=skey,
            reply_key=reply_key,
            kind=kind,
            step=step,
            provider=ref["provider"],
            model=ref["id"],
            input_tokens=usage.input,
            output_tokens=usage.output,
            reasoning_tokens=usage.reasoning,
            cached_tokens=usage.cached,
            cost=self.cost(ref, usage),
            started_at=self.now() if started is None else started,
            duration_ms=round(duration * 1000, 3),
            outcome=outcome,
        )

    async def save(
        self,
        rows: Sequence[UsageRow],
        timing: ReplyTiming | None = None,
        release: tuple[str, str, str] | None = None,
    ) -> None:
        """Store rows (and a turn's timing) and count them in /metrics and the quota counter;
        ``release`` (did, skey, reply key) drops the turn's claim row in the same commit."""
        if not rows and timing is None and release is None:
            return
        try:
            await self._state.add_usage(rows, timing, release)
        except Exception as exc:  # noqa: BLE001 - accounting must never fail a turn
            where = rows[0] if rows else timing
            log.error(
                "could not record the usage of %s: %s",
                f"{where.skey}/{where.reply_key}" if where else "a turn", exc,
            )
            if release is not None:
                # A claim row left behind is dropped at the next start (TurnEngine.recover).
                with contextlib.suppress(Exception):
                    await self._state.drop_claim(*release)
        tokens = self._metrics.tokens
        for row in rows:
            label = f"{row.provider}:{row.model}"
            for kind_label, n in (
                ("input", row.input_tokens),
                ("output", row.output_tokens),
                ("reasoning", row.reasoning_tokens),
                ("cached", row.cached_tokens),
            ):
                if n:
                    tokens.labels(label, kind_label).inc(n)
            if row.cost:
                self._metrics.cost.labels(label).inc(row.cost)
            if self.counter is not None and (row.input_tokens or row.output_tokens or row.cost):
                at = datetime.fromtimestamp(row.started_at, UTC)
                await self.counter.add(
                    row.did, at, row.input_tokens + row.output_tokens, row.cost or 0.0
                )

    async def record_call(self, row: UsageRow) -> float | None:
        """Record one model call (a :meth:`row`) now; returns its cost in USD when known.

        Titles and summaries call this with rows of ``kind="title"`` / ``"summary"``, so
        they count like any step.
        """
        await self.save([row])
        return row.cost


# -- reports (GET /api/usage, turnd usage) ---------------------------------------------------


class BadDate(ValueError):
    pass


def parse_day(name: str, value: str) -> date:
    """``YYYY-MM-DD`` -> a date, else BadDate naming the parameter."""
    try:
        if len(value) != 10:
            raise ValueError
        return date.fromisoformat(value)
    except ValueError:
        raise BadDate(f"{name}: expected a date YYYY-MM-DD, got {value!r}") from None


def day_start(day: date) -> float:
    return datetime(day.year, day.month, day.day, tzinfo=UTC).timestamp()


def this_month(now: datetime) -> tuple[date, date]:
    start, end = month_window(now)
    return start.date(), (end - timedelta(days=1)).date()


def sum_json(row: UsageSum) -> dict[str, Any]:
    return {
        "key": row.key,
        "turns": row.turns,
        "steps": row.steps,
        "inputTokens": row.input_tokens,
        "outputTokens": row.output_tokens,
        "reasoningTokens": row.reasoning_tokens,
        "cachedTokens": row.cached_tokens,
        "cost": round(row.cost, 8),
    }


def reply_usage_json(row: ReplyUsage) -> dict[str, Any]:
    """One reply's usage as the page shows it under the reply (``GET .../usage``)."""
    out: dict[str, Any] = {
        "steps": row.steps,
        "inputTokens": row.input_tokens,
        "outputTokens": row.output_tokens,
        "reasoningTokens": row.reasoning_tokens,
        "cachedTokens": row.cached_tokens,
        "durationMs": round(row.duration_ms, 1),
    }
    if row.cost is not None:
        out["cost"] = round(row.cost, 10)
    if row.latency_ms is not None:
        out["latencyMs"] = row.latency_ms
    if row.ttft_ms is not None:
        out["ttftMs"] = row.ttft_ms
    return out


async def conversation_usage(state: StateDB, did: str, skey: str) -> dict[str, Any]:
    """``GET /api/conversations/{skey}/usage``: each reply's usage, cost and latency."""
    rows = await state.reply_usage(did, skey)
    return {"replies": {row.reply_key: reply_usage_json(row) for row in rows}}


async def usage_report(
    state: StateDB,
    did: str,
    first: date,
    last: date,
    group: str,
    quotas: QuotaGate | None = None,
) -> dict[str, Any]:
    """SPEC §16's ``GET /api/usage`` answer: UTC days ``first``..``last`` inclusive."""
    if last < first:
        raise BadDate(f"to: {last.isoformat()} is before from: {first.isoformat()}")
    # The end of `last` without date arithmetic: 9999-12-31 has no next day.
    rows = await state.usage_sums(did, day_start(first), day_start(last) + 86400, group)
    out: dict[str, Any] = {
        "from": first.isoformat(),
        "to": last.isoformat(),
        "group": group,
        "rows": [sum_json(r) for r in rows],
    }
    quota = await quotas.status(did) if quotas is not None else None
    if quota:
        out["quota"] = quota
    return out
