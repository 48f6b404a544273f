"""Managing an account's conversations (SPEC §15): the paged, searchable list; rename;
delete with the blobs only it references; the preferences record.

The list is the settings space's conversationRef index (turnd keeps each ref's
``title`` and ``updatedAt`` current). A backend with the ``FieldIndex`` ability
(the local store) reads it in one query; others page through ``listRecords``.
"""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from recordstore import (
    CONVERSATION_REF,
    INFO,
    MESSAGE,
    PREFERENCES,
    SETTINGS_SPACE,
    SUMMARY,
    InvalidSwap,
    RecordNotFound,
    RecordStore,
    StoreError,
)
from recordstore.abilities import BlobCollector, NewestFirst, NewestQuery
from recordstore.lexicon import validate_record
from recordstore.times import now_iso
from recordstore.vocabulary import APPROVAL
from turns import account_space, conversations

log = logging.getLogger("turnd.turns")

DEFAULT_PAGE = 50
MAX_PAGE = 1000
# Every collection a conversation space holds (approvals: SPEC §14).
CONVERSATION_COLLECTIONS = (MESSAGE, SUMMARY, APPROVAL)


class BadCursor(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class Page:
    conversations: list[dict[str, Any]]
    cursor: str | None


# -- the list ------------------------------------------------------------------------------


def _encode_cursor(updated: str, skey: str) -> str:
    raw = json.dumps([updated, skey], separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _decode_cursor(cursor: str) -> tuple[str, str]:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        updated, skey = json.loads(raw)
        if isinstance(updated, str) and isinstance(skey, str):
            return updated, skey
    except (ValueError, TypeError):
        pass
    raise BadCursor("cursor: not a cursor this list gave")


async def page(
    store: RecordStore,
    did: str,
    *,
    limit: int = DEFAULT_PAGE,
    cursor: str | None = None,
    q: str | None = None,
) -> Page:
    """Newest first (by ``updatedAt``, then key); ``q`` matches titles case-insensitively."""
    after = _decode_cursor(cursor) if cursor else None
    if isinstance(store, NewestFirst):
        query = NewestQuery(
            SETTINGS_SPACE, CONVERSATION_REF, ("title", "updatedAt"),
            order="updatedAt", limit=limit + 1, before=after,
            match=("title", q) if q else None,
        )
        found = await store.newest(did, query)
        rows = [(row[0] or "", row[1], row[2]) for row in found]
    else:
        rows = await _scan(store, did, limit + 1, after, q)
    more = len(rows) > limit
    rows = rows[:limit]
    items = []
    for skey, title, updated in rows:
        if title is None and ":" not in skey and not q:
            # A ref written by a client that left the title out: the info has it.
            info = await store.get_record(did, skey, INFO, "self")
            found_title = info.value.get("title") if info else None
            title = found_title if isinstance(found_title, str) else None
        items.append({"skey": skey, "title": title, "updatedAt": updated})
    next_cursor = _encode_cursor(rows[-1][2] or "", rows[-1][0]) if more and rows else None
    return Page(items, next_cursor)


async def _scan(
    store: RecordStore, did: str, limit: int, after: tuple[str, str] | None, q: str | None
) -> list[tuple[str, str | None, str | None]]:
    """The same page from ``listRecords`` (a PDS): every ref read, sorted here."""
    needle = q.casefold() if q else None
    chosen = []
    cursor: str | None = None
    while True:
        batch, cursor = await store.list_records(
            did, SETTINGS_SPACE, CONVERSATION_REF, cursor=cursor, limit=100
        )
        for ref in batch:
            title, updated = ref.value.get("title"), ref.value.get("updatedAt")
            title = title if isinstance(title, str) else None
            updated = updated if isinstance(updated, str) else None
            if needle is not None and (title is None or needle not in title.casefold()):
                continue
            order = (updated or "", ref.key)
            if after is None or order < after:
                chosen.append((order, ref.key, title, updated))
        if cursor is None or not batch:
            break
    chosen.sort(reverse=True)
    return [(skey, title, updated) for _, skey, title, updated in chosen[:limit]]


# -- rename ----------------------------------------------------------------------------------


_UNSET: Any = object()


async def update_info(
    store: RecordStore,
    did: str,
    skey: str,
    *,
    title: Any = _UNSET,
    system_prompt: Any = _UNSET,
) -> dict[str, Any]:
    """Set (or with ``""`` / None, remove) the title and system prompt; a title set here is
    the user's. Raises InvalidRecord (naming the field) before anything is written."""
    for _ in range(5):
        info = await store.get_record(did, skey, INFO, "self")
        if info is None:
            raise RecordNotFound(f"no conversation {skey}")
        value = dict(info.value)
        if title is not _UNSET:
            if title:
                value.update(title=title, titleSource="user")
            else:
                value.pop("title", None)
                value.pop("titleSource", None)
        if system_prompt is not _UNSET:
            if system_prompt:
                value["systemPrompt"] = system_prompt
            else:
                value.pop("systemPrompt", None)
        validate_record(INFO, value)
        try:
            await store.put_record(did, skey, INFO, "self", value, swap_cid=info.cid)
        except InvalidSwap:
            continue  # a title generated meanwhile: apply ours over it
        if title is not _UNSET:
            await _retitle_ref(store, did, skey, title or None)
        return value
    raise InvalidSwap(f"the info of {skey} kept changing; try again")


async def _retitle_ref(store: RecordStore, did: str, skey: str, title: str | None) -> None:
    if title:
        await conversations.touch_ref(store, did, skey, title)
        return
    existing = await account_space.get_ref(store, did, skey)
    if existing is not None:
        value = {k: v for k, v in existing.value.items() if k != "title"}
        value["updatedAt"] = now_iso()
        await account_space.put_ref(store, did, skey, value)


# -- delete ------------------------------------------------------------------------------------


def blob_cids(value: Any) -> Iterator[str]:
    """Every blob a record value references."""
    if isinstance(value, Mapping):
        if value.get("$type") == "blob":
            link = value.get("ref")
            if isinstance(link, Mapping) and isinstance(link.get("$link"), str):
                yield link["$link"]
            return
        for item in value.values():
            yield from blob_cids(item)
    elif isinstance(value, list):
        for item in value:
            yield from blob_cids(item)


async def delete(store: RecordStore, did: str, skey: str) -> set[str]:
    """Delete the conversation's records, then its info and its conversationRef, then the
    blobs no other record references. Returns the CIDs of the blobs deleted.

    Messages go before the info, so an interrupted delete leaves a conversation that is
    still listed and can be deleted again.
    """
    cids: set[str] = set()
    for collection in CONVERSATION_COLLECTIONS:
        while True:
            found, _ = await store.list_records(did, skey, collection, limit=100)
            if not found:
                break
            for record in found:
                cids.update(blob_cids(record.value))
                await store.delete_record(did, skey, collection, record.key)
    info = await store.get_record(did, skey, INFO, "self")
    if info is not None:
        cids.update(blob_cids(info.value))
        await store.delete_record(did, skey, INFO, "self")
    await store.delete_record(did, SETTINGS_SPACE, CONVERSATION_REF, skey)
    deleted: set[str] = set()
    if isinstance(store, BlobCollector):
        for cid in sorted(cids):
            try:
                if not await store.blob_in_use(did, cid):
                    await store.delete_blob(did, cid)
                    deleted.add(cid)
            except StoreError as exc:
                log.warning("could not delete blob %s of %s: %s", cid, skey, exc)
    return deleted


# -- preferences -----------------------------------------------------------------------------


async def preferences(store: RecordStore, did: str) -> dict[str, Any]:
    record = await account_space.get_preferences(store, did)
    return dict(record.value) if record else {}


async def put_preferences(store: RecordStore, did: str, value: Mapping[str, Any]) -> dict[str, Any]:
    """Replace the preferences record (validated against its lexicon first)."""
    record = {**value, "$type": PREFERENCES, "updatedAt": now_iso()}
    validate_record(PREFERENCES, record)
    await account_space.put_preferences(store, did, record)
    return record
