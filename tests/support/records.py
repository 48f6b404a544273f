"""Record builders and readers the tests share, spelled as the lexicons spell them.

The NSIDs are written out here rather than imported from the daemon: a test that used the
daemon's own constants would not notice the daemon renaming one.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

MESSAGE = "network.sharedcomputer.chat.message"
INFO = "network.sharedcomputer.chat.info"
CONVERSATION = "network.sharedcomputer.chat.conversation"
TEXT = "network.sharedcomputer.chat.defs#textPart"
PLAIN = "network.sharedcomputer.chat.defs#plainContent"


def now_iso(offset_seconds: float = 0) -> str:
    """An atproto datetime (UTC, milliseconds), ``offset_seconds`` from now."""
    t = datetime.now(UTC) + timedelta(seconds=offset_seconds)
    return t.strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def text_part(text: str) -> dict[str, Any]:
    return {"$type": TEXT, "text": text}


def user_message(
    text: str,
    *,
    attempt: int | None = 0,
    parent: str | None = None,
    created_at: str | None = None,
    **fields: Any,
) -> dict[str, Any]:
    """A user message record as a stock atproto client would write it."""
    value: dict[str, Any] = {
        "$type": MESSAGE,
        "role": "user",
        "content": {"$type": PLAIN, "parts": [text_part(text)]},
        "createdAt": created_at or now_iso(),
    }
    if attempt is not None:
        value["generation"] = {"attempt": attempt}
    if parent is not None:
        value["parent"] = parent
    value.update(fields)
    return value


def stored_message(text: str = "hello", **extra: Any) -> dict[str, Any]:
    """A user message asking for no reply, with a fixed createdAt: the store tests compare
    CIDs and bytes, which must not change with the clock."""
    return user_message(text, attempt=None, created_at="2026-01-01T00:00:00.000Z", **extra)


def reply_text(value: dict[str, Any]) -> str:
    """The text of a reply record's text parts, joined."""
    parts = (value.get("content") or {}).get("parts") or []
    return "".join(p.get("text", "") for p in parts if p.get("$type", "").endswith("#textPart"))
