"""A model provider named in an error's text: its config name and where it is, never its key
(SPEC §17: "Error messages about a provider name it").

With fallbacks, a title or summary model and several providers, "could not reach the
model provider" alone does not say which one to look at. The base URL is shown without
what may carry a credential (user info, query, fragment): some gateways take a key there.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx2
import openai

from turns.outcomes import TurnFailed

GENERIC = "the model provider"
NO_KEY = "unused"  # the key a client sends to a provider configured without one


def shown_url(base_url: object) -> str:
    """The base URL without user info, query or fragment, and without a trailing slash."""
    parts = urlsplit(str(base_url))
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"  # an IPv6 literal
    netloc = f"{host}:{parts.port}" if parts.port is not None else host
    return urlunsplit((parts.scheme, netloc, parts.path.rstrip("/"), "", ""))


def place(provider: str, base_url: object) -> str:
    """``"NAME" at URL``."""
    return f'"{provider}" at {shown_url(base_url)}' if base_url else f'"{provider}"'


def name_provider(text: str, provider: str, base_url: object, *, always: bool = True) -> str:
    """``text`` with the provider named once.

    "the model provider …" becomes "the model provider "NAME" at URL …"; any other text
    (a stalled or cut stream, a malformed chunk) gets "(model provider "NAME" at URL)"
    appended, unless ``always`` is false (a retry's status line, which the stream's
    ``step`` event already attributes).
    """
    if not provider:
        return text  # a bare client (tests, tools): nothing to name
    where = place(provider, base_url)
    if f'"{provider}"' in text:
        return text
    if GENERIC in text:
        return text.replace(GENERIC, f"{GENERIC} {where}", 1)
    return f"{text} ({GENERIC} {where})" if always else text


def without_keys(text: str, keys: Iterable[str]) -> str:
    """``text`` without the providers' keys (an error body may repeat the key it was sent)."""
    for key in keys:
        if key and key != NO_KEY:
            text = text.replace(key, "[redacted]")
    return text


def failure_text(exc: Exception) -> str:
    """A model call's failure in a few words, the provider's own message included (the
    caller names the provider, and scrubs secrets before anything is written)."""
    if isinstance(exc, TurnFailed):
        return str(exc)
    if isinstance(exc, openai.APIStatusError):
        return f"the model provider answered {exc.status_code}: {_status_text(exc)}"
    if isinstance(exc, openai.APITimeoutError):
        return "the model provider did not answer in time"
    if isinstance(exc, openai.APIConnectionError):
        return "could not reach the model provider"
    if isinstance(exc, httpx2.ReadTimeout):
        return "the model stopped sending (stalled)"
    if isinstance(exc, httpx2.HTTPError):
        return "the model's stream was cut off"
    return f"the model call failed: {type(exc).__name__}"


def error_text(error: Any) -> str:
    if isinstance(error, dict):
        return str(error.get("message") or error.get("type") or "unknown error")
    return str(error)


def _status_text(exc: openai.APIStatusError) -> str:
    body = exc.body
    if isinstance(body, dict):
        inner = body.get("error", body)
        return error_text(inner)
    return exc.message
