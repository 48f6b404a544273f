"""turns.triggers: which changes of the store start a turn (the direct-write rules)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from recordstore import Change
from turns.triggers import Decision, attempt_of, decide

OWNER = "did:plc:owneraaaaaaaaaaaaaaaaaaa"
OTHER = "did:plc:otherbbbbbbbbbbbbbbbbbbb"
OWNERS = {OWNER: "alice"}
MESSAGE = "network.sharedcomputer.chat.message"
WINDOW = 60  # minutes


def iso(ago: timedelta) -> str:
    return (datetime.now(UTC) - ago).strftime("%Y-%m-%dT%H:%M:%S.000Z")


def change(
    *,
    did: str = OWNER,
    key: str = "3m2a4b5c6d7e2",
    live: bool = True,
    op: str = "create",
    error: str | None = None,
    collection: str = MESSAGE,
    **fields: Any,
) -> Change:
    record: dict[str, Any] = {
        "$type": MESSAGE,
        "role": "user",
        "content": {"$type": "network.sharedcomputer.chat.defs#plainContent", "parts": []},
        "generation": {},
        "createdAt": iso(timedelta()),
    }
    record.update(fields)
    record = {k: v for k, v in record.items() if v is not None}
    return Change(did, "3m2a4b5c6d7e3", collection, key, op, "bafy", record, error, "1", live)


def test_a_live_user_message_with_generation_by_the_owner_starts_a_turn() -> None:
    assert decide(change(), OWNERS, WINDOW) == Decision(0)
    assert decide(change(op="update", generation={"attempt": 3}), OWNERS, WINDOW) == Decision(3)


def test_only_the_owner_starts_turns_live_or_in_the_backfill() -> None:
    assert decide(change(did=OTHER), OWNERS, WINDOW) is None
    assert decide(change(did=OTHER, live=False), OWNERS, WINDOW) is None
    assert decide(change(did=OTHER), {}, WINDOW) is None


def test_live_changes_start_turns_whatever_their_created_at() -> None:
    for created in (iso(timedelta(hours=5)), "not a date", None):
        assert decide(change(createdAt=created), OWNERS, WINDOW) == Decision(0), created


def test_the_backfill_starts_turns_only_inside_the_window() -> None:
    young = change(live=False, createdAt=iso(timedelta(minutes=WINDOW - 1)))
    old = change(live=False, createdAt=iso(timedelta(minutes=WINDOW + 1)))
    assert decide(young, OWNERS, WINDOW) == Decision(0)
    assert decide(old, OWNERS, WINDOW) is None
    assert decide(change(live=False, createdAt="yesterday"), OWNERS, WINDOW) is None
    assert decide(change(live=False, createdAt=None), OWNERS, WINDOW) is None
    # A wider window takes the older message too.
    assert decide(old, OWNERS, WINDOW + 5) == Decision(0)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"generation": None},  # no generation request
        {"role": "assistant"},
        {"op": "delete"},
        {"collection": "network.sharedcomputer.chat.info"},
        {"key": "3m2a4b5c6d7e2.r0"},  # reply keys belong to the runners
    ],
)
def test_changes_that_ask_for_no_turn(kwargs: dict[str, Any]) -> None:
    assert decide(change(**kwargs), OWNERS, WINDOW) is None


def test_an_invalid_record_gets_an_error_reply_quoting_the_validator() -> None:
    decision = decide(change(error="content.parts[0].text is required", generation={"attempt": 2}),
                      OWNERS, WINDOW)
    assert decision is not None and decision.attempt == 2
    assert decision.error is not None and "content.parts[0].text is required" in decision.error


def test_encrypted_content_gets_an_error_reply() -> None:
    encrypted = {"$type": "network.sharedcomputer.chat.defs#encryptedContent"}
    decision = decide(change(content=encrypted), OWNERS, WINDOW)
    assert decision is not None and decision.error is not None and "encrypted" in decision.error


@pytest.mark.parametrize(
    ("generation", "attempt"),
    [({}, 0), ({"attempt": 4}, 4), ({"attempt": -1}, 0), ({"attempt": 1001}, 0),
     ({"attempt": "2"}, 0), ({"attempt": 1000}, 1000), (None, 0), ([], 0)],
)
def test_attempt_of(generation: Any, attempt: int) -> None:
    assert attempt_of(generation) == attempt
