"""The engine's parts, from the config: plugins, telemetry, accounting, the accounts' tools.

Each failure here is a config error naming its key, raised before anything starts.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import anyio

from daemon.accounts import Account
from daemon.config import Config
from daemon.config_file import ConfigError
from plugins import PluginSet
from plugins.loader import load_plugins as _load_plugins
from turns.accounting import Accounting
from turns.limits import Quota
from turns.quota import LocalQuotaCounter, QuotaCounter
from turns.state import StateDB
from turns.telemetry import Telemetry, open_telemetry

if TYPE_CHECKING:
    # Only with [cluster] is the package imported (turns.cluster's promise).
    from turns.cluster import Cluster

__all__ = [
    "UserTools",
    "accounting",
    "derivatives_dir",
    "load_plugins",
    "start_telemetry",
    "stop_telemetry",
]


class UserTools(Mapping[str, list[str]]):
    """DID -> ``[accounts.X] tools``, read live: a pds account's DID may arrive late."""

    def __init__(self, accounts: Callable[[], Sequence[Account]]) -> None:
        self._accounts = accounts

    def _table(self) -> dict[str, list[str]]:
        return {a.did: list(a.tools) for a in self._accounts() if a.did and a.tools}

    def __getitem__(self, did: str) -> list[str]:
        return self._table()[did]

    def __iter__(self) -> Iterator[str]:
        return iter(self._table())

    def __len__(self) -> int:
        return len(self._table())


def derivatives_dir(config: Config) -> Path:
    """Image derivatives (turns.attachments): in the data directory, by CID."""
    base = config.store_path if config.store_kind == "local" else config.state_path.parent
    return base / "derivatives"


def accounting(
    config: Config,
    accounts: Callable[[], Sequence[Account]],
    state: StateDB,
    telemetry: Telemetry,
    cluster: Cluster | None,
) -> Accounting:
    """SPEC §16 from the config: prices, fallbacks, quotas by DID (read live), traces."""

    def quota(did: str) -> Quota | None:
        for account in accounts():
            if account.did == did:
                return account.quota
        return None

    counter: QuotaCounter | None = None
    if cluster is not None:
        # SPEC §18: quotas shared by the instances through Redis.
        counter = cluster.quota_counter(LocalQuotaCounter(state))
    return Accounting(
        prices=config.prices,
        fallbacks=config.fallbacks,
        quotas=quota,
        telemetry=telemetry,
        counter=counter,
    )


def start_telemetry(config: Config) -> Telemetry:
    try:
        return open_telemetry(config.otel)
    except RuntimeError as err:  # a missing [otel] extra
        raise ConfigError(str(err)) from None


async def stop_telemetry(telemetry: Telemetry) -> None:
    """Flush the last spans off the event loop; a dead endpoint delays the exit by at most 5 s."""
    if not telemetry.enabled:
        return
    with anyio.CancelScope(shield=True), anyio.move_on_after(6):
        await anyio.to_thread.run_sync(telemetry.shutdown, abandon_on_cancel=True)


def load_plugins(names: list[str]) -> PluginSet:
    try:
        return _load_plugins(names)
    except Exception as err:  # noqa: BLE001 - whatever a plugin raises, name the key
        raise ConfigError(f"plugins.enabled: {str(err).splitlines()[0]}") from None
