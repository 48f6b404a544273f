"""Logging for ``turnd serve``: one line per turn, as text or JSON, with secrets redacted.

The engine logs each finished turn on logger ``turnd.turns`` with
``extra={"turn": {...}}`` (conversation, key, model, status, ttft, tokens ...). The text
formatter renders that dict as ``key=value`` pairs after the message; the JSON formatter
puts its fields at the top level of one JSON object per line, so log shippers can index
them. Every line passes through :class:`RedactSecrets` first.
"""

from __future__ import annotations

import json
import logging
import math
import sys
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any, Literal

LogFormat = Literal["text", "json"]
_PLAIN = frozenset({int, float, bool, type(None)})  # nothing in them to redact
REDACTED = "[redacted]"

# The order a turn's fields are printed in by the text formatter (others follow, sorted).
TURN_FIELDS = (
    "conversation",
    "key",
    "model",
    "status",
    "ttft_ms",
    "duration_ms",
    "input_tokens",
    "output_tokens",
    "reasoning_tokens",
    "error",
)


def _timestamp(record: logging.LogRecord) -> str:
    return datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds")


_QUOTED = frozenset(' "=\n')  # a value with one of these is quoted


def _text_value(value: Any) -> str:
    if type(value) is int or (type(value) is float and math.isfinite(value)):
        return repr(value)  # what json.dumps writes for it, without its encoder's setup
    text = value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))
    # Quote values with spaces or quotes so each line stays machine-splittable.
    if not text or not _QUOTED.isdisjoint(text):
        return json.dumps(text)
    return text


def _turn_items(turn: dict[str, Any]) -> list[tuple[str, Any]]:
    known = [(k, turn[k]) for k in TURN_FIELDS if turn.get(k) is not None]
    rest = sorted((k, v) for k, v in turn.items() if k not in TURN_FIELDS and v is not None)
    return known + rest


class TextFormatter(logging.Formatter):
    """``2025-01-01T12:00:00.000+00:00 INFO turnd.turns turn conversation=... status=complete``."""

    def format(self, record: logging.LogRecord) -> str:
        head = f"{_timestamp(record)} {record.levelname} {record.name}"
        turn = getattr(record, "turn", None)
        if isinstance(turn, dict):
            # The turn's fields say everything the message says, in a greppable form.
            pairs = " ".join(f"{k}={_text_value(v)}" for k, v in _turn_items(turn))
            line = f"{head} turn {pairs}"
        else:
            line = f"{head} {record.getMessage()}"
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


class JsonFormatter(logging.Formatter):
    """One JSON object per line; a turn's fields are top-level keys."""

    def format(self, record: logging.LogRecord) -> str:
        body: dict[str, Any] = {
            "time": _timestamp(record),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        turn = getattr(record, "turn", None)
        if isinstance(turn, dict):
            for key, value in turn.items():
                body.setdefault(key, value)
        if record.exc_info:
            body["exception"] = self.formatException(record.exc_info)
        return json.dumps(body, default=str, ensure_ascii=False)


class RedactSecrets(logging.Filter):
    """Replaces every configured secret (API keys, passwords, tokens) in a record.

    A safety net: the code never logs secrets on purpose, but an exception message from
    a library (a URL with a key, a header dump) must not leak one either.
    """

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        super().__init__()
        # Very short values would redact ordinary words; real secrets are long.
        self._secrets = sorted({s for s in secrets if s and len(s) >= 8}, key=len, reverse=True)

    def _scrub(self, text: str) -> str:
        for secret in self._secrets:
            if secret in text:
                text = text.replace(secret, REDACTED)
        return text

    def _scrub_any(self, value: Any) -> Any:
        if isinstance(value, str):
            return self._scrub(value)
        if type(value) in _PLAIN:
            return value
        if isinstance(value, dict):
            return {k: self._scrub_any(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [self._scrub_any(v) for v in value]
        return value

    def filter(self, record: logging.LogRecord) -> bool:
        if not self._secrets:
            return True
        # Render once, then scrub: the args may hold the secret as well as the format.
        record.msg = self._scrub(record.getMessage())
        record.args = None
        turn = getattr(record, "turn", None)
        if isinstance(turn, dict):
            record.turn = self._scrub_any(turn)
        if record.exc_info:
            # Format the traceback now so its text can be scrubbed, then drop exc_info.
            text = logging.Formatter().formatException(record.exc_info)
            record.msg = f"{record.msg}\n{self._scrub(text)}"
            record.exc_info = None
            record.exc_text = None
        return True


def setup_logging(
    fmt: LogFormat = "text", *, secrets: Iterable[str] = (), level: int = logging.INFO
) -> logging.Handler:
    """Route every logger (turnd's, uvicorn's, the libraries') to one stderr handler."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    # On the handler, not a logger: filters on a logger do not see its children's records.
    handler.addFilter(RedactSecrets(secrets))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    # httpx logs each request URL at INFO; turns would bury the one line per turn.
    for noisy in ("httpx", "httpx2", "httpcore", "openai", "aiosqlite", "uvicorn.access", "mcp"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    return handler
