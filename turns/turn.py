"""One turn, from the claim to the final record: the seed's ten steps, in order.

:meth:`Turn.run` reads top to bottom as the seed does: load the conversation
once, choose the model and effort, wait for the rate limit (claiming nothing),
claim the reply key with a create-only write, resolve the provider, build the
prompt from the branch, run ``messages:beforeModel``, generate while streaming
to the reply's buffer, and finish: ``message:afterModel``, put the final record,
``turn:after``. The engine (:mod:`turns.engine`) decides which turns run; a
:class:`Turn` is one of them, holding its own state instead of passing it along.
"""

from __future__ import annotations

import copy
import logging
import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import httpx

from plugins import AFTER_MODEL, BEFORE_MODEL, TURN_AFTER, HookError, PluginSet, Tool, ToolContext
from plugins.context import TurnContext
from plugins.sources import ToolCatalog
from recordstore import (
    MESSAGE,
    RecordExists,
    RecordStore,
    StoreError,
)
from turns import records
from turns.accounting import Books, TurnAccount
from turns.address import Start, TurnAddress
from turns.approval import ApprovalGate, Approvals
from turns.claim_row import load_with_claim_row
from turns.conversation_refs import ConversationRefs
from turns.conversations import Conversation
from turns.final_writes import FinalWrites
from turns.generate import run_steps, scrub
from turns.message_cache import MessageCache
from turns.metrics import TurnMetrics, observe_turn
from turns.models import (
    Clients,
    ModelResolutionError,
    choose_effort,
    choose_model,
    reasoning_effort,
)
from turns.outcomes import TurnFailed, Usage
from turns.parts import PartsBuilder
from turns.prompt import branch, instructions
from turns.ratelimit import Limiter
from turns.reply import ReplyWrites, stored_status
from turns.settings import TurnSettings
from turns.state import StateDB
from turns.streams import StreamBuffer, StreamRegistry
from turns.titles import TitleAsk, Titles
from turns.titles import wanted as title_wanted
from turns.toolcalls import Observe, ToolRun
from turns.window import turn_prompt

log = logging.getLogger("turnd.turns")

QUEUE_FULL = "too many turns waiting for the rate limit"


@dataclass(frozen=True, slots=True)
class TurnServices:
    """What every turn uses, shared: built once by the engine."""

    store: RecordStore
    state: StateDB
    settings: Callable[[], TurnSettings]
    default_model: str
    plugins: PluginSet
    user_tools: Mapping[str, list[str]]
    metrics: TurnMetrics
    clients: Clients
    secrets: list[str]
    streams: StreamRegistry
    limiter: Limiter
    http: httpx.AsyncClient
    # The engine's running set: a turn is in it while there is something to cancel.
    running: dict[TurnAddress, Turn]
    titles: Titles
    refs: ConversationRefs  # the conversationRefs a finished turn touches
    final_writes: FinalWrites
    books: Books  # usage, quotas, fallbacks, traces (SPEC §16)
    cache_dir: Path | None = None  # image derivatives, by CID (turns.attachments)
    # SPEC §14: the tools a turn may offer (plugins' and [tools.NAME] sources'), approvals.
    tools: ToolCatalog | None = None  # None: the plugins' tools only
    approvals: Approvals = field(default_factory=Approvals)
    tool_calls: Observe | None = None  # (source, outcome) -> the turnd_tool_calls metric
    messages: MessageCache | None = None  # long conversations' parsed messages, kept


class Turn:
    def __init__(self, services: TurnServices, address: TurnAddress, start: Start) -> None:
        self._s = services
        self.address = address
        self._start = start
        self.scope = anyio.CancelScope()
        self.cancel_requested = False  # a user's cancel (not a timeout, not a shutdown)
        self.shutdown = False
        self.queued = False  # waiting for the rate limit, nothing claimed yet
        self.buffer: StreamBuffer | None = None
        self.usage = Usage()
        self.account: TurnAccount | None = None  # usage, cost, quota, spans (SPEC §16)
        self.conversation: Conversation
        self.user_message: dict[str, Any]
        self.chain: list[dict[str, Any]]
        self.model: dict[str, str]
        self.effort: str | None = None
        self.tools: list[str] = []
        self.placeholder: dict[str, Any]
        self._reply: ReplyWrites  # once claimed
        self._settings = services.settings()

    def cancel(self) -> None:
        self.cancel_requested = True
        self.scope.cancel()

    def stop(self) -> None:
        """Shutting down: a queued turn keeps its request; a running one ends ``cancelled``."""
        self.shutdown = True
        self.scope.cancel()

    async def run(self) -> None:
        """The seed's ten steps. Returns once the final record is written (or none is due).

        The rate-limit wait comes before the load (SPEC §12): a queued turn holds
        only its address, so a thousand of them cost a few MB whatever the
        conversations hold; the conversation is read when the turn leaves the queue.
        """
        a, s, state = self.address, self._s, self._s.state
        # 3. Rate limit: wait unclaimed, holding nothing but the address.
        # The turn names its slot: a message several instances start counts once.
        slot = f"{a.skey}/{a.reply}"
        was_queued = not await s.limiter.admit(a.did, self._settings.rate_per_minute, slot)
        if was_queued:
            if not await s.limiter.enter_queue(a.did, self._settings.max_queued, slot):
                await self._refuse(QUEUE_FULL)
                return
            try:
                if not await self._wait_in_queue():
                    return  # shutting down: the request stays in turn_request for the next start
            finally:
                await s.limiter.exit_queue(a.did, slot)
        # 1. Load, once per turn (and step 4's claim row meanwhile).
        # The POST's info is a moment old, unless the turn waited in the queue since.
        known_info = None if was_queued else self._start.info
        self.conversation = await load_with_claim_row(s.store, state, a, known_info, s.messages)
        user_message = self.conversation.messages.get(a.user_key)
        if user_message is None:
            await state.drop_claim(a.did, a.skey, a.reply)
            await state.drop_request(a.did, a.skey, a.user_key, a.attempt)
            if self.buffer is not None:
                self.buffer.close()
            return
        self.user_message = user_message
        self.chain = branch(self.conversation.messages, a.user_key)
        generation = user_message.get("generation") or {}
        # 2. Choose the model and effort.
        preferences = self.conversation.preferences
        self.model = choose_model(generation, self.chain[:-1], preferences, s.default_model)
        self.effort = choose_effort(generation, preferences)
        # 4. Claim.
        if not await self._claim():
            return
        if was_queued:
            await state.drop_request(a.did, a.skey, a.user_key, a.attempt)
        try:
            # 5-9. Resolve the provider, build the prompt, filter, generate and stream.
            status, error, parts, started = await self._generate()
        finally:
            s.running.pop(a, None)
        # 10. Finish. The claim row is dropped with the usage rows, only once the final
        # record is written: while it is not, the claim stays (the background retry drops
        # it; a restart marks the reply interrupted).
        await self._finish(status, error, parts, started)

    async def _refuse(self, message: str) -> None:
        """Answer the turn with an error reply, claiming it as any runner would."""
        a, s = self.address, self._s
        buffer = s.streams.open(a.did, a.skey, a.reply)
        try:
            await s.store.create_record(
                a.did, a.skey, MESSAGE, a.reply, records.error_reply(a.user_key, message)
            )
        except RecordExists:
            self._start.set("answered")
            await self._close_with_stored_status(buffer)
            return
        except BaseException:
            buffer.close()
            raise
        self._start.set("claimed")
        s.metrics.turns.labels("error").inc()
        buffer.publish("status", {"status": "error", "error": message})
        buffer.close()

    # -- 3. the rate limit -----------------------------------------------------------------

    async def _wait_in_queue(self) -> bool:
        """Wait, unclaimed, for the rate limit; False when a shutdown ended the wait."""
        a, s = self.address, self._s
        self.queued = True
        self.buffer = s.streams.open(a.did, a.skey, a.reply)
        self.buffer.publish("queued", {})
        s.running[a] = self
        # Durable while it waits: a restart runs it if it is still young.
        await s.state.add_request(a.did, a.skey, a.user_key, a.attempt)
        self._start.set("queued")
        s.metrics.queue.inc()
        try:
            with self.scope:
                await s.limiter.acquire(
                    a.did, self._settings.rate_per_minute, f"{a.skey}/{a.reply}"
                )
        finally:
            s.metrics.queue.dec()
            s.running.pop(a, None)
            self.queued = False
        if self.scope.cancel_called:
            if self.shutdown:
                self.buffer.close()
                return False
            # Cancelled while queued: claim anyway, so the reply says `cancelled`.
            self.scope = anyio.CancelScope()
            self.scope.cancel()
        return True

    # -- 4. the claim ----------------------------------------------------------------------

    async def _claim(self) -> bool:
        """Create the placeholder; False when the reply exists or another runner won."""
        a, s = self.address, self._s
        # Unique per claim: two runners' placeholders must never be the same bytes.
        claim = f"{s.state.instance_id}:{secrets.token_hex(6)}"
        self.placeholder = records.placeholder(a.user_key, self.model, self.effort, claim)
        # The stream opens before the placeholder is visible: a client that sees
        # `pending` and subscribes at once must find the live stream, not a stored status.
        self.buffer = self.buffer or s.streams.open(a.did, a.skey, a.reply)
        s.running[a] = self
        # The claim row is written by now (load_with_claim_row).
        try:
            claimed = await s.store.create_record(a.did, a.skey, MESSAGE, a.reply, self.placeholder)
        except RecordExists:
            s.running.pop(a, None)
            await s.state.drop_claim(a.did, a.skey, a.reply)
            await s.state.drop_request(a.did, a.skey, a.user_key, a.attempt)
            self._start.set("answered")
            s.streams.lost(a.did, a.skey, a.reply)  # before any await: served here no more
            await self._close_with_stored_status(self.buffer)
            return False
        except BaseException:
            s.running.pop(a, None)
            self.buffer.close()
            raise
        self._reply = ReplyWrites(s.store, a, claimed.cid)
        self._start.set("claimed")
        s.streams.claimed(a.did, a.skey, a.reply)
        return True

    # -- 5-9. generation -------------------------------------------------------------------

    async def _generate(self) -> tuple[str, str | None, PartsBuilder, float]:
        """Steps 5 to 9 inside the turn's cancel scope (timeout, cancel, shutdown)."""
        a, s, settings = self.address, self._s, self._settings
        assert self.buffer is not None
        started = time.monotonic()
        parts = PartsBuilder(self.buffer)
        status, error = "complete", None
        account = self.account = s.books.begin(a.did, a.skey, a.reply, self.model, self.buffer)
        self.tools = []  # filled in by _offer_tools, inside the turn's scope
        self.context = TurnContext(
            user=a.did,
            conversation=a.conversation_uri,
            info=self.conversation.info,
            preferences=self.conversation.preferences,
            # A copy for the plugins: the loaded values may be shared with later turns
            # (turns.message_cache), and a hook may change what it is given.
            user_message=(
                copy.deepcopy(self.user_message) if s.plugins.plugins else self.user_message
            ),
            reply=self.placeholder,
            model=self.model,
            provider=self.model["provider"],
            effort=self.effort,
            tools=self.tools,
        )
        scope = self.scope
        scope.deadline = anyio.current_time() + settings.timeout_seconds
        cancelled = anyio.Event()
        gate = ApprovalGate(
            s.approvals, a.did, a.skey, a.reply, parts=parts.parts, buffer=self.buffer,
            rewrite=partial(self._reply.rewrite_pending, self.placeholder), timeout_seconds=settings.approval_timeout_seconds,
            scope=scope,
        )
        s.metrics.running.inc()
        try:
            with scope:
                try:
                    offered = await self._offer_tools()
                    # 5. Resolve the provider.
                    provider = s.clients.provider(self.model)
                    # Past a quota no model is called, not even a summary's.
                    await account.check_quota()
                    # 6. Build the prompt from the branch.
                    preferences, info = self.conversation.preferences, self.conversation.info
                    system = instructions(settings, preferences, info)
                    prompt = await turn_prompt(
                        s.store, s.clients, did=a.did, skey=a.skey, chain=self.chain,
                        user_key=a.user_key, system=system, settings=settings, model=self.model,
                        provider=provider, publish=self.buffer.publish, cache_dir=s.cache_dir,
                    )
                    # 7. Filter.
                    account.summaries = prompt.summaries
                    messages = await s.plugins.filter(BEFORE_MODEL, prompt.messages, self.context)
                    # 8-9. Generate and stream.
                    await run_steps(
                        s.clients.client(provider, settings.retries),
                        model=self.model["id"],
                        messages=messages,
                        tools=offered,
                        effort=reasoning_effort(self.effort),
                        settings=settings,
                        parts=parts,
                        tool_context=ToolContext(a.did, a.conversation_uri, cancelled, s.http),
                        usage=self.usage,
                        window=prompt.window,
                        tool_run=ToolRun(gate, s.tool_calls),
                        caller=account.caller(s.clients, provider, self.model, settings.retries),
                    )
                except (TurnFailed, ModelResolutionError, HookError) as exc:
                    status, error = "error", scrub(str(exc), s.secrets)
                except Exception as exc:
                    log.exception("turn %s/%s failed", a.skey, a.reply)
                    status, error = "error", scrub(f"turnd failed: {type(exc).__name__}", s.secrets)
            gate.settle()  # a call still waiting (cancelled) keeps no "pending"
            if scope.cancel_called:
                cancelled.set()
                status = "cancelled"
                if not self.cancel_requested and not self.shutdown:
                    error = f"timed out after {settings.timeout_seconds:g} s"
        finally:
            s.metrics.running.dec()
        return status, error, parts, started

    def _tool_names(self) -> list[str]:
        """The names the message asks for (tools, sources, globs), else the account's."""
        generation = self.user_message.get("generation") or {}
        named = generation.get("tools")
        if isinstance(named, list):
            return [n for n in named if isinstance(n, str)]
        return list(self._s.user_tools.get(self.address.did, ()))

    async def _offer_tools(self) -> list[Tool]:
        """The tools this turn offers; a lazy MCP source named is connected first."""
        names = self._tool_names()
        if self._s.tools is None:
            offered = self._s.plugins.tools(names)
        else:
            offered = await self._s.tools.offer(names)
        self.tools[:] = [t.name for t in offered]  # the hooks' ctx.tools is this list
        return offered

    # -- 10. finishing ---------------------------------------------------------------------

    async def _finish(
        self, status: str, error: str | None, parts: PartsBuilder, started: float
    ) -> bool:
        """``message:afterModel``, the final record, ``turn:after``; shielded so a
        shutdown cannot leave the reply pending. False when the store refused the
        record: the stream still gets its status, and the write is retried."""
        a, s = self.address, self._s
        assert self.buffer is not None
        with anyio.CancelScope(shield=True):
            record = records.final(
                self.placeholder, parts.finish(), status, error, self.usage.record()
            )
            account = self.account or s.books.begin(a.did, a.skey, a.reply, self.model, None)
            record["model"] = account.answered_by(self.model)  # after a fallback, not the asked
            self.context.reply = record
            try:
                record = await s.plugins.filter(AFTER_MODEL, record, self.context)
            except HookError as exc:
                record = records.failed(record, scrub(str(exc), s.secrets))
            try:
                record = await self._reply.final(record)
                written = True
                s.final_writes.succeeded()
            except StoreError as exc:
                written = False
                log.error("could not store the reply %s/%s: %s", a.skey, a.reply, exc)
                s.final_writes.retry(
                    f"{a.skey}/{a.reply}",
                    partial(self._reply.final, record),
                    partial(s.state.drop_claim, a.did, a.skey, a.reply),
                )
                record = records.failed(
                    record, scrub(f"could not store the reply: {exc}", s.secrets)
                )
            s.running.pop(a, None)  # written (or handed to the retry): nothing left to cancel
            status_event = records.status_event(record, record.get("model", self.model))
            self.buffer.publish(
                "status", account.status_fields(status_event, self.usage, parts.first_delta_at)
            )
            # The rows are stored after the status is out and before the stream ends, so a
            # client that saw the end and asks again finds its usage counted.
            await account.save_rows(release=written)
            self.buffer.close()
            account.end(record)
            ttft = parts.first_delta_at - started if parts.first_delta_at is not None else None
            self._observe(record, ttft, time.monotonic() - started)
            if not written:
                return False
            await s.refs.touch(a.did, a.skey)
            conversation = self.conversation
            if record["status"] == "complete" and title_wanted(
                self._settings, conversation.info, conversation.preferences
            ):  # after the status is out: a title never delays the reply
                s.titles.start(
                    TitleAsk(a.did, a.skey, self._settings, self.model, self.user_message, record)
                )
            self.context.reply = record
            try:
                await s.plugins.action(TURN_AFTER, self.context)
            except Exception:
                log.exception("turn:after hook failed for %s/%s", a.skey, a.reply)
        return True

    async def _close_with_stored_status(self, buffer: StreamBuffer) -> None:
        buffer.publish("status", {"status": await stored_status(self._s.store, self.address)})
        buffer.close()

    def _observe(self, record: Mapping[str, Any], ttft: float | None, duration: float) -> None:
        observe_turn(self._s.metrics, self.address, self.model, record, ttft, duration)
