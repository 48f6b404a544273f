"""Hardened XRPC sessions of the local store (SPEC §12).

- :class:`LoginLimiter`: ``createSession`` failures counted per handle and, apart,
  per client address; 5 failures within 5 minutes on either counter lock that
  handle or address out (429 ``RateLimitExceeded`` with ``Retry-After``), the right
  password included, until the window has passed. In memory: a restart forgets
  the counters, and 2,000 guesses in 3 s become 5 per 5 minutes per handle.
- :class:`SessionStore`: one row per login. A refresh token works once: using it
  gives the next one; presenting an older one revokes the session (its newest
  refresh token too), since only a copy of the token can be behind that.
  ``deleteSession`` revokes. Each row keeps a fingerprint of the password it was
  made with: when the account's password changes, its sessions no longer verify.
  Rows live in SQLite beside the session secret (0600), shared by the daemons of
  one data directory; this process caches what it read for a second.
"""

from __future__ import annotations

import hashlib
import hmac
import sqlite3
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import anyio

from recordstore.files import private_file

__all__ = ["LOGIN_FAILURES", "LOGIN_WINDOW", "LoginLimiter", "SessionStore"]

LOGIN_FAILURES = 5
LOGIN_WINDOW = 300.0  # seconds
_MAX_TRACKED = 100_000  # counters kept at most (each a few failures' times)
CACHE_SECONDS = 1.0
T = TypeVar("T")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS sessions (
    sid TEXT PRIMARY KEY,
    did TEXT NOT NULL,
    refresh_jti TEXT NOT NULL,
    password_tag TEXT NOT NULL,
    revoked INTEGER NOT NULL DEFAULT 0,
    expires REAL NOT NULL
)
"""


class LoginLimiter:
    """Failed logins per key (``handle:...`` and ``addr:...``) in a sliding window."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._failures: dict[str, deque[float]] = {}

    def retry_after(self, *keys: str) -> float | None:
        """Seconds until the first of ``keys`` that is locked opens again, or None."""
        now = self._clock()
        waits = []
        for key in keys:
            times = self._recent(key, now)
            if times is not None and len(times) >= LOGIN_FAILURES:
                waits.append(times[-LOGIN_FAILURES] + LOGIN_WINDOW - now)
        return max(waits) if waits else None

    def failed(self, *keys: str) -> None:
        now = self._clock()
        if len(self._failures) >= _MAX_TRACKED:
            self._prune(now)
        for key in keys:
            times = self._failures.setdefault(key, deque(maxlen=LOGIN_FAILURES))
            times.append(now)

    def _recent(self, key: str, now: float) -> deque[float] | None:
        times = self._failures.get(key)
        if times is None:
            return None
        while times and times[0] <= now - LOGIN_WINDOW:
            times.popleft()
        if not times:
            del self._failures[key]
            return None
        return times

    def _prune(self, now: float) -> None:
        for key in list(self._failures):
            self._recent(key, now)
        while len(self._failures) >= _MAX_TRACKED:  # all recent: drop the oldest keys
            del self._failures[next(iter(self._failures))]


@dataclass(frozen=True, slots=True)
class _Row:
    did: str
    refresh_jti: str
    password_tag: str
    revoked: bool
    expires: float


def _session_row(db: sqlite3.Connection, sid: str) -> _Row | None:
    found = db.execute(
        "SELECT did, refresh_jti, password_tag, revoked, expires FROM sessions WHERE sid = ?",
        (sid,),
    ).fetchone()
    return None if found is None else _Row(found[0], found[1], found[2], bool(found[3]), found[4])


class SessionStore:
    """The sessions table; every method is safe to call from the event loop."""

    def __init__(self, path: Path | None, secret: bytes, ttl: float) -> None:
        self._path = path
        self._secret = secret
        self._ttl = ttl
        self._db: sqlite3.Connection | None = None
        self._lock = threading.Lock()
        self._cache: dict[str, tuple[float, _Row | None]] = {}

    def password_tag(self, did: str, password: str | None) -> str:
        """A keyed fingerprint of the account's password (the password never stored)."""
        msg = f"{did}\0{password or ''}".encode()
        return hmac.new(self._secret, b"password:" + msg, hashlib.sha256).hexdigest()[:32]

    # -- the operations ----------------------------------------------------------------

    async def create(self, did: str, password: str | None) -> tuple[str, str]:
        """A new session: (sid, its first refresh token id)."""
        sid, jti = uuid.uuid4().hex, uuid.uuid4().hex
        tag = self.password_tag(did, password)
        now = time.time()

        def run(db: sqlite3.Connection) -> None:
            db.execute("DELETE FROM sessions WHERE expires < ?", (now,))
            db.execute(
                "INSERT INTO sessions (sid, did, refresh_jti, password_tag, expires)"
                " VALUES (?, ?, ?, ?, ?)",
                (sid, did, jti, tag, now + self._ttl),
            )

        await self._run(run)
        return sid, jti

    async def rotate(self, sid: str, jti: str, password: str | None) -> str | None:
        """The next refresh token id, or None (and the session revoked on reuse)."""
        new = uuid.uuid4().hex

        def run(db: sqlite3.Connection) -> str | None:
            row = _session_row(db, sid)
            if row is None or row.revoked or row.expires < time.time():
                return None
            if not hmac.compare_digest(row.password_tag, self.password_tag(row.did, password)):
                return None
            if not hmac.compare_digest(row.refresh_jti, jti):
                # An old refresh token: a copy is in use. End the session for both.
                db.execute("UPDATE sessions SET revoked = 1 WHERE sid = ?", (sid,))
                return None
            # The swap on the old id: of two concurrent refreshes, one wins.
            done = db.execute(
                "UPDATE sessions SET refresh_jti = ? WHERE sid = ? AND refresh_jti = ?",
                (new, sid, jti),
            ).rowcount
            return new if done else None

        self._cache.pop(sid, None)
        return await self._run(run)

    async def revoke(self, sid: str) -> None:
        self._cache.pop(sid, None)
        await self._run(
            lambda db: db.execute("UPDATE sessions SET revoked = 1 WHERE sid = ?", (sid,))
        )

    async def valid(self, sid: str, did: str, password: str | None) -> bool:
        """Whether an access token of session ``sid`` still stands."""
        now = time.monotonic()
        cached = self._cache.get(sid)
        if cached is not None and now - cached[0] < CACHE_SECONDS:
            row = cached[1]
        else:
            row = await self._run(lambda db: _session_row(db, sid))
            if len(self._cache) > 10_000:
                self._cache.clear()
            self._cache[sid] = (now, row)
        if row is None or row.revoked or row.did != did or row.expires < time.time():
            return False
        return hmac.compare_digest(row.password_tag, self.password_tag(did, password))

    # -- the database --------------------------------------------------------------------

    def _connect(self) -> sqlite3.Connection:
        if self._db is None:
            if self._path is None:
                target = ":memory:"  # no place to keep them: sessions end with the process
            else:
                self._path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
                private_file(self._path)
                target = str(self._path)
            db = sqlite3.connect(target, isolation_level=None, check_same_thread=False)
            db.execute("PRAGMA busy_timeout = 5000")
            if self._path is not None:
                db.execute("PRAGMA journal_mode = WAL")
            db.execute(_SCHEMA)
            self._db = db
        return self._db

    async def _run(self, op: Callable[[sqlite3.Connection], T]) -> T:
        def call() -> T:
            with self._lock:
                return op(self._connect())

        return await anyio.to_thread.run_sync(call)

    def close(self) -> None:
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None
