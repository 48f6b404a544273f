"""The hook names and what a hook receives: a leaf, so ``api`` and ``hooks`` both import it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

BEFORE_MODEL = "messages:beforeModel"  # filter: (messages, ctx) -> messages
AFTER_MODEL = "message:afterModel"  # filter: (record, ctx) -> record
TURN_AFTER = "turn:after"  # action: (ctx) -> None
HOOKS = (BEFORE_MODEL, AFTER_MODEL, TURN_AFTER)


@dataclass
class TurnContext:
    """What the hooks receive. ``reply`` is the placeholder, then the final record."""

    user: str
    conversation: str
    info: dict[str, Any] | None
    preferences: dict[str, Any] | None
    user_message: dict[str, Any]
    reply: dict[str, Any]
    model: dict[str, str]
    provider: str
    effort: str | None
    tools: list[str]
