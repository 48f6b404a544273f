"""turnd's own state file: requested and claimed turns, sync cursors, instance id.

It holds references only (DIDs, space keys, record keys, times), never content.
Several daemons may serve one store, each with its own state file.
"""

from __future__ import annotations

import logging
import os
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiosqlite
import anyio

from recordstore.files import private_file
from recordstore.sqlite_quick import Quick

log = logging.getLogger("turnd.turns")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS turn_request (
    did TEXT NOT NULL, skey TEXT NOT NULL, user_key TEXT NOT NULL, attempt INTEGER NOT NULL,
    requested_at REAL NOT NULL,
    PRIMARY KEY (did, skey, user_key, attempt)
);
CREATE TABLE IF NOT EXISTS turn_claim (
    did TEXT NOT NULL, skey TEXT NOT NULL, reply_key TEXT NOT NULL,
    instance TEXT NOT NULL, claimed_at REAL NOT NULL,
    PRIMARY KEY (did, skey, reply_key)
);
CREATE TABLE IF NOT EXISTS cursor (name TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS usage_step (
    id INTEGER PRIMARY KEY,
    did TEXT NOT NULL, skey TEXT NOT NULL, reply_key TEXT NOT NULL,
    kind TEXT NOT NULL, step INTEGER NOT NULL, provider TEXT NOT NULL, model TEXT NOT NULL,
    input_tokens INTEGER NOT NULL, output_tokens INTEGER NOT NULL,
    reasoning_tokens INTEGER NOT NULL, cached_tokens INTEGER NOT NULL,
    cost REAL, started_at REAL NOT NULL, duration_ms REAL NOT NULL, outcome TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS usage_step_time ON usage_step (did, started_at);
CREATE INDEX IF NOT EXISTS usage_step_reply ON usage_step (did, skey, reply_key);
CREATE TABLE IF NOT EXISTS reply_timing (
    did TEXT NOT NULL, skey TEXT NOT NULL, reply_key TEXT NOT NULL,
    latency_ms REAL NOT NULL, ttft_ms REAL,
    PRIMARY KEY (did, skey, reply_key)
);
"""


@dataclass(frozen=True, slots=True)
class TurnRequest:
    did: str
    skey: str
    user_key: str
    attempt: int
    requested_at: float


@dataclass(frozen=True, slots=True)
class UsageRow:
    """One model call (SPEC §16): numbers and references, never content."""

    did: str
    skey: str
    reply_key: str
    kind: str  # "turn", or "title" / "summary" for the calls made beside a turn
    step: int
    provider: str
    model: str
    input_tokens: int
    output_tokens: int
    reasoning_tokens: int
    cached_tokens: int
    cost: float | None  # USD; None when neither a price nor a reported cost is known
    started_at: float  # unix seconds
    duration_ms: float
    outcome: str  # ok, error, fallback (failed before its first token), cancelled


@dataclass(frozen=True, slots=True)
class ReplyTiming:
    """A finished turn's ``latencyMs`` / ``ttftMs`` (its final ``status`` event's), kept so
    a reply loaded from history shows the same numbers as the live one."""

    did: str
    skey: str
    reply_key: str
    latency_ms: float
    ttft_ms: float | None


@dataclass(frozen=True, slots=True)
class ReplyUsage:
    """One reply's steps summed (``kind = "turn"`` rows), with its timing when kept.

    ``steps`` counts model calls as ``GET /api/usage`` does: a step tried on two models
    (a fallback) once."""

    reply_key: str
    steps: int
    input_tokens: int
    output_tokens: int
    reasoning_tokens: int
    cached_tokens: int
    cost: float | None  # None when no step had a known cost
    duration_ms: float  # the model calls' time, summed
    latency_ms: float | None
    ttft_ms: float | None


@dataclass(frozen=True, slots=True)
class UsageSum:
    key: str
    turns: int
    steps: int
    input_tokens: int
    output_tokens: int
    reasoning_tokens: int
    cached_tokens: int
    cost: float


_ADD_CLAIM = "INSERT OR REPLACE INTO turn_claim VALUES (?, ?, ?, ?, ?)"
_DROP_CLAIM = "DELETE FROM turn_claim WHERE did=? AND skey=? AND reply_key=?"

_GROUPS = {
    "day": "strftime('%Y-%m-%d', started_at, 'unixepoch')",
    "model": "provider || ':' || model",
    "conversation": "skey",
    "total": "'total'",  # one row of everything (turnd usage)
}


@dataclass(frozen=True, slots=True)
class TurnClaim:
    did: str
    skey: str
    reply_key: str


class StateDB:
    def __init__(
        self, db: aiosqlite.Connection, instance_id: str, path: Path | None = None
    ) -> None:
        self._db = db
        self._lock = anyio.Lock()
        self.instance_id = instance_id
        self._path = path
        self._inode = _inode(path) if path is not None else None
        # A turn's rows (its claim, its usage) are written on the loop's thread when
        # SQLite can do it at once (recordstore.sqlite_quick): the claim row is on the
        # way to the model call.
        self._quick = Quick(path) if path is not None else None
        self._replacing = False

    @classmethod
    async def open(cls, path: str | Path) -> StateDB:
        path = Path(path)
        db = await _connect(path)
        try:
            await db.executescript(_SCHEMA)
        except Exception as exc:
            await db.close()
            raise ValueError(f"{path}: not a turnd state file ({exc})") from None
        row = await (await db.execute("SELECT value FROM meta WHERE name='instance'")).fetchone()
        if row is None:
            instance = uuid.uuid4().hex
            await db.execute("INSERT INTO meta VALUES ('instance', ?)", (instance,))
        else:
            instance = row[0]
        return cls(db, instance, path)

    async def ensure_file(self) -> bool:
        """Recreate the state file if it was deleted (or replaced) while running.

        True when it had to. The open connection still reads the old file's inode,
        so everything it held — claims, requests, cursors, the instance id — is
        copied to a new file at the same path, which the connection then uses.
        """
        if self._path is None or _inode(self._path) == self._inode:
            return False
        log.error(
            "the state file %s disappeared while running; recreating it from memory", self._path
        )
        async with self._lock:
            self._replacing = True
            try:
                await self._replace(self._path)
            finally:
                self._replacing = False
        return True

    async def _replace(self, path: Path) -> None:
        if _inode(path) is None:
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            await self._db.execute("VACUUM INTO ?", (str(path),))
        old, self._db = self._db, await _connect(path)
        await old.close()
        if self._quick is not None:
            self._quick.close()
            self._quick = Quick(path)
        self._inode = _inode(path)

    async def aclose(self) -> None:
        with anyio.CancelScope(shield=True):  # as the store's (recordstore.local_db)
            if self._quick is not None:
                self._quick.close()
            await self._db.close()

    async def _run(self, sql: str, args: Any = (), *, many: bool = False) -> int:
        """One write statement (``many``: for each of ``args``); the rows it changed.

        On the loop's thread when SQLite can take it at once (recordstore.sqlite_quick),
        but not while ``ensure_file`` replaces the file. Not "while the lock is held":
        under many turns one write on the worker thread would hold it while the next
        arrived, and every write after it would go through the thread too.
        """
        await anyio.lowlevel.checkpoint_if_cancelled()
        if self._quick is not None and not self._replacing:
            changed = self._quick.write(sql, args, many=many)
            if changed is not None:
                return changed
        async with self._lock:
            run = self._db.executemany if many else self._db.execute
            cursor = await run(sql, args)
            return cursor.rowcount

    async def _run_all(self, statements: Sequence[tuple[str, Any, bool]]) -> None:
        """``(sql, args, many)`` statements in one transaction (one commit) on the loop's
        thread when SQLite can take them at once; else each on its own, as :meth:`_run`
        runs one."""
        await anyio.lowlevel.checkpoint_if_cancelled()
        if self._quick is not None and not self._replacing:
            if self._quick.write_all(statements) is not None:
                return
        # Through the worker thread each on its own, as they were before: a transaction
        # held open across hops would make every write on the loop's thread busy
        # meanwhile, and send it here too.
        for sql, args, many in statements:
            async with self._lock:
                await (self._db.executemany if many else self._db.execute)(sql, args)

    async def add_request(self, did: str, skey: str, user_key: str, attempt: int) -> bool:
        """Record a requested turn; False when the same request is already recorded."""
        n = await self._run(
            "INSERT OR IGNORE INTO turn_request VALUES (?, ?, ?, ?, ?)",
            (did, skey, user_key, attempt, time.time()),
        )
        return n == 1

    async def drop_request(self, did: str, skey: str, user_key: str, attempt: int) -> None:
        await self._run(
            "DELETE FROM turn_request WHERE did=? AND skey=? AND user_key=? AND attempt=?",
            (did, skey, user_key, attempt),
        )

    async def requests(self) -> list[TurnRequest]:
        async with self._lock:
            rows = await self._db.execute_fetchall("SELECT * FROM turn_request ORDER BY requested_at")
        return [TurnRequest(*row) for row in rows]

    async def add_claim(self, did: str, skey: str, reply_key: str) -> None:
        await self._run(_ADD_CLAIM, (did, skey, reply_key, self.instance_id, time.time()))

    def add_claim_at_once(self, did: str, skey: str, reply_key: str) -> bool:
        """:meth:`add_claim` when SQLite can take it on the loop's thread now; False (and
        nothing written) when it would have to go through the worker thread."""
        if self._quick is None or self._replacing:
            return False
        changed = self._quick.write(_ADD_CLAIM, (did, skey, reply_key, self.instance_id, time.time()))
        return changed is not None

    async def drop_claim(self, did: str, skey: str, reply_key: str) -> None:
        await self._run(_DROP_CLAIM, (did, skey, reply_key))

    async def claims(self) -> list[TurnClaim]:
        async with self._lock:
            rows = await self._db.execute_fetchall(
                "SELECT did, skey, reply_key FROM turn_claim WHERE instance=?", (self.instance_id,)
            )
        return [TurnClaim(*row) for row in rows]

    async def get_cursor(self, name: str) -> str | None:
        async with self._lock:
            rows = await self._db.execute_fetchall("SELECT value FROM cursor WHERE name=?", (name,))
        return rows[0][0] if rows else None

    async def set_cursor(self, name: str, value: str) -> None:
        await self._run("INSERT OR REPLACE INTO cursor VALUES (?, ?)", (name, value))

    # -- usage (SPEC §16) -------------------------------------------------------------

    async def add_usage(
        self,
        rows: Sequence[UsageRow],
        timing: ReplyTiming | None = None,
        release: tuple[str, str, str] | None = None,
    ) -> None:
        """A turn's rows and its timing (written once its status is out), and with
        ``release`` (did, skey, reply key) the turn's claim row dropped: one commit for
        the turn's end where there were three (:meth:`_run_all`)."""
        values = [
            (
                row.did, row.skey, row.reply_key, row.kind, row.step, row.provider, row.model,
                row.input_tokens, row.output_tokens, row.reasoning_tokens, row.cached_tokens,
                row.cost, row.started_at, row.duration_ms, row.outcome,
            )
            for row in rows
        ]
        statements: list[tuple[str, Any, bool]] = []
        if values:
            statements.append((
                "INSERT INTO usage_step (did, skey, reply_key, kind, step, provider, model,"
                " input_tokens, output_tokens, reasoning_tokens, cached_tokens, cost, started_at,"
                " duration_ms, outcome) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                values,
                True,
            ))
        if timing is not None:
            statements.append((
                "INSERT OR REPLACE INTO reply_timing VALUES (?, ?, ?, ?, ?)",
                (timing.did, timing.skey, timing.reply_key, timing.latency_ms, timing.ttft_ms),
                False,
            ))
        if release is not None:
            statements.append((_DROP_CLAIM, release, False))
        if statements:
            await self._run_all(statements)

    async def reply_usage(self, did: str, skey: str) -> list[ReplyUsage]:
        """Each reply of one conversation: its steps summed, and its timing when kept."""
        async with self._lock:
            sums = await self._db.execute_fetchall(
                "SELECT reply_key, COUNT(DISTINCT step), SUM(input_tokens), SUM(output_tokens),"
                " SUM(reasoning_tokens), SUM(cached_tokens), SUM(cost), SUM(duration_ms)"
                " FROM usage_step WHERE did=? AND skey=? AND kind='turn' GROUP BY reply_key",
                (did, skey),
            )
            times = await self._db.execute_fetchall(
                "SELECT reply_key, latency_ms, ttft_ms FROM reply_timing WHERE did=? AND skey=?",
                (did, skey),
            )
        timing = {key: (latency, ttft) for key, latency, ttft in times}
        out = []
        for key, steps, tin, tout, treason, tcached, cost, duration in sums:
            latency, ttft = timing.pop(key, (None, None))
            out.append(
                ReplyUsage(key, steps, tin, tout, treason, tcached, cost, duration, latency, ttft)
            )
        # A turn that failed before any model call (a quota, say) has a timing and no step.
        out += [
            ReplyUsage(key, 0, 0, 0, 0, 0, None, 0.0, latency, ttft)
            for key, (latency, ttft) in timing.items()
        ]
        return out

    async def usage_rows(self, did: str) -> list[UsageRow]:
        """Every usage row of an account, oldest first (tests, exports)."""
        async with self._lock:
            rows = await self._db.execute_fetchall(
                "SELECT did, skey, reply_key, kind, step, provider, model, input_tokens,"
                " output_tokens, reasoning_tokens, cached_tokens, cost, started_at, duration_ms,"
                " outcome FROM usage_step WHERE did=? ORDER BY id",
                (did,),
            )
        return [UsageRow(*row) for row in rows]

    async def usage_sums(self, did: str, start: float, end: float, group: str) -> list[UsageSum]:
        """Sums of ``did``'s rows with ``start <= started_at < end``, by day, model or conversation."""
        key = _GROUPS[group]
        async with self._lock:
            rows = await self._db.execute_fetchall(
                f"SELECT {key} AS k,"
                " COUNT(DISTINCT CASE WHEN kind = 'turn' THEN skey || ' ' || reply_key END),"
                " COUNT(DISTINCT skey || ' ' || reply_key || ' ' || kind || ' ' || step),"
                " SUM(input_tokens), SUM(output_tokens), SUM(reasoning_tokens),"
                " SUM(cached_tokens), TOTAL(cost)"
                " FROM usage_step WHERE did=? AND started_at >= ? AND started_at < ?"
                " GROUP BY k ORDER BY k",
                (did, start, end),
            )
        return [UsageSum(*row) for row in rows]

    async def usage_totals(
        self, did: str, day_start: float, month_start: float, end: float
    ) -> tuple[int, float]:
        """(input + output tokens since ``day_start``, cost since ``month_start``), before ``end``.

        One query: the quota check runs between the claim and the model call.
        """
        async with self._lock:
            rows = await self._db.execute_fetchall(
                "SELECT TOTAL(CASE WHEN started_at >= ? THEN input_tokens + output_tokens END),"
                " TOTAL(cost) FROM usage_step WHERE did=? AND started_at >= ? AND started_at < ?",
                (day_start, did, min(day_start, month_start), end),
            )
        tokens, cost = rows[0]
        return int(tokens), float(cost)


async def _connect(path: Path) -> aiosqlite.Connection:
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    private_file(path)  # SPEC §12: claims and cursors are nobody else's to read
    db = await aiosqlite.connect(path, isolation_level=None)
    try:
        await db.execute("PRAGMA journal_mode=WAL")
        await db.execute("PRAGMA synchronous=NORMAL")
        await db.execute("PRAGMA busy_timeout=5000")
    except Exception as exc:
        await db.close()
        raise ValueError(f"{path}: not a turnd state file ({exc})") from None
    return db


def _inode(path: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return st.st_dev, st.st_ino
