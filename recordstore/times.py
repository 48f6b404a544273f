"""The one timestamp format turnd writes: UTC, milliseconds, ``Z`` (as the PDS does)."""

from __future__ import annotations

from datetime import UTC, datetime


def now_iso() -> str:
    """Now as a lexicon ``datetime``: ``2026-01-31T12:34:56.789Z``."""
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
