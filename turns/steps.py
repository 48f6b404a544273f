"""One step's model call: ``step``/``retry``/``fallback`` events, usage rows, spans.

A step is one model call (SPEC §5). It is tried on the turn's model first, with the
``openai`` client's retries (reported as ``retry`` events, :mod:`turns.retries`);
when the model still fails before its first token, the next model of
``[models.fallbacks]`` takes over (a ``fallback`` event, then a new ``step`` event
for the same index). A model that answered keeps answering the turn's later steps:
the one before it has just failed. A failure after the first token is never redone
by another model: the subscribers have seen its output.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import anyio
import openai

from turns.context import PromptTooLong
from turns.outcomes import ModelFailed, TurnFailed, Usage
from turns.provider_errors import name_provider, without_keys
from turns.retries import reporting
from turns.streams import StreamBuffer

T = TypeVar("T")

# (client, request body, this call's usage) -> the step's result
StepStream = Callable[[openai.AsyncOpenAI, dict[str, Any], Usage], Awaitable[T]]


@dataclass(frozen=True, slots=True)
class Candidate:
    """A model that can answer a step: its modelRef and its provider's client."""

    ref: dict[str, str]
    client: openai.AsyncOpenAI


def single(client: openai.AsyncOpenAI, model: str, provider: str = "") -> list[Candidate]:
    return [Candidate({"provider": provider, "id": model}, client)]


class StepSpan(Protocol):
    def end(self, *, model: str | None, usage: Usage, error: str | None) -> None: ...


class ToolSpan(Protocol):
    def end(self, output: Any, is_error: bool) -> None: ...


class StepObserver(Protocol):
    """Accounting and tracing of model calls (turns.accounting.TurnAccount)."""

    def step_span(self, index: int, ref: dict[str, str], body: dict[str, Any]) -> StepSpan: ...

    def tool_span(self, name: str, call_id: str, arguments: str) -> ToolSpan: ...

    async def step_done(
        self, index: int, ref: dict[str, str], usage: Usage, started: float, duration: float,
        outcome: str,
    ) -> float | None:
        """Record the call; returns its cost in USD when known."""
        ...


class _NoSpan:
    def end(self, *args: Any, **kwargs: Any) -> None:
        pass


NO_SPAN = _NoSpan()


class StepCaller:
    def __init__(
        self,
        candidates: Sequence[Candidate],
        buffer: StreamBuffer | None,
        observer: StepObserver | None = None,
    ) -> None:
        if not candidates:
            raise ValueError("a step needs at least one model")
        self._candidates = list(candidates)
        # What a failure says goes into `fallback` events and spans: never a key in it.
        self._keys = [c.client.api_key for c in self._candidates]
        self._at = 0
        self._buffer = buffer
        self._observer = observer
        self.cost: float | None = None  # the turn's cost so far, when any call's is known

    @property
    def model(self) -> dict[str, str]:
        """The model answering now: after a fallback, the one that took over."""
        return self._candidates[self._at].ref

    def _publish(self, event: str, data: dict[str, Any]) -> None:
        if self._buffer is not None:
            self._buffer.publish(event, data)

    async def call(self, index: int, body: dict[str, Any], stream: StepStream[T], total: Usage) -> T:
        """Run step ``index``; its usage is added to ``total``."""
        while True:
            candidate = self._candidates[self._at]
            self._publish("step", {"index": index, "model": candidate.ref})

            provider, base_url = candidate.ref["provider"], candidate.client.base_url

            def report(
                attempt: int, reason: str, wait: float, provider: str = provider,
                base_url: object = base_url,
            ) -> None:
                # A network failure's reason names the provider; a status line stays as
                # it is (the `step` event before it names the model).
                reason = name_provider(reason, provider, base_url, always=False)
                self._publish(
                    "retry",
                    {"step": index, "attempt": attempt, "reason": reason,
                     "waitSeconds": round(wait, 3)},
                )

            request = {**body, "model": candidate.ref["id"]}
            span = self._observer.step_span(index, candidate.ref, request) if self._observer else NO_SPAN
            usage = Usage()
            started, t0 = time.time(), time.monotonic()
            outcome, error = "cancelled", None
            try:
                with reporting(report):
                    result = await stream(candidate.client, request, usage)
                outcome = "ok"
                return result
            except ModelFailed as failure:
                named = name_provider(str(failure), provider, base_url)
                failure.args = (without_keys(named, self._keys),)
                error = str(failure)
                if failure.started or self._at + 1 >= len(self._candidates):
                    outcome = "error"
                    raise
                outcome = "fallback"
                self._at += 1
                self._publish(
                    "fallback",
                    {"from": candidate.ref, "to": self.model, "reason": error},
                )
            except TurnFailed as failure:
                if isinstance(failure, PromptTooLong):  # the provider's refusal: name it
                    named = name_provider(str(failure), provider, base_url)
                    failure.args = (without_keys(named, self._keys),)
                outcome, error = "error", str(failure)
                raise
            finally:
                total.merge(usage)
                span.end(model=candidate.ref["id"], usage=usage, error=error)
                if self._observer is not None:
                    # Shielded: a cancelled or timed-out step is still a call to account for.
                    with anyio.CancelScope(shield=True):
                        cost = await self._observer.step_done(
                            index, candidate.ref, usage, started, time.monotonic() - t0, outcome
                        )
                    if cost is not None:
                        self.cost = (self.cost or 0.0) + cost

    def tool_span(self, name: str, call_id: str, arguments: str) -> ToolSpan:
        if self._observer is None:
            return NO_SPAN
        return self._observer.tool_span(name, call_id, arguments)

