"""Which changes of the store start a turn: the direct-write rules."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from recordstore import MESSAGE, Change
from recordstore.keys import parse_reply_key
from recordstore.vocabulary import ENCRYPTED_CONTENT as ENCRYPTED


@dataclass(frozen=True, slots=True)
class Decision:
    attempt: int
    error: str | None = None  # set: answer with an error reply instead of a turn


def attempt_of(generation: Any) -> int:
    attempt = generation.get("attempt", 0) if isinstance(generation, Mapping) else 0
    return attempt if isinstance(attempt, int) and 0 <= attempt <= 1000 else 0


def decide(change: Change, owners: Mapping[str, Any], backfill_minutes: float) -> Decision | None:
    """A turn (or an error reply) for this change, or None.

    A create or update of a ``user`` message by the space's owner (a DID turnd
    serves), carrying a ``generation`` object, seen live or created within the
    backfill window. Whether the reply exists is checked by ``start_turn``.
    """
    if change.collection != MESSAGE or change.op == "delete" or change.did not in owners:
        return None
    if parse_reply_key(change.key) is not None:
        return None  # reply keys belong to the runners, whatever their record says
    value = change.record
    if not isinstance(value, Mapping) or value.get("role") != "user":
        return None
    generation = value.get("generation")
    if generation is None:
        return None
    if not change.live and not _recent(value.get("createdAt"), backfill_minutes):
        return None
    attempt = attempt_of(generation)
    if change.error is not None:
        return Decision(attempt, f"turnd did not answer: the message is invalid: {change.error}")
    content = value.get("content")
    if isinstance(content, Mapping) and content.get("$type") == ENCRYPTED:
        return Decision(attempt, "turnd cannot read encrypted content, so it cannot answer it")
    return Decision(attempt)


def _recent(created_at: Any, backfill_minutes: float) -> bool:
    if not isinstance(created_at, str):
        return False
    try:
        created = datetime.fromisoformat(created_at.replace("Z", "+00:00"))
    except ValueError:
        return False
    if created.tzinfo is None:
        created = created.replace(tzinfo=UTC)
    age = (datetime.now(UTC) - created).total_seconds()
    return age <= backfill_minutes * 60
