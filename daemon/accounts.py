"""The accounts turnd acts for, and the first start's generated one (``credentials.json``)."""

from __future__ import annotations

import json
import os
import secrets
from dataclasses import dataclass, field
from pathlib import Path

from daemon.config_file import ConfigError
from daemon.dids import account_did, legacy_did
from turns.limits import Quota

# Where the first start keeps the generated account (0600), inside the local data dir.
CREDENTIALS_FILE = "credentials.json"


@dataclass(frozen=True, slots=True)
class Account:
    """An account turnd acts for. ``password``/``token`` are secrets: never log them."""

    name: str
    handle: str
    did: str | None
    password: str | None = field(default=None, repr=False)
    token: str | None = field(default=None, repr=False)
    # The names of the variables holding the secrets (shown in messages, never the values).
    password_env: str | None = None
    token_env: str | None = None
    tools: tuple[str, ...] = ()
    max_storage_bytes: int | None = None  # [accounts.X] maxStorageBytes
    quota: Quota | None = None


def local_did(handle: str) -> str:
    """The DID older turnds derived from the handle (data dirs they made keep it).

    New local accounts get a random DID kept in the data directory
    (:func:`daemon.dids.account_did`); tests pin this one with ``[accounts.X] did``.
    """
    return legacy_did(handle)


def read_credentials(data_dir: Path) -> Account | None:
    """The first-start account kept in ``<data>/credentials.json``, if it was made."""
    path = data_dir / CREDENTIALS_FILE
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as err:
        raise ConfigError(f"store.path: cannot read {path}: {err}") from None
    try:
        return Account(
            name=raw["name"],
            handle=raw["handle"],
            did=raw["did"],
            password=raw["password"],
            token=raw["token"],
        )
    except (KeyError, TypeError):
        raise ConfigError(f"store.path: {path} is not a turnd credentials file") from None


def ensure_credentials(
    data_dir: Path, name: str = "me", handle: str = "me.test"
) -> tuple[Account, bool]:
    """The first-start account, created (0600, never overwritten) when missing.

    Returns (account, created); the caller prints the secrets only when ``created``.
    """
    existing = read_credentials(data_dir)
    if existing is not None:
        return existing, False
    data_dir.mkdir(parents=True, exist_ok=True)
    account = Account(
        name=name,
        handle=handle,
        did=account_did(data_dir, handle),
        password=secrets.token_urlsafe(18),
        token=secrets.token_urlsafe(32),
    )
    body = {
        "name": account.name,
        "handle": account.handle,
        "did": account.did,
        "password": account.password,
        "token": account.token,
    }
    path = data_dir / CREDENTIALS_FILE
    # O_EXCL: two processes starting at once must not each write (and print) an account.
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        again = read_credentials(data_dir)
        assert again is not None
        return again, False
    with os.fdopen(fd, "w") as fh:
        json.dump(body, fh, indent=2)
        fh.write("\n")
    return account, True
