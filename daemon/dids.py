"""The DIDs of local accounts: random, made once per data directory and kept there.

Two installs must never share a DID (a DID names an account everywhere, and a record's
``at://`` URI carries it), so a local account's DID is drawn at random when the account
is first seen and kept in ``<data>/dids.json``, keyed by handle. A data directory made by
an older turnd, whose DIDs were derived from the handle (:func:`legacy_did`), keeps
them: a handle whose legacy DID already owns records or spaces there is given that one.
"""

from __future__ import annotations

import base64
import fcntl
import hashlib
import json
import os
import secrets
import sqlite3
from pathlib import Path

from recordstore.files import private_dir

__all__ = ["DIDS_FILE", "account_did", "legacy_did", "random_did"]

DIDS_FILE = "dids.json"
_STORE_DB = "store.sqlite3"  # recordstore.local.DB_NAME (not imported: no aiosqlite here)


def legacy_did(handle: str) -> str:
    """The DID older turnds derived from the handle alone (kept for their data dirs)."""
    digest = hashlib.sha256(handle.encode()).digest()
    return "did:plc:" + base64.b32encode(digest).decode().lower()[:24]


def random_did() -> str:
    """A fresh did:plc-shaped DID: 24 random base32 characters (120 bits)."""
    return "did:plc:" + base64.b32encode(secrets.token_bytes(15)).decode().lower()


def account_did(data_dir: Path, handle: str) -> str:
    """The DID of local account ``handle`` in ``data_dir``, made (and kept) on first use.

    Safe between processes: the file is read and written under an exclusive lock.
    """
    private_dir(data_dir)
    key = handle.lower()
    path = data_dir / DIDS_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    with os.fdopen(fd, "r+", encoding="utf-8") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)  # released when the file is closed
        text = fh.read()
        try:
            known = json.loads(text) if text.strip() else {}
        except ValueError:
            raise ValueError(f"{path}: not a turnd DID file") from None
        if not isinstance(known, dict):
            raise ValueError(f"{path}: not a turnd DID file")
        did = known.get(key)
        if isinstance(did, str):
            return did
        did = legacy_did(handle) if _has_data(data_dir / _STORE_DB, legacy_did(handle)) else None
        did = did or random_did()
        known[key] = did
        fh.seek(0)
        fh.truncate()
        json.dump(known, fh, indent=2, sort_keys=True)
        fh.write("\n")
        fh.flush()
        os.fsync(fh.fileno())
        return did


def _has_data(db_path: Path, did: str) -> bool:
    """Whether a store made by an older turnd holds anything under ``did``."""
    if not db_path.is_file():
        return False
    try:
        db = sqlite3.connect(f"{db_path.as_uri()}?mode=ro", uri=True, timeout=10)
    except sqlite3.Error:
        return False
    try:
        rows = db.execute(
            "SELECT 1 FROM spaces WHERE did = ? UNION ALL SELECT 1 FROM records WHERE did = ?"
            " LIMIT 1",
            (did, did),
        ).fetchall()
        return bool(rows)
    except sqlite3.Error:
        return False  # not a turnd store (yet): the store's own open will say so
    finally:
        db.close()
