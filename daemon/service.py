"""The daemon's lifecycle: store, state, engine, change feed, HTTP, signals, drain.

Everything runs in one anyio task tree, so leaving :meth:`Service.run` means every
task has ended. Start-up order: bind the HTTP socket (a taken port fails before any
file is touched), open the store and the state file, build the engine, create the
local accounts' settings spaces, ``engine.recover()``, then the change feed and
uvicorn. Stop order on SIGTERM/SIGINT: stop reading the feed (its cursor is never
moved past a change that was not handled), ``engine.shutdown(30)`` (no new turns,
running ones finish or are written ``cancelled``) while HTTP still serves their
streams, then uvicorn. A second signal cancels everything at once; the claims it
leaves ``pending`` become ``error: interrupted`` at the next start.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import signal
import socket
from collections.abc import Awaitable, Callable, Iterator, Mapping
from contextlib import AsyncExitStack
from dataclasses import replace
from pathlib import Path
from typing import Any

import anyio
import uvicorn
from anyio.abc import TaskStatus
from prometheus_client import CollectorRegistry

from daemon.accounts import Account
from daemon.config import Config
from daemon.config_file import ConfigError
from daemon.connections import AcceptErrorLog, guarded_protocol
from daemon.echo import ECHO, echo_provider
from daemon.events import EventHub
from daemon.http import create_app
from recordstore import SETTINGS, SETTINGS_SPACE, Change, RecordStore, StoreError
from recordstore.abilities import KnownDids
from turns.engine import TurnEngine
from turns.metrics import TurnMetrics
from turns.settings import Provider
from turns.state import StateDB

log = logging.getLogger("turnd.service")

FEED_CURSOR = "changes"  # the state file's name for the change feed cursor
SHUTDOWN_GRACE = 30.0  # seconds running turns get to finish on SIGTERM (SPEC §7)
CURSOR_FLUSH_SECONDS = 1.0
CURSOR_FLUSH_EVERY = 500  # changes: a busy feed still saves its place between flushes
CHANGE_RETRIES = 3  # attempts at one change before it is logged and skipped
FEED_BACKOFF_MAX = 30.0


class ServiceError(Exception):
    """A start-up failure worth one line (port taken, store unreadable)."""


class _Server(uvicorn.Server):
    """uvicorn without its own signal handlers: the service owns SIGTERM/SIGINT."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self.ready = anyio.Event()

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        if self.started:
            self.ready.set()


def bind_socket(host: str, port: int) -> socket.socket:
    """Bind before anything else starts, so a taken port is a clear one-line error."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        # asyncio sets TCP_NODELAY on accepted sockets only when the listening socket's
        # proto is TCP; without it a response's body waits ~40 ms behind its headers.
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.bind((host, port))
        sock.listen(2048)
        sock.setblocking(False)
    except OSError as err:
        sock.close()
        raise ServiceError(f"cannot listen on {host}:{port}: {err.strerror or err}") from None
    return sock


async def open_store(config: Config) -> RecordStore:
    if config.store_kind == "local":
        from recordstore.local import LocalStore

        return await LocalStore.open(config.store_path)
    try:
        from recordstore import pds
    except ImportError:
        raise ServiceError("store.kind: the pds backend is not available in this build") from None
    return await pds.open_pds_store(config.store_service, config.accounts)


class Service:
    """The shared object the HTTP app reads: config, store, state, engine, accounts."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.accounts: list[Account] = list(config.accounts)
        self.registry = CollectorRegistry()
        self.store: RecordStore | None = None
        self.state: StateDB | None = None  # once running
        self.engine: TurnEngine | None = None  # once running
        self.cluster: Any = None  # turns.cluster.Cluster with [cluster] (SPEC §18)
        # The config's providers; with port 0 the echo's URL is the port actually bound.
        self.providers: dict[str, Provider] = dict(config.providers)
        self.feed_up = False
        self.port: int | None = None  # the bound port (differs from config with port 0)
        self._stop = anyio.Event()
        self._handled_cursor: str | None = None
        self._saved_cursor: str | None = None
        self._since_save = 0
        # Loaded now, so a bad plugin name is a config error before anything starts.
        self.plugins = load_plugins(config.plugins)
        self.events = EventHub()  # the page's live record events (SPEC §15, §17)
        self.tools: Any = None  # plugins.sources.ToolCatalog once running (SPEC §14)
        self.telemetry = _open_telemetry(config)  # likewise: a missing [otel] extra

    # -- credentials (the HTTP app and XRPC call these) ------------------------------------

    def account_for_token(self, token: str | None) -> Account | None:
        """The account whose /api bearer token this is; constant-time in the token."""
        if not token:
            return None
        found = None
        given = token.encode()
        for account in self.accounts:
            # Compare against every account so timing does not tell which one matched.
            if account.token and hmac.compare_digest(account.token.encode(), given):
                found = account
        return found

    def account_for_login(self, identifier: str, password: str) -> Account | None:
        """createSession: ``identifier`` is a handle or a DID."""
        found = None
        given = password.encode()
        for account in self.accounts:
            if identifier not in (account.handle, account.did):
                continue
            if account.password and hmac.compare_digest(account.password.encode(), given):
                found = account
        return found

    def owners(self) -> dict[str, str]:
        """DID -> account name, for the trigger rules."""
        if any(a.did is None for a in self.accounts):
            self._learn_dids()
        return {a.did: a.name for a in self.accounts if a.did}

    def _learn_dids(self) -> None:
        """pds accounts configured by handle only: take the DID their login returned
        (an account whose PDS was down at start-up gets it on its first use)."""
        if not isinstance(self.store, KnownDids):
            return
        known = self.store.known_dids()
        self.accounts = [
            replace(a, did=known[a.handle]) if a.did is None and a.handle in known else a
            for a in self.accounts
        ]

    def request_stop(self) -> None:
        self._stop.set()

    # -- lifecycle -----------------------------------------------------------------------

    async def run(self, *, on_ready: Callable[[Service], None] | None = None) -> None:
        sock = bind_socket(self.config.host, self.config.port)
        self.port = sock.getsockname()[1]
        if self.port != self.config.port:
            # Port 0 (tests): the built-in echo must point at the port actually bound.
            host = f"[{self.config.host}]" if ":" in self.config.host else self.config.host
            self.providers[ECHO] = echo_provider(f"{host}:{self.port}")
        loop = asyncio.get_running_loop()
        previous_handler = loop.get_exception_handler()
        loop.set_exception_handler(AcceptErrorLog(previous_handler))
        try:
            async with anyio.create_task_group() as outer:
                outer.start_soon(self._watch_signals, outer.cancel_scope)
                try:
                    await self._run(sock, on_ready)
                finally:
                    outer.cancel_scope.cancel()  # ends the signal watcher
        finally:
            loop.set_exception_handler(previous_handler)
            sock.close()

    async def _watch_signals(self, scope: anyio.CancelScope) -> None:
        with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async for signum in signals:
                name = signal.Signals(signum).name
                if not self._stop.is_set():
                    log.info(
                        "%s: stopping: no new turns, running ones get %ds", name, SHUTDOWN_GRACE
                    )
                    self._stop.set()
                else:
                    log.warning("%s again: exiting now", name)
                    scope.cancel()
                    return

    async def _run(self, sock: socket.socket, on_ready: Callable[[Service], None] | None) -> None:
        async with AsyncExitStack() as stack:
            key = "store.path" if self.config.store_kind == "local" else "store.service"
            try:
                store = self.store = await open_store(self.config)
            except (OSError, ValueError, StoreError) as err:
                raise ServiceError(f"{key}: cannot open the store: {err}") from None
            # aclose again, shielded, after the context exits: a second signal cancels
            # that exit, and an open connection would keep the process alive.
            stack.push_async_callback(_close, store.aclose)
            await stack.enter_async_context(store)
            self._learn_dids()
            try:
                self.state = await StateDB.open(self.config.state_path)
            except (OSError, ValueError) as err:
                raise ServiceError(f"state.path: cannot open the state file: {err}") from None
            stack.push_async_callback(_close, self.state.aclose)
            if self.config.redis_url:
                from turns.cluster import Cluster

                # Entered before the engine, so it closes after it: the last statuses
                # still reach Redis while running turns finish on shutdown.
                self.cluster = await stack.enter_async_context(
                    Cluster(self.config.redis_url, self.state.instance_id)
                )

            from plugins.sources import ToolCatalog

            # Entered before the engine, so its MCP servers outlive the engine's last turn.
            self.tools = await stack.enter_async_context(
                ToolCatalog(self.plugins, self.config.tools)
            )
            accounting = _accounting(self)
            stack.push_async_callback(_stop_telemetry, accounting.telemetry)
            self.engine = TurnEngine(
                self.store,
                self.state,
                self.config.settings,
                self.providers,
                self.config.default_model,
                self.plugins,
                user_tools=_UserTools(self),
                cache_dir=_derivatives_dir(self.config),
                tools=self.tools,
                accounting=accounting,
                cluster=self.cluster,
                metrics=TurnMetrics(self.registry),
            )
            self.engine.titles.on_no_title = self.events.no_title  # `title-failed` events
            await stack.enter_async_context(self.engine)
            for account in self.accounts:
                if account.did:
                    await self.store.create_space(account.did, SETTINGS, SETTINGS_SPACE)
            await self.engine.recover(a.did for a in self.accounts if a.did)

            app = create_app(self)
            # The render workers end with the service (daemon.render).
            stack.push_async_callback(_close, app.state.render_pool.aclose)
            config = uvicorn.Config(
                app,
                log_config=None,  # keep our handlers and formatters
                access_log=False,  # one line per turn, not per request
                lifespan="off",  # the Service owns start-up and shutdown, not the app
                timeout_graceful_shutdown=5,
                server_header=False,
                # SPEC §12: a header timeout and a connection cap (daemon.connections).
                http=guarded_protocol(self.config.header_timeout, self.config.max_connections),
            )
            server = _Server(config)
            served = anyio.Event()

            async with anyio.create_task_group() as tg:

                async def serve_http() -> None:
                    try:
                        await server.serve(sockets=[sock])
                    finally:
                        served.set()
                        self._stop.set()  # uvicorn ending on its own drains the rest too

                await tg.start(self._feed_loop)
                tg.start_soon(serve_http)
                tg.start_soon(self._flush_loop)
                if on_ready is not None:
                    tg.start_soon(self._announce, server, on_ready)

                await self._stop.wait()
                self.feed_up = False
                await self.engine.shutdown(SHUTDOWN_GRACE)
                server.should_exit = True
                await served.wait()
                tg.cancel_scope.cancel()
            await self._flush_cursor()
            log.info("stopped")

    async def _announce(self, server: _Server, on_ready: Callable[[Service], None]) -> None:
        await server.ready.wait()
        on_ready(self)

    # -- the change feed -----------------------------------------------------------------

    async def _feed_loop(
        self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """store.changes -> engine.on_change, resuming from the last handled cursor."""
        assert self.store is not None and self.state is not None
        self._handled_cursor = self._saved_cursor = await self.state.get_cursor(FEED_CURSOR)
        self.feed_up = True
        task_status.started()  # HTTP starts after this: /healthz is never 503 at start-up
        delay = 0.5
        while not self._stop.is_set():
            try:
                self.feed_up = True
                async with self.store.changes(self._handled_cursor) as feed:
                    async for change in feed:
                        if self._stop.is_set():
                            break  # not handled, so the cursor stays before it
                        await self._handle(change)
                        delay = 0.5
                        self._handled_cursor = change.cursor
                        self._since_save += 1
                        if self._since_save >= CURSOR_FLUSH_EVERY:
                            await self._flush_cursor()
                    else:
                        # A feed that ends by itself is a backend fault: reconnect.
                        log.warning("the change feed ended; reconnecting")
            except Exception as err:  # noqa: BLE001 - any feed failure: log, back off, resume
                self.feed_up = False
                log.error("change feed failed (retrying in %.1fs): %s", delay, err)
            if self._stop.is_set():
                break
            self.feed_up = False
            await anyio.sleep(delay)
            delay = min(delay * 2, FEED_BACKOFF_MAX)
        await anyio.sleep_forever()  # the drain cancels us

    async def _handle(self, change: Change) -> None:
        owners = self.owners()
        self.events.publish(change, owners)
        for attempt in range(1, CHANGE_RETRIES + 1):
            try:
                await self.engine.on_change(change, owners)
                return
            except Exception as err:  # noqa: BLE001 - one bad change must not stop the feed
                if attempt == CHANGE_RETRIES:
                    log.error(
                        "skipping change %s/%s/%s after %d attempts: %s",
                        change.space,
                        change.collection,
                        change.key,
                        attempt,
                        err,
                    )
                    return
                await anyio.sleep(0.2 * attempt)

    async def _flush_loop(self) -> None:
        while True:
            await anyio.sleep(CURSOR_FLUSH_SECONDS)
            try:
                await self._flush_cursor()
            except Exception as err:  # noqa: BLE001 - the next flush tries again
                log.warning("cannot save the feed cursor: %s", err)

    async def _flush_cursor(self) -> None:
        cursor = self._handled_cursor
        if cursor is None or cursor == self._saved_cursor or self.state is None:
            return
        await self.state.set_cursor(FEED_CURSOR, cursor)
        self._saved_cursor = cursor
        self._since_save = 0


async def _close(aclose: Callable[[], Awaitable[None]]) -> None:
    """Close even when cancelled (a second signal): an open aiosqlite connection's
    worker thread would otherwise keep the process alive after ``run`` returns."""
    with anyio.CancelScope(shield=True), anyio.move_on_after(5):
        await aclose()


class _UserTools(Mapping[str, list[str]]):
    """DID -> ``[accounts.X] tools``, read live: a pds account's DID may arrive late."""

    def __init__(self, service: Service) -> None:
        self._service = service

    def _table(self) -> dict[str, list[str]]:
        return {a.did: list(a.tools) for a in self._service.accounts if a.did and a.tools}

    def __getitem__(self, did: str) -> list[str]:
        return self._table()[did]

    def __iter__(self) -> Iterator[str]:
        return iter(self._table())

    def __len__(self) -> int:
        return len(self._table())


def _derivatives_dir(config: Config) -> Path:
    """Image derivatives (turns.attachments): in the data directory, by CID."""
    base = config.store_path if config.store_kind == "local" else config.state_path.parent
    return base / "derivatives"


def _accounting(service: Service) -> Any:
    """SPEC §16 from the config: prices, fallbacks, quotas by DID (read live), traces."""
    from turns.accounting import Accounting

    def quota(did: str) -> Any:
        for account in service.accounts:
            if account.did == did:
                return account.quota
        return None

    counter = None
    if service.cluster is not None:
        from turns.quota import LocalQuotaCounter

        # SPEC §18: quotas shared by the instances through Redis.
        counter = service.cluster.quota_counter(LocalQuotaCounter(service.state))
    return Accounting(
        prices=service.config.prices,
        fallbacks=service.config.fallbacks,
        quotas=quota,
        telemetry=service.telemetry,
        counter=counter,
    )


def _open_telemetry(config: Config) -> Any:
    from turns.telemetry import open_telemetry

    try:
        return open_telemetry(config.otel)
    except RuntimeError as err:
        raise ConfigError(str(err)) from None


async def _stop_telemetry(telemetry: Any) -> None:
    """Flush the last spans off the event loop; a dead endpoint delays the exit by at most 5 s."""
    if not telemetry.enabled:
        return
    with anyio.CancelScope(shield=True), anyio.move_on_after(6):
        await anyio.to_thread.run_sync(telemetry.shutdown, abandon_on_cancel=True)


def load_plugins(names: list[str]) -> Any:
    from plugins.loader import load_plugins as load

    try:
        return load(names)
    except Exception as err:  # noqa: BLE001 - whatever a plugin raises, name the key
        raise ConfigError(f"plugins.enabled: {str(err).splitlines()[0]}") from None
