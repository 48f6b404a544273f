"""Pages of the local store's records: one space's, the whole repo's, newest first.

A page is read with one row more than asked, which tells whether there is a next one.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from recordstore import Record
from recordstore.abilities import NewestQuery, RepoPage
from recordstore.keys import repo_rkey
from recordstore.local_db import COLLECTION_IS, NEWEST_INDEXES, RECORD_COLS, LocalDb
from recordstore.stored_json import parse

__all__ = ["newest", "record_of", "repo_page", "space_cids", "space_page", "space_records"]

# The classic-repo rkey of a row (recordstore.keys.repo_rkey), in SQL.
_RKEY = "(space || ':' || key)"
_FIELD = re.compile(r"[A-Za-z][A-Za-z0-9]*")
_CIDS_PAGE = 1000  # keys and CIDs a read: a long space is not read in one go on the loop
_KEYS_A_READ = 500  # keys bound in one ``IN (...)`` (SQLite allows 32,766 variables)


def record_of(row: Any) -> Record:
    """The Record of a row of ``SELECT {RECORD_COLS}``."""
    did, space, collection, key, cid, value = row
    return Record(did, space, collection, key, cid, parse(value))


async def space_page(
    db: LocalDb,
    did: str,
    space: str,
    collection: str,
    cursor: str | None,
    limit: int,
    reverse: bool,
) -> tuple[list[Record], str | None]:
    """One space's records of ``collection`` in key order (checked arguments)."""
    where = f"did = ? AND space = ? AND {COLLECTION_IS}"
    records, more = await _page(
        db, where, [did, space, collection], "key", cursor, limit, reverse, quick=True
    )
    return records, (records[-1].key if more else None)


async def space_cids(db: LocalDb, did: str, space: str, collection: str) -> list[tuple[str, str]]:
    """recordstore.abilities.SpaceChanges: one space's keys and CIDs, along the primary key."""
    out: list[tuple[str, str]] = []
    sql = (
        f"SELECT key, cid FROM records WHERE did = ? AND space = ? AND {COLLECTION_IS}"
        f" AND key > ? ORDER BY key LIMIT {_CIDS_PAGE}"
    )
    after = ""
    while True:
        rows = await db.read_short(sql, (did, space, collection, after))
        out.extend((key, cid) for key, cid in rows)
        if len(rows) < _CIDS_PAGE:
            return out
        after = rows[-1][0]


async def space_records(
    db: LocalDb, did: str, space: str, collection: str, keys: Sequence[str]
) -> list[tuple[Record, int]]:
    """recordstore.abilities.SpaceChanges: the records at ``keys`` (sorted: then in key order),
    each with its text's length."""
    out: list[tuple[Record, int]] = []
    for at in range(0, len(keys), _KEYS_A_READ):
        chunk = list(keys[at : at + _KEYS_A_READ])
        marks = ", ".join("?" * len(chunk))
        sql = (
            f"SELECT {RECORD_COLS} FROM records WHERE did = ? AND space = ? AND {COLLECTION_IS}"
            f" AND key IN ({marks})"
        )
        rows = await db.read_short(sql + " ORDER BY key", [did, space, collection, *chunk])
        out.extend((record_of(row), len(row[5])) for row in rows)
    return out


async def repo_page(db: LocalDb, did: str, page: RepoPage) -> tuple[list[Record], str | None]:
    """The whole repo's records of a collection in rkey order (checked arguments)."""
    where = f"did = ? AND {COLLECTION_IS}"
    params: list[Any] = [did, page.collection]
    descending = not page.reverse
    records, more = await _page(db, where, params, _RKEY, page.cursor, page.limit, descending)
    last = records[-1] if more else None
    return records, (repo_rkey(last.space, last.key) if last else None)


async def _page(
    db: LocalDb,
    where: str,
    params: list[Any],
    order_by: str,
    cursor: str | None,
    limit: int,
    descending: bool,
    *,
    quick: bool = False,
) -> tuple[list[Record], bool]:
    """Up to ``limit`` records after ``cursor`` in ``order_by`` order, and whether more follow.

    ``quick``: the page walks the primary key (one space's records), so it is read on the
    loop's thread when SQLite can answer at once (``LocalDb.read_short``): a turn reads its
    conversation this way, and the hop to the reader's thread cost more than the read. The
    rows' JSON is parsed on the loop's thread either way."""
    after, order = ("<", "DESC") if descending else (">", "ASC")
    sql = f"SELECT {RECORD_COLS} FROM records WHERE {where}"
    if cursor is not None:
        sql += f" AND {order_by} {after} ?"
        params = [*params, cursor]
    sql += f" ORDER BY {order_by} {order} LIMIT ?"
    rows = await (db.read_short if quick else db.read)(sql, [*params, limit + 1])
    return [record_of(r) for r in rows[:limit]], len(rows) > limit


async def newest(db: LocalDb, did: str, query: NewestQuery) -> list[tuple[str | None, ...]]:
    """recordstore.abilities.NewestFirst: one query, sorted and cut in SQLite."""
    q = query
    for name in (*q.fields, q.order, *(q.match[:1] if q.match else ())):
        if not _FIELD.fullmatch(name):
            raise ValueError(f"not a top-level field name: {name!r}")
    columns = "".join(f", json_extract(value, '$.{name}')" for name in q.fields)
    if (q.collection, q.order) in NEWEST_INDEXES:
        # Word for word the index's expression and condition, so SQLite walks the
        # index and stops after `limit` rows instead of sorting the collection.
        ordering = f"json_extract(value, '$.{q.order}')"
        sql = (
            f"SELECT key{columns} FROM records WHERE did = ? AND space = ?"
            f" AND collection = '{q.collection}'"
        )
        params: list[Any] = [did, q.space]
    else:
        ordering = f"coalesce(json_extract(value, '$.{q.order}'), '')"
        sql = f"SELECT key{columns} FROM records WHERE did = ? AND space = ? AND {COLLECTION_IS}"
        params = [did, q.space, q.collection]
    if q.before is not None:
        sql += f" AND ({ordering}, key) < (?, ?)"
        params += list(q.before)
    if q.match is not None:
        # Python's casefold, so a search matches "É" with "é" as the page shows them.
        await db.reader_function("turnd_casefold", _casefold)
        sql += f" AND instr(turnd_casefold(json_extract(value, '$.{q.match[0]}')), ?) > 0"
        params.append(q.match[1].casefold())
    sql += f" ORDER BY {ordering} DESC, key DESC LIMIT ?"
    params.append(q.limit)
    rows = await db.read(sql, params)
    return [tuple(v if isinstance(v, str) else None for v in row) for row in rows]


def _casefold(value: Any) -> str | None:
    return value.casefold() if isinstance(value, str) else None
