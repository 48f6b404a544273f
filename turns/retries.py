"""The ``openai`` client's own retries, made visible (SPEC §16 ``retry`` events).

The SDK decides whether and how long to wait (408/409/429/5xx, timeouts, connection
errors; ``Retry-After`` / ``retry-after-ms`` honoured up to its maximum; exponential
backoff with jitter otherwise) and it only ever retries before a response has
arrived, so before the first token. It offers no callback for that (openai-python
issue #1190), so :class:`ReportingOpenAI` overrides the one method its retry loop
calls between attempts, ``_sleep_for_retry``: it computes the same wait with the
SDK's ``_calculate_retry_timeout``, tells the turn, then sleeps. Which turn to tell
travels in a context variable, so one client per provider still serves every turn.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from http import HTTPStatus
from typing import Any

import anyio
import httpx2
import openai

# (attempt from 1, reason, seconds to wait)
RetryReport = Callable[[int, str, float], None]

_report: ContextVar[RetryReport | None] = ContextVar("turnd_retry_report", default=None)


@contextmanager
def reporting(report: RetryReport) -> Iterator[None]:
    """Retries of the client calls made inside this block are reported to ``report``."""
    token = _report.set(report)
    try:
        yield
    finally:
        _report.reset(token)


class ReportingOpenAI(openai.AsyncOpenAI):
    """``AsyncOpenAI`` whose retries call the reporter of the current context first."""

    async def _sleep_for_retry(  # type: ignore[override]
        self,
        *,
        retries_taken: int,
        max_retries: int,
        options: Any,
        response: httpx2.Response | None,
    ) -> None:
        report = _report.get()
        if report is None:
            await super()._sleep_for_retry(
                retries_taken=retries_taken,
                max_retries=max_retries,
                options=options,
                response=response,
            )
            return
        wait = self._calculate_retry_timeout(
            max_retries - retries_taken, options, response.headers if response is not None else None
        )
        report(retries_taken + 1, retry_reason(response, sys.exception()), wait)
        await anyio.sleep(wait)


def retry_reason(response: httpx2.Response | None, error: BaseException | None) -> str:
    """A short reason without secrets: the status line, or the kind of network failure.

    The SDK has closed an error response unread before it waits, so its body (the
    provider's message) is not available here; the status says enough to retry on.
    """
    if response is not None:
        # The standard phrase: HTTP/2 responses carry none of their own.
        try:
            phrase = HTTPStatus(response.status_code).phrase
        except ValueError:
            phrase = ""
        return f"{response.status_code} {phrase}".strip()
    if isinstance(error, httpx2.TimeoutException):
        return "the model provider did not answer in time"
    return "could not reach the model provider"
