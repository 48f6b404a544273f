"""The turn engine: which turns run, and their lifecycle.

It keeps the running set, de-duplicates starts (a POST and the change feed may
ask for the same turn at once), cancels, shuts down, recovers after a restart and
applies the direct-write trigger to the change feed. One turn's own steps, claim
to final record, are :class:`turns.turn.Turn`'s.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from contextlib import AsyncExitStack
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import httpx

from plugins import PluginSet
from plugins.sources import ToolCatalog
from recordstore import (
    MESSAGE,
    Change,
    Record,
    RecordExists,
    RecordNotFound,
    RecordStore,
    StoreError,
)
from recordstore.keys import parse_reply_key, reply_key
from turns import attachments, conversations, manage, records, triggers
from turns.accounting import Accounting, Books
from turns.approval import APPROVAL, Approvals
from turns.conversation_refs import ConversationRefs
from turns.final_writes import FinalWrites
from turns.message_cache import MessageCache
from turns.metrics import TurnMetrics
from turns.models import Clients
from turns.ratelimit import Limiter, RateLimiter
from turns.reply import read_status as reply_status
from turns.settings import Provider, TurnSettings
from turns.state import StateDB
from turns.streams import ReplyStream, StreamBuffer, StreamRegistry
from turns.titles import Titles
from turns.tls import tls_context
from turns.toolcalls import ToolCallMetrics
from turns.turn import Start, Turn, TurnAddress, TurnServices
from turns.upkeep import Upkeep

if TYPE_CHECKING:
    from turns.cluster import Cluster

log = logging.getLogger("turnd.turns")


@dataclass(frozen=True, slots=True)
class PostResult:
    user_key: str
    reply_key: str | None
    turn: str | None


class TurnEngine:
    def __init__(
        self,
        store: RecordStore,
        state: StateDB,
        settings: Callable[[], TurnSettings],
        providers: Mapping[str, Provider],
        default_model: str,
        plugins: PluginSet | None = None,
        *,
        user_tools: Mapping[str, list[str]] | None = None,
        metrics: TurnMetrics | None = None,
        cache_dir: Path | None = None,
        tools: ToolCatalog | None = None,
        final_writes: FinalWrites | None = None,
        maintenance_interval: float = 60,
        accounting: Accounting | None = None,
        cluster: Cluster | None = None,
    ) -> None:
        self._store = store
        self._state = state
        self._settings = settings
        self._default_model = default_model
        self._plugins = plugins or PluginSet()
        self._user_tools = user_tools or {}
        self.metrics = metrics or TurnMetrics()
        # SPEC §16: usage rows, quotas, fallbacks, traces (turns.accounting).
        self.books = Books(accounting or Accounting(), state, self.metrics)
        self._clients = Clients(providers)
        self._secrets = [p.api_key for p in providers.values() if p.api_key]
        # [cluster] (SPEC §18): streams, limits and cancel shared through Redis.
        self._cluster = cluster
        self._streams = (
            cluster.streams(self.metrics.subscriber_delta)
            if cluster
            else StreamRegistry(self.metrics.subscriber_delta)
        )
        self._limiter: Limiter = cluster.limiter if cluster else RateLimiter()
        if cluster:
            cluster.serve_cancel(lambda address: self._cancel_here(*address))
        self._starts: dict[TurnAddress, Start] = {}
        # Turns with something to cancel: queued, or claimed and not yet written.
        self._running: dict[TurnAddress, Turn] = {}
        self._accepting = True
        self._active = 0  # turns started and not yet finished
        self._idle = anyio.Event()
        self._idle.set()
        self._stack: AsyncExitStack | None = None
        self._tg: anyio.abc.TaskGroup | None = None
        self._services: TurnServices | None = None
        self._cache_dir = cache_dir
        self._final_writes = final_writes or FinalWrites()
        self.upkeep = Upkeep(  # abandoned claims, the state file (turns.upkeep)
            store, state, settings, self._running, self.metrics, maintenance_interval
        )
        self.refs = ConversationRefs(store)
        self.messages = MessageCache(store)
        self.titles = Titles(
            store, self._clients, self.refs.touch,
            record_usage=self.books.record_side_call,
        )
        # SPEC §14: the catalog of tools (plugins.sources.ToolCatalog), calls awaiting approval.
        self._tools = tools
        self.approvals = Approvals()
        self.tool_metrics = ToolCallMetrics(self.metrics.registry)

    # -- lifecycle ---------------------------------------------------------------------

    async def __aenter__(self) -> TurnEngine:
        async with AsyncExitStack() as stack:
            http = await stack.enter_async_context(httpx.AsyncClient(timeout=30, verify=tls_context()))
            self._services = TurnServices(
                store=self._store,
                state=self._state,
                settings=self._settings,
                default_model=self._default_model,
                plugins=self._plugins,
                user_tools=self._user_tools,
                metrics=self.metrics,
                clients=self._clients,
                secrets=self._secrets,
                streams=self._streams,
                limiter=self._limiter,
                http=http,
                running=self._running,
                titles=self.titles,
                refs=self.refs,
                messages=self.messages,
                final_writes=self._final_writes,
                cache_dir=self._cache_dir,
                tools=self._tools,
                approvals=self.approvals,
                tool_calls=self.tool_metrics.observe,
                books=self.books,
            )
            stack.push_async_callback(self._clients.aclose)
            self._clients.warm(self._settings().retries)
            self._tg = await stack.enter_async_context(anyio.create_task_group())
            self.titles.attach(self._tg)
            self._final_writes.attach(self._tg)
            self._tg.start_soon(self.upkeep.run)
            self._tg.start_soon(self._streams.heartbeat)  # the subscribers' keepalives
            self._stack = stack.pop_all()
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._stack is not None
        self.upkeep.stop()
        self._streams.stop_heartbeat()
        await self._stack.__aexit__(*exc)  # the task group waits for running turns

    @property
    def store_writable(self) -> bool:
        """False while a final record the store refused waits for its retry (SPEC §12)."""
        return not self._final_writes.failing

    @property
    def task_group(self) -> anyio.abc.TaskGroup:
        if self._tg is None:
            raise RuntimeError("use the engine inside `async with engine:`")
        return self._tg

    async def shutdown(self, grace: float = 30) -> None:
        """Take no new turns; let running ones finish for ``grace`` s, then cancel the rest.

        Queued turns stop at once: nothing is claimed for them, and their requests
        stay in the state file for the next start.
        """
        self._accepting = False
        self.titles.cancel_all()
        self.approvals.close()  # nobody may answer now: waiting calls end `timedout`
        self._cancel_all(queued_only=True)
        with anyio.move_on_after(grace):
            await self._idle.wait()
        self._cancel_all(queued_only=False)
        await self._idle.wait()

    def _cancel_all(self, *, queued_only: bool) -> None:
        for turn in list(self._running.values()):
            if turn.queued or not queued_only:
                turn.stop()

    async def recover(self, accounts: Iterable[str] = ()) -> None:
        """At start-up: our interrupted claims become errors; young requests run again.

        ``accounts`` (DIDs) are scanned once, in the background, for others'
        pending replies, so abandoned ones from before this start are found too.
        """
        self.upkeep.accounts = list(accounts)
        await self.upkeep.interrupt_claims()
        window = self._settings().backfill_minutes * 60
        for request in await self._state.requests():
            await self._state.drop_request(
                request.did, request.skey, request.user_key, request.attempt
            )
            if time.time() - request.requested_at <= window:
                self.task_group.start_soon(self._start_quietly, request.did, request.skey, request.user_key)

    async def _start_quietly(self, did: str, skey: str, user_key: str) -> None:
        try:
            await self.start_turn(did, skey, user_key)
        except StoreError as exc:
            log.warning("could not restart the turn of %s/%s: %s", skey, user_key, exc)

    # -- conversations and messages ----------------------------------------------------

    async def create_conversation(
        self, did: str, *, title: str | None = None, system_prompt: str | None = None
    ) -> str:
        return await conversations.create(self._store, did, title=title, system_prompt=system_prompt)

    async def post_message(
        self,
        did: str,
        skey: str,
        *,
        parent: str | None,
        parts: list[dict[str, Any]],
        generation: dict[str, Any] | None,
    ) -> PostResult:
        created, info = await conversations.post(
            self._store, did, skey, parent=parent, parts=parts, generation=generation
        )
        if generation is None:
            await self.refs.touch(did, skey)
            return PostResult(created.key, None, None)
        # The conversationRef is touched when the reply is written.
        turn = await self._start(did, skey, created, fresh=True, info=info)
        return PostResult(created.key, reply_key(created.key, 0), turn)

    async def regenerate(
        self,
        did: str,
        skey: str,
        key: str,
        *,
        model: dict[str, str] | None = None,
        effort: str | None = None,
    ) -> tuple[str, str | None]:
        """Raise the user message's attempt by one (a put: earlier replies stay) and start it."""
        attempt = await conversations.next_attempt(
            self._store, did, skey, key, model=model, effort=effort
        )
        turn = await self.start_turn(did, skey, key)
        return reply_key(key, attempt), turn

    async def cancel(self, did: str, skey: str, reply: str) -> bool:
        """Cancel a running reply here, or (with [cluster]) on the instance running it."""
        if await self._cancel_here(did, skey, reply):
            return True
        return self._cluster is not None and await self._cluster.cancel((did, skey, reply))

    async def _cancel_here(self, did: str, skey: str, reply: str) -> bool:
        parsed = parse_reply_key(reply)
        turn = self._running.get(TurnAddress(did, skey, *parsed)) if parsed else None
        if turn is None:
            return False
        turn.cancel()
        return True

    async def delete_conversation(self, did: str, skey: str) -> set[str]:
        """Stop the conversation's turns and title, then delete it (``turns.manage.delete``).

        A queued turn claims nothing; a running one ends ``cancelled`` and is written
        before the records go, so nothing of it is written after the delete.
        """
        self.titles.cancel(did, skey)
        with anyio.move_on_after(60):
            while starts := [
                start for a, start in self._starts.items() if a.did == did and a.skey == skey
            ]:
                for address, turn in list(self._running.items()):
                    if address.did == did and address.skey == skey:
                        turn.stop() if turn.queued else turn.cancel()
                # A turn still loading enters the running set in a moment: look again.
                with anyio.move_on_after(0.05):
                    await starts[0].finished.wait()
        for request in await self._state.requests():  # stopped queued turns keep theirs
            if request.did == did and request.skey == skey:
                await self._state.drop_request(did, skey, request.user_key, request.attempt)
        deleted = await manage.delete(self._store, did, skey)
        await anyio.to_thread.run_sync(attachments.forget, self._cache_dir, deleted)
        return deleted

    def stream(self, did: str, skey: str, reply: str) -> StreamBuffer | None:
        return self._streams.get(did, skey, reply)

    async def reply_stream(self, did: str, skey: str, reply: str, after: int) -> ReplyStream | None:
        """What a subscriber who saw ``after`` events reads: the live stream here or (with
        [cluster]) the runner's; None when the stored reply answers (SPEC §12: at or past
        the last event of a finished reply, its stored status, not an empty stream)."""
        buffer = self.stream(did, skey, reply)
        if self._cluster is not None:
            # A buffer this instance opened for a claim it then lost is not served.
            buffer = await self._cluster.local_stream(buffer)
        if buffer is not None:
            return None if buffer.done and after >= buffer.last_id else buffer
        if self._cluster is None:
            return None
        # Another instance may run it; its stream is then read from Redis.
        return await self._cluster.remote_stream(
            (did, skey, reply), partial(reply_status, self._store)
        )

    # -- the direct-write trigger ------------------------------------------------------

    async def on_change(self, change: Change, owners: Mapping[str, Any]) -> None:
        """Apply the direct-write rules to one change of the store."""
        self.upkeep.pending.observe(change)
        if change.collection == APPROVAL:
            self.approvals.on_change(change, owners)  # a decision on a waiting tool call
            return
        await self.on_written(change, owners)

    async def on_written(self, change: Change, owners: Mapping[str, Any], *, here: bool = False) -> None:
        """The direct-write rules for one written record: start the turn it asks for and
        return once that is claimed (or queued, or found answered). The change feed calls
        it for every change; the local XRPC also calls it as it writes a message (``here``:
        this process wrote it a moment ago, so the change holds the stored message and a
        new message's reply is not looked for first; were it there, the claim would find it)."""
        settings = self._settings()
        decision = triggers.decide(change, owners, settings.backfill_minutes)
        if decision is None:
            return
        if decision.error is not None:
            await self._error_reply(change.did, change.space, change.key, decision.attempt, decision.error)
            return
        address = TurnAddress(change.did, change.space, change.key, decision.attempt)
        if self._started_here(address):
            return  # a POST, or this feed earlier: nothing to read
        if change.record is not None and change.cid and (here or (change.live and change.op == "create")):
            # Created a moment ago, or written here just now: the change carries the message,
            # start_turn would read it back on the claim's path (the reply's own check stays
            # unless it is a new message written here: another runner may have it).
            record = Record(change.did, change.space, change.collection, change.key, change.cid, change.record)
            await self._start(change.did, change.space, record, fresh=here and change.op == "create")
            return
        await self.start_turn(change.did, change.space, change.key)

    async def _error_reply(self, did: str, skey: str, key: str, attempt: int, message: str) -> None:
        value = records.error_reply(key, message)
        try:
            await self._store.create_record(did, skey, MESSAGE, reply_key(key, attempt), value)
            self.metrics.turns.labels("error").inc()
        except RecordExists:
            pass

    # -- start_turn --------------------------------------------------------------------

    async def start_turn(self, did: str, skey: str, user_key: str) -> str | None:
        """Run the turn in the background; return once it is claimed, queued or found answered.

        Returns ``claimed``, ``queued``, ``answered`` (the reply exists or another
        runner claimed it), or None when the message asks for no reply.
        """
        record = await self._store.get_record(did, skey, MESSAGE, user_key)
        if record is None:
            raise RecordNotFound(f"no message {user_key} in conversation {skey}")
        return await self._start(did, skey, record, fresh=False)

    async def _start(
        self, did: str, skey: str, record: Record, *, fresh: bool, info: Record | None = None
    ) -> str | None:
        """start_turn for a message already read; ``fresh``: just created, so unanswered;
        ``info``: the conversation's, read a moment ago (the turn's load reads it otherwise)."""
        user_key = record.key
        if parse_reply_key(user_key) is not None:
            return None  # reply keys belong to the runners (as in triggers.decide)
        generation = record.value.get("generation")
        if not isinstance(generation, dict) or record.value.get("role") != "user":
            return None
        address = TurnAddress(did, skey, user_key, triggers.attempt_of(generation))
        start = self._starts.get(address)
        if start is None and self._started_here(address):
            # Finished here already: the change feed can start a POST's message (its write
            # came back late) and end the turn before the POST gets here.
            return "answered"
        if start is None and not fresh:
            if await self._store.get_record(did, skey, MESSAGE, address.reply) is not None:
                return "answered"
            # Another caller (the change feed, a POST) may have started it during that read.
            start = self._starts.get(address)
        if start is None:
            if not self._accepting:
                # Shutting down: keep the request so the next start runs it.
                await self._state.add_request(did, skey, user_key, address.attempt)
                return "queued"
            start = self._starts[address] = Start(info)
            if self._active == 0:
                self._idle = anyio.Event()
            self._active += 1
            self.task_group.start_soon(self._turn, address, start)
        await start.done.wait()
        return start.result

    def _started_here(self, address: TurnAddress) -> bool:
        """Started by this process: starting or running, or finished with its stream still
        kept. Starting it again would lose the claim and replace that stream (its deltas)
        with one of the stored status."""
        return address in self._starts or self.stream(address.did, address.skey, address.reply) is not None

    async def _turn(self, address: TurnAddress, start: Start) -> None:
        assert self._services is not None
        try:
            await Turn(self._services, address, start).run()
        except Exception:
            log.exception("turn %s/%s failed before it could finish", address.skey, address.reply)
        finally:
            start.set(None)
            start.finished.set()
            self._starts.pop(address, None)
            self._active -= 1
            if self._active == 0:
                self._idle.set()
