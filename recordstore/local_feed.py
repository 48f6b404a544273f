"""The local store's change feed: its op log, read from a cursor and followed live.

An op id is the feed's cursor. A feed reads the log in batches; when it has caught up
it waits for its file's :class:`~recordstore.local_bell.Bell` (writes of this process)
or ``poll_interval`` (writes of other processes), whichever comes first.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import aclosing, asynccontextmanager
from typing import Any

import anyio

from recordstore import Change, InvalidRecord, StoreError
from recordstore.lexicon import validate_record
from recordstore.local_db import OP_COLS, LocalDb
from recordstore.local_written import Written
from recordstore.stored_json import parse

__all__ = ["change_head", "changes", "keys_changed", "parse_cursor"]

_FEED_BATCH = 256
# Once caught up, the live tail is read on the loop's thread (recordstore.sqlite_quick) a
# few rows at a time; a longer backlog goes through the reader's thread in full batches.
_TAIL_BATCH = 16


@asynccontextmanager
async def changes(
    db: LocalDb, cursor: str | None, poll_interval: float
) -> AsyncIterator[AsyncIterator[Change]]:
    """The op log of ``db`` from just after ``cursor`` (None: from the beginning)."""
    after = parse_cursor(cursor)
    head = await change_head(db)
    if after > head:
        raise StoreError(f"cursor {after} is ahead of the store's last op {head}")
    async with aclosing(_follow(db, after, head, poll_interval)) as feed:
        yield feed


async def _follow(
    db: LocalDb, after: int, head: int, poll_interval: float
) -> AsyncIterator[Change]:
    """The op log from just after ``after``; ops past ``head`` are live."""
    caught_up = False
    while True:
        # Armed before the read and kept until the wait, so a write landing at any
        # point after the read began (while its rows are handled, too) wakes us.
        waiter = db.bell.arm()
        try:
            batch = _TAIL_BATCH if caught_up else _FEED_BATCH
            sql = f"SELECT {OP_COLS} FROM ops WHERE id > ? ORDER BY id LIMIT {batch}"
            rows = await (db.read_short if caught_up else db.read)(sql, (after,))
            caught_up = len(rows) < batch
            for row in rows:
                after = row[0]
                yield _change(row, db.written, live=after > head)
            if caught_up:
                # A short batch was the whole log as of the read: read again when a
                # write rings (at once if one did meanwhile) or another process's
                # may have landed, not straight away (that read found nothing:
                # half of the feed's reads, one per write, before).
                with anyio.move_on_after(poll_interval):
                    await waiter.wait()
        finally:
            db.bell.disarm(waiter)


async def change_head(db: LocalDb) -> int:
    """The newest op's id (0: none yet)."""
    rows = await db.read_short("SELECT seq FROM sqlite_sequence WHERE name = 'ops'", ())
    return rows[0][0] if rows else 0


async def keys_changed(
    db: LocalDb, did: str, space: str, collection: str, after: int, limit: int
) -> tuple[set[str], str] | None:
    """The keys of one space's ``collection`` in the ops after ``after``, and the last op's
    cursor; None when more than ``limit`` ops follow it. The log has no index by space: the
    ops since are scanned along the primary key, by SQLite, which hands back only that
    space's keys (the rows came to Python to be sorted out before: ~80 of them a turn with
    20 conversations busy, 68 µs where this takes 18.5)."""
    head = await change_head(db)
    if head - after > limit:  # the ops since, or more: AUTOINCREMENT never reuses an id
        return None
    rows = await db.read_short(
        "SELECT DISTINCT key FROM ops WHERE id > ? AND id <= ?"
        " AND did = ? AND space = ? AND collection = ?",
        (after, head, did, space, collection),
    )
    return {row[0] for row in rows}, str(max(head, after))


def _change(row: Any, written: Written, *, live: bool) -> Change:
    op_id, did, space, collection, key, op, cid, text = row
    record: dict[str, Any] | None = None
    error: str | None = None
    if op != "delete" and written.take(did, space, collection, key, cid, text):
        record = parse(text)  # written and validated here a moment ago
    elif op != "delete":
        # Rows may have been written by another version or straight into the file:
        # validate on the way out too.
        try:
            record = parse(text)
            validate_record(collection, record)
        except InvalidRecord as e:
            error = str(e)
        except (TypeError, ValueError) as e:
            error = f"stored record is not JSON: {e}"
    return Change(did, space, collection, key, op, cid, record, error, str(op_id), live)


def parse_cursor(cursor: str | None) -> int:
    if cursor is None:
        return 0
    try:
        value = int(cursor)
    except (TypeError, ValueError):
        raise StoreError(f"invalid change-feed cursor {cursor!r}") from None
    if value < 0:
        raise StoreError(f"invalid change-feed cursor {cursor!r}")
    return value
