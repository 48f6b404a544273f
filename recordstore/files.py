"""Private files (SPEC §12): turnd's data directory is 0700, its databases 0600.

Another user on the machine must not read the records, the claims or the
credentials. SQLite creates a database with the process's umask (often 0644) and
gives its -wal and -shm files the database's mode, so the database file is made
(or tightened) before SQLite opens it.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["private_dir", "private_file"]

SQLITE_SIDE_FILES = ("-wal", "-shm", "-journal")


def private_dir(path: Path) -> None:
    """Create ``path`` (and its parents) if needed, and make ``path`` itself 0700."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    if path.stat().st_mode & 0o077:
        path.chmod(0o700)  # made by an older turnd or by hand: tightened, never loosened


def private_file(path: Path) -> None:
    """Create ``path`` empty with mode 0600 if missing; tighten it and its SQLite side
    files when they exist."""
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except FileExistsError:
        pass
    for candidate in (path, *(path.with_name(path.name + s) for s in SQLITE_SIDE_FILES)):
        try:
            if candidate.stat().st_mode & 0o077:
                candidate.chmod(0o600)
        except FileNotFoundError:
            continue
