"""Conversations in the store: create one, post to it, load it for a turn, keep its ref.

The turn engine starts turns; this module only reads and writes the records a
conversation is made of (its info, its messages, the settings space's
conversationRef).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from recordstore import (
    CONVERSATION,
    INFO,
    MESSAGE,
    Record,
    RecordNotFound,
    RecordStore,
)
from recordstore.keys import message_sort_key, new_tid, parse_reply_key
from recordstore.lexicon import validate_record
from turns import account_space, records, triggers
from turns.conversation_refs import ConversationRefs
from turns.message_cache import MessageCache, all_records, read_messages

log = logging.getLogger("turnd.turns")


@dataclass
class Conversation:
    """What a turn reads, once: the info, the user's preferences, every message by key."""

    info: dict[str, Any] | None
    preferences: dict[str, Any] | None
    messages: dict[str, dict[str, Any]]


async def messages(store: RecordStore, did: str, skey: str) -> list[Record]:
    """A conversation's messages in reading order: each user message, then its replies."""
    found = await all_records(store, did, skey, MESSAGE)
    found.sort(key=lambda r: message_sort_key(r.key))
    return found


async def info(store: RecordStore, did: str, skey: str) -> Record | None:
    """The conversation's info record (its title, system prompt): None when there is none."""
    return await store.get_record(did, skey, INFO, "self")


async def load(
    store: RecordStore,
    did: str,
    skey: str,
    known_info: Record | None = None,
    cache: MessageCache | None = None,
) -> Conversation:
    """The conversation's info, its messages and the account's preferences; ``known_info``:
    its info as read a moment ago (a POST's), not read again; ``cache``: the messages
    through it (turns.message_cache), shared values to be read, not changed."""
    found = known_info or await info(store, did, skey)
    preferences = await account_space.get_preferences(store, did)
    if cache is not None:
        by_key = await cache.messages(did, skey)
    else:
        by_key = await read_messages(store, did, skey)
    return Conversation(
        found.value if found else None, preferences.value if preferences else None, by_key
    )


async def create(
    store: RecordStore, did: str, *, title: str | None, system_prompt: str | None
) -> str:
    """A new conversation space with its info; returns its space key."""
    skey = new_tid()
    info = records.conversation_info(title, system_prompt)
    validate_record(INFO, info)  # before the space exists: nothing half-written
    await store.create_space(did, CONVERSATION, skey)
    await store.put_record(did, skey, INFO, "self", info)
    await touch_ref(store, did, skey, title)
    return skey


async def post(
    store: RecordStore,
    did: str,
    skey: str,
    *,
    parent: str | None,
    parts: list[dict[str, Any]],
    generation: dict[str, Any] | None,
) -> tuple[Record, Record]:
    """Create a user message (create-only, at a new TID) in an existing conversation; the
    message and the conversation's info, read to know it exists."""
    found = await info(store, did, skey)
    if found is None:
        raise RecordNotFound(f"no conversation {skey}")
    if parent is not None and await store.get_record(did, skey, MESSAGE, parent) is None:
        raise RecordNotFound(f"no message {parent} in conversation {skey}")
    value = records.user_message(parts, parent, generation)
    return await store.create_record(did, skey, MESSAGE, new_tid(), value), found


async def next_attempt(
    store: RecordStore,
    did: str,
    skey: str,
    key: str,
    *,
    model: dict[str, str] | None,
    effort: str | None,
) -> int:
    """Raise the user message's attempt by one (a put: earlier replies stay); return it."""
    record = await store.get_record(did, skey, MESSAGE, key)
    # A record at a reply-shaped key is never a user message, whatever it says.
    if record is None or record.value.get("role") != "user" or parse_reply_key(key):
        raise RecordNotFound(f"no user message {key} in conversation {skey}")
    generation = dict(record.value.get("generation") or {})
    attempt = triggers.attempt_of(generation) + 1
    generation["attempt"] = attempt
    if model is not None:
        generation["model"] = model
    if effort is not None:
        generation["effort"] = effort
    value = {**record.value, "generation": generation}
    await store.put_record(did, skey, MESSAGE, key, value, swap_cid=record.cid)
    return attempt


async def touch_ref(store: RecordStore, did: str, skey: str, title: str | None = None) -> None:
    """Keep the settings space's conversationRef current (the listing reads it): read and
    written, for a caller without the engine's :class:`ConversationRefs`."""
    await ConversationRefs(store, kept=0).touch(did, skey, title)
