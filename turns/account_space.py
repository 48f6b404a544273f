"""The account's settings space (key ``self``): its preferences and its conversations' refs.

One ``conversationRef`` per conversation (at the conversation's key) is what the
listing reads; the ``preferences`` record (at ``self``) is what every turn reads.
The space is created on the first write to it (idempotent).
"""

from __future__ import annotations

from typing import Any

from recordstore import CONVERSATION_REF, PREFERENCES, SETTINGS, SETTINGS_SPACE, Record, RecordStore

__all__ = ["ensure", "get_preferences", "get_ref", "put_preferences", "put_ref"]


async def ensure(store: RecordStore, did: str) -> None:
    """The settings space of ``did`` exists."""
    await store.create_space(did, SETTINGS, SETTINGS_SPACE)


async def get_ref(store: RecordStore, did: str, skey: str) -> Record | None:
    return await store.get_record(did, SETTINGS_SPACE, CONVERSATION_REF, skey)


async def put_ref(
    store: RecordStore, did: str, skey: str, value: dict[str, Any], *, new: bool = False
) -> Record:
    """Write the conversationRef of ``skey``; ``new``: none was there (the space may not be)."""
    if new:
        await ensure(store, did)
    return await store.put_record(did, SETTINGS_SPACE, CONVERSATION_REF, skey, value)


async def get_preferences(store: RecordStore, did: str) -> Record | None:
    return await store.get_record(did, SETTINGS_SPACE, PREFERENCES, "self")


async def put_preferences(store: RecordStore, did: str, value: dict[str, Any]) -> None:
    await ensure(store, did)
    await store.put_record(did, SETTINGS_SPACE, PREFERENCES, "self", value)
