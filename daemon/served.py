"""What the HTTP side reads of the running daemon, as a Protocol.

:class:`daemon.service.Service` is the one implementation. The routes are typed
against this instead of importing ``daemon.service``, which builds the app (that
import would be a circle). Everything here is present once the app exists: the
service builds it after the store, the state file, the tool catalog and the
engine are open.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from prometheus_client import CollectorRegistry

from daemon.accounts import Account
from daemon.config import Config
from daemon.events import EventHub
from daemon.sessions import LoginLimiter
from daemon.uploads import UploadGuard
from plugins.sources import ToolCatalog
from recordstore import RecordStore
from turns.engine import TurnEngine
from turns.state import StateDB

if TYPE_CHECKING:
    # Only with [cluster] is the package imported (turns.cluster's promise).
    from turns.cluster import Cluster

__all__ = ["Served"]


class Served(Protocol):
    config: Config
    accounts: list[Account]
    store: RecordStore
    state: StateDB
    engine: TurnEngine
    tools: ToolCatalog  # SPEC §14
    cluster: Cluster | None  # with [cluster] (SPEC §18)
    registry: CollectorRegistry  # /metrics
    events: EventHub  # the page's live record events
    uploads: UploadGuard  # SPEC §12, shared by /api/attachments and uploadBlob
    login_limiter: LoginLimiter
    feed_up: bool  # /healthz's changeFeed
    port: int | None  # the port bound (differs from the config's with port 0)

    def account_for_token(self, token: str | None) -> Account | None: ...

    def owners(self) -> dict[str, str]:
        """DID -> account name: the accounts whose messages turnd answers."""
        ...

    def account_for_login(self, identifier: str, password: str) -> Account | None: ...
