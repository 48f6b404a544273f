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
from collections.abc import Awaitable, Callable, Iterator
from contextlib import AsyncExitStack
from dataclasses import replace
from typing import TYPE_CHECKING

import anyio
import uvicorn
from prometheus_client import CollectorRegistry

from daemon import engine_parts
from daemon.accounts import Account
from daemon.config import Config
from daemon.connections import AcceptErrorLog, guarded_protocol
from daemon.echo import ECHO, echo_provider
from daemon.events import EventHub
from daemon.feed import FeedFollower
from daemon.http import create_app
from daemon.sessions import LoginLimiter
from daemon.uploads import UploadGuard
from plugins.sources import ToolCatalog
from recordstore import RecordStore, StoreError
from recordstore.abilities import KnownDids
from turns import account_space
from turns.engine import TurnEngine
from turns.metrics import TurnMetrics
from turns.settings import Provider
from turns.state import StateDB

if TYPE_CHECKING:
    # Only with [cluster] is the package imported (turns.cluster's promise).
    from turns.cluster import Cluster

log = logging.getLogger("turnd.service")

SHUTDOWN_GRACE = 30.0  # seconds running turns get to finish on SIGTERM (SPEC §7)


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
    """The shared object the HTTP app reads (:class:`daemon.served.Served`): config,
    store, state, engine, accounts; and the daemon's lifecycle, :meth:`run`."""

    # Set by run() once open, before the HTTP app (their only reader) is built.
    store: RecordStore
    state: StateDB
    engine: TurnEngine
    tools: ToolCatalog  # SPEC §14

    def __init__(self, config: Config) -> None:
        self.config = config
        self.accounts: list[Account] = list(config.accounts)
        self.registry = CollectorRegistry()
        self.cluster: Cluster | None = None  # with [cluster] (SPEC §18)
        # The config's providers; with port 0 the echo's URL is the port actually bound.
        self.providers: dict[str, Provider] = dict(config.providers)
        self.port: int | None = None  # the bound port (differs from config with port 0)
        self._stop = anyio.Event()
        self.stopped_at_once = False  # a second signal: nothing left is waited for
        self._feed: FeedFollower | None = None
        # Loaded now, so a bad plugin name is a config error before anything starts.
        self.plugins = engine_parts.load_plugins(config.plugins)
        self.events = EventHub()  # the page's live record events (SPEC §15, §17)
        self.telemetry = engine_parts.start_telemetry(config)  # likewise: a missing [otel] extra
        # SPEC §12: /api/attachments and uploadBlob share one guard; failed logins are
        # counted per account and address (tests give it a clock of their own).
        self.uploads = UploadGuard()
        self.login_limiter = LoginLimiter()

    @property
    def feed_up(self) -> bool:
        """/healthz's changeFeed: connected and following."""
        return self._feed is not None and self._feed.up

    @feed_up.setter
    def feed_up(self, up: bool) -> None:
        # The drain says the feed is down at once (tests also set it, as while it reconnects).
        if self._feed is not None:
            self._feed.up = up

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
                    self.stopped_at_once = True
                    scope.cancel()
                    return

    async def _run(self, sock: socket.socket, on_ready: Callable[[Service], None] | None) -> None:
        async with AsyncExitStack() as stack:
            key = "store.path" if self.config.store_kind == "local" else "store.service"
            try:
                store = self.store = await open_store(self.config)
            except (OSError, ValueError, StoreError) as err:
                raise ServiceError(f"{key}: cannot open the store: {err}") from None
            await stack.enter_async_context(store)  # closed even when that exit is cancelled
            self._learn_dids()
            try:
                state = self.state = await StateDB.open(self.config.state_path)
            except (OSError, ValueError) as err:
                raise ServiceError(f"state.path: cannot open the state file: {err}") from None
            stack.push_async_callback(_close, state.aclose)
            if self.config.redis_url:
                from turns.cluster import Cluster

                # Entered before the engine, so it closes after it: the last statuses
                # still reach Redis while running turns finish on shutdown.
                self.cluster = await stack.enter_async_context(
                    Cluster(self.config.redis_url, state.instance_id)
                )
            # Entered before the engine, so its MCP servers outlive the engine's last turn.
            tools = self.tools = await stack.enter_async_context(
                ToolCatalog(self.plugins, self.config.tools)
            )
            accounting = engine_parts.accounting(
                self.config, lambda: self.accounts, state, self.telemetry, self.cluster
            )
            stack.push_async_callback(engine_parts.stop_telemetry, accounting.telemetry)
            engine = self.engine = TurnEngine(
                store,
                state,
                self.config.settings,
                self.providers,
                self.config.default_model,
                self.plugins,
                user_tools=engine_parts.UserTools(lambda: self.accounts),
                cache_dir=engine_parts.derivatives_dir(self.config),
                tools=tools,
                accounting=accounting,
                cluster=self.cluster,
                metrics=TurnMetrics(self.registry),
            )
            engine.titles.on_no_title = self.events.no_title  # `title-failed` events
            await stack.enter_async_context(engine)
            for account in self.accounts:
                if account.did:
                    await account_space.ensure(store, account.did)
            await engine.recover(a.did for a in self.accounts if a.did)
            feed = self._feed = FeedFollower(
                store, state, engine, self.events, self.owners, self._stop
            )

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

                await tg.start(feed.run)
                tg.start_soon(serve_http)
                tg.start_soon(feed.flush_loop)
                if on_ready is not None:
                    tg.start_soon(self._announce, server, on_ready)

                await self._stop.wait()
                feed.up = False
                await engine.shutdown(SHUTDOWN_GRACE)
                server.should_exit = True
                await served.wait()
                tg.cancel_scope.cancel()
            await feed.flush()
            log.info("stopped")

    async def _announce(self, server: _Server, on_ready: Callable[[Service], None]) -> None:
        await server.ready.wait()
        on_ready(self)


async def _close(aclose: Callable[[], Awaitable[None]]) -> None:
    """Close even when cancelled (a second signal): an open aiosqlite connection's
    worker thread would otherwise keep the process alive after ``run`` returns."""
    with anyio.CancelScope(shield=True), anyio.move_on_after(5):
        await aclose()
