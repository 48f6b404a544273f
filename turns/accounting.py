"""SPEC §16 for one turn: quota, fallbacks, usage rows, cost, latency, spans.

The engine builds one :class:`Books` (from the daemon's :class:`Accounting`) and asks
it for a :class:`TurnAccount` when a turn starts generating; the turn account is the
step observer of :class:`turns.steps.StepCaller` and adds ``latencyMs``, ``ttftMs``,
``cost`` and ``usage.cachedTokens`` to the final ``status`` event.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from turns.metrics import TurnMetrics
from turns.models import Clients, ModelResolutionError, parse_model
from turns.outcomes import Usage
from turns.pricing import Price
from turns.quota import Clock, LocalQuotaCounter, Quota, QuotaCounter, QuotaGate, utc_now
from turns.settings import Provider
from turns.state import ReplyTiming, StateDB, UsageRow
from turns.steps import Candidate, StepCaller
from turns.streams import StreamBuffer
from turns.telemetry import Telemetry, TurnTrace
from turns.usage import UsageLedger, model_key

log = logging.getLogger("turnd.turns")


def _no_quota(did: str) -> Quota | None:
    return None


@dataclass
class Accounting:
    """What the daemon's config says about §16 (all optional)."""

    prices: Mapping[str, Price] = field(default_factory=dict)  # "provider:id" -> Price
    fallbacks: Mapping[str, Sequence[str]] = field(default_factory=dict)  # "provider:id" -> refs
    quotas: Callable[[str], Quota | None] = _no_quota  # DID -> its quota
    telemetry: Telemetry = field(default_factory=Telemetry)
    clock: Clock = utc_now
    counter: QuotaCounter | None = None  # None: the state file's usage rows


class Books:
    """The engine's accounting: the ledger, the quota gate, telemetry, fallbacks."""

    def __init__(self, accounting: Accounting, state: StateDB, metrics: TurnMetrics) -> None:
        counter = accounting.counter or LocalQuotaCounter(state)
        self.accounting = accounting
        self.ledger = UsageLedger(state, metrics, accounting.prices, counter, accounting.clock)
        self.quotas = QuotaGate(accounting.quotas, counter, accounting.clock)
        self.telemetry = accounting.telemetry

    def begin(
        self, did: str, skey: str, reply: str, model: Mapping[str, str], buffer: StreamBuffer | None
    ) -> TurnAccount:
        return TurnAccount(self, did, skey, reply, model, buffer)

    async def record_side_call(
        self, did: str, skey: str, kind: str, model: Mapping[str, str], usage: Mapping[str, Any],
        reply: str = "",
    ) -> None:
        """A call made beside a turn's steps (``title``, ``summary``): it counts like a step."""
        counted = Usage()
        counted.add(usage)
        await self.ledger.record_call(self.ledger.row(did, skey, reply, model, counted, kind=kind))

    def candidates(
        self, clients: Clients, provider: Provider, model: Mapping[str, str], retries: int
    ) -> list[Candidate]:
        """The turn's model, then its ``[models.fallbacks]`` that resolve."""
        out = [Candidate(dict(model), clients.client(provider, retries))]
        for text in self.accounting.fallbacks.get(model_key(model), ()):
            try:
                ref = parse_model(text)
                out.append(Candidate(ref, clients.client(clients.provider(ref), retries)))
            except (ValueError, ModelResolutionError) as exc:
                log.warning("skipping fallback %r of %s: %s", text, model_key(model), exc)
        return out


class TurnAccount:
    """One turn's accounting, from the claim (its creation) to the final record."""

    def __init__(
        self,
        books: Books,
        did: str,
        skey: str,
        reply: str,
        model: Mapping[str, str],
        buffer: StreamBuffer | None,
    ) -> None:
        self._books = books
        self._did, self._skey, self._reply = did, skey, reply
        self._buffer = buffer
        self.claimed_at = time.monotonic()
        self.trace: TurnTrace = books.telemetry.turn(skey, reply, model)
        self._caller: StepCaller | None = None
        self.summaries: Any = None  # turns.summaries.BranchSummaries of this turn, if any
        self._rows: list[UsageRow] = []
        self._timing: ReplyTiming | None = None  # the final status's latency, once it is out

    async def check_quota(self) -> None:
        """Raises QuotaExceeded (a TurnFailed) before any model is called."""
        await self._books.quotas.check(self._did)

    def caller(
        self, clients: Clients, provider: Provider, model: Mapping[str, str], retries: int
    ) -> StepCaller:
        self._caller = StepCaller(
            self._books.candidates(clients, provider, model, retries), self._buffer, self
        )
        return self._caller

    def answered_by(self, model: Mapping[str, str]) -> dict[str, str]:
        """The model that answered (after a fallback, not the one asked for)."""
        return dict(self._caller.model) if self._caller is not None else dict(model)

    # -- the step observer (turns.steps) ----------------------------------------------------

    def step_span(self, index: int, ref: dict[str, str], body: dict[str, Any]) -> Any:
        return self.trace.step_span(index, ref, body)

    def tool_span(self, name: str, call_id: str, arguments: str) -> Any:
        return self.trace.tool_span(name, call_id, arguments)

    async def step_done(
        self, index: int, ref: dict[str, str], usage: Usage, started: float, duration: float,
        outcome: str,
    ) -> float | None:
        # Kept until the turn's status is out (save_rows): no state-file write between a
        # tool call and the next step, none before the final record.
        ledger = self._books.ledger
        row = ledger.row(
            self._did, self._skey, self._reply, ref, usage, step=index,
            started=ledger.now() - duration, duration=duration, outcome=outcome,
        )
        self._rows.append(row)
        return row.cost

    # -- the end -----------------------------------------------------------------------------

    @property
    def cost(self) -> float | None:
        return self._caller.cost if self._caller is not None else None

    def status_fields(
        self, status: dict[str, Any], usage: Usage, first_delta_at: float | None
    ) -> dict[str, Any]:
        """The final ``status`` event with §16's additions (called once the record is written)."""
        now = time.monotonic()
        out = dict(status)
        out["latencyMs"] = round((now - self.claimed_at) * 1000, 1)
        if first_delta_at is not None:
            out["ttftMs"] = round((first_delta_at - self.claimed_at) * 1000, 1)
        if usage.cached_seen and isinstance(out.get("usage"), dict):
            out["usage"] = {**out["usage"], "cachedTokens": usage.cached}
        if self.cost is not None:
            out["cost"] = round(self.cost, 10)
        # Kept with the usage rows, so the reply shows the same latency when loaded later.
        self._timing = ReplyTiming(
            self._did, self._skey, self._reply, out["latencyMs"], out.get("ttftMs")
        )
        return out

    def end(self, record: Mapping[str, Any]) -> None:
        self.trace.end(record, self.cost)

    async def save_rows(self, release: bool = False) -> None:
        """The turn's usage rows, its summary calls' among them, stored in one write; with
        ``release`` (its final record is written) the turn's claim row goes in it too."""
        rows, self._rows = self._rows, []
        summaries, self.summaries = self.summaries, None
        if summaries is not None:
            calls, summaries.usage[:] = list(summaries.usage), []
            for usage in calls:
                counted = Usage()
                counted.add(usage)
                rows.append(self._books.ledger.row(
                    self._did, self._skey, self._reply, summaries.model, counted, kind="summary"
                ))
        timing, self._timing = self._timing, None
        claim = (self._did, self._skey, self._reply) if release else None
        await self._books.ledger.save(rows, timing, claim)
