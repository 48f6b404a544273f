"""start_turn and its variations: post, regenerate, cancel, recover, shut down.

A turn, in the seed's order: load the conversation once, choose the model and
effort, wait for the rate limit (claiming nothing), claim the reply key with a
create-only write, resolve the provider, build the prompt from the branch, run
``messages:beforeModel``, generate while streaming to the reply's buffer, and
finish: ``message:afterModel``, put the final record, ``turn:after``.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Callable, Mapping
from contextlib import AsyncExitStack
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import anyio
import httpx

from plugins import AFTER_MODEL, BEFORE_MODEL, TURN_AFTER, HookError, PluginSet, ToolContext
from recordstore import (
    CONVERSATION,
    CONVERSATION_REF,
    INFO,
    MESSAGE,
    PREFERENCES,
    SETTINGS,
    SETTINGS_SPACE,
    Change,
    InvalidRecord,
    InvalidSwap,
    Record,
    RecordExists,
    RecordNotFound,
    RecordStore,
    StoreError,
)
from recordstore.keys import new_tid, parse_reply_key, reply_key
from recordstore.lexicon import validate_record
from turns import triggers
from turns.fit import fit_record
from turns.generate import TurnFailed, Usage, run_steps, scrub
from turns.metrics import TurnMetrics
from turns.models import (
    Clients,
    ModelResolutionError,
    choose_effort,
    choose_model,
    reasoning_effort,
)
from turns.parts import PartsBuilder
from turns.prompt import PLAIN, branch, chat_messages, instructions
from turns.ratelimit import RateLimiter
from turns.settings import Provider, TurnSettings
from turns.state import StateDB
from turns.streams import StreamBuffer, StreamRegistry

log = logging.getLogger("turnd.turns")



def now_iso() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def conversation_uri(did: str, skey: str) -> str:
    return f"at://{did}/space/{CONVERSATION}/{skey}"


@dataclass(frozen=True, slots=True)
class PostResult:
    user_key: str
    reply_key: str | None
    turn: str | None


@dataclass
class TurnContext:
    """What the hooks receive."""

    user: str
    conversation: str
    info: dict[str, Any] | None
    preferences: dict[str, Any] | None
    user_message: dict[str, Any]
    reply: dict[str, Any]
    model: dict[str, str]
    provider: str
    effort: str | None
    tools: list[str]


@dataclass
class _Conversation:
    info: dict[str, Any] | None
    preferences: dict[str, Any] | None
    messages: dict[str, dict[str, Any]]


class _Start:
    """An in-flight start: callers wait for the claim's outcome."""

    def __init__(self) -> None:
        self.done = anyio.Event()
        self.result: str | None = None

    def set(self, result: str | None) -> None:
        if not self.done.is_set():
            self.result = result
            self.done.set()


@dataclass
class _Running:
    scope: anyio.CancelScope
    cancel_requested: bool = False
    shutdown: bool = False
    queued: bool = False  # waiting for the rate limit, nothing claimed yet
    buffer: StreamBuffer | None = None


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
    ) -> None:
        self._store = store
        self._state = state
        self._settings = settings
        self._providers = providers
        self._default_model = default_model
        self._plugins = plugins or PluginSet()
        self._user_tools = user_tools or {}
        self.metrics = metrics or TurnMetrics()
        self._clients = Clients(providers)
        self._secrets = [p.api_key for p in providers.values() if p.api_key]
        self._streams = StreamRegistry(self.metrics.subscriber_delta)
        self._limiter = RateLimiter()
        self._starts: dict[tuple[str, str, str], _Start] = {}
        self._running: dict[tuple[str, str, str], _Running] = {}
        self._accepting = True
        self._active = 0  # turns started and not yet finished
        self._idle = anyio.Event()
        self._idle.set()
        self._stack: AsyncExitStack | None = None
        self._tg: anyio.abc.TaskGroup | None = None
        self._http: httpx.AsyncClient | None = None

    # -- lifecycle ---------------------------------------------------------------------

    async def __aenter__(self) -> TurnEngine:
        async with AsyncExitStack() as stack:
            self._http = await stack.enter_async_context(httpx.AsyncClient(timeout=30))
            stack.push_async_callback(self._clients.aclose)
            self._clients.warm(self._settings().retries)
            self._tg = await stack.enter_async_context(anyio.create_task_group())
            self._stack = stack.pop_all()
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._stack is not None
        await self._stack.__aexit__(*exc)  # the task group waits for running turns

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
        self._cancel_all(queued_only=True)
        with anyio.move_on_after(grace):
            await self._idle.wait()
        self._cancel_all(queued_only=False)
        await self._idle.wait()

    def _cancel_all(self, *, queued_only: bool) -> None:
        for running in list(self._running.values()):
            if running.queued or not queued_only:
                running.shutdown = True
                running.scope.cancel()

    async def recover(self) -> None:
        """At start-up: our interrupted claims become errors; young requests run again."""
        for claim in await self._state.claims():
            record = await self._store.get_record(claim.did, claim.skey, MESSAGE, claim.reply_key)
            if record is not None and record.value.get("status") == "pending" and self._mine(record.value):
                value = {k: v for k, v in record.value.items() if k != "claim"}
                value.update(status="error", error="interrupted")
                try:
                    await self._store.put_record(
                        claim.did, claim.skey, MESSAGE, claim.reply_key, value, swap_cid=record.cid
                    )
                except (InvalidSwap, StoreError) as exc:
                    log.warning("could not mark %s interrupted: %s", claim.reply_key, exc)
            await self._state.drop_claim(claim.did, claim.skey, claim.reply_key)
        window = self._settings().backfill_minutes * 60
        for request in await self._state.requests():
            await self._state.drop_request(
                request.did, request.skey, request.user_key, request.attempt
            )
            if time.time() - request.requested_at <= window:
                self.task_group.start_soon(self._start_quietly, request.did, request.skey, request.user_key)

    def _mine(self, value: Mapping[str, Any]) -> bool:
        """Whether a placeholder is this instance's claim (another runner may have won)."""
        claim = value.get("claim")
        return not isinstance(claim, str) or claim.startswith(self._state.instance_id + ":")

    async def _start_quietly(self, did: str, skey: str, user_key: str) -> None:
        try:
            await self.start_turn(did, skey, user_key)
        except StoreError as exc:
            log.warning("could not restart the turn of %s/%s: %s", skey, user_key, exc)

    # -- conversations and messages ----------------------------------------------------

    async def create_conversation(
        self, did: str, *, title: str | None = None, system_prompt: str | None = None
    ) -> str:
        skey = new_tid()
        info: dict[str, Any] = {"$type": INFO, "createdAt": now_iso()}
        if title:
            info["title"] = title
            info["titleSource"] = "user"
        if system_prompt:
            info["systemPrompt"] = system_prompt
        validate_record(INFO, info)  # before the space exists: nothing half-written
        await self._store.create_space(did, CONVERSATION, skey)
        await self._store.put_record(did, skey, INFO, "self", info)
        await self._touch_ref(did, skey, title)
        return skey

    async def post_message(
        self,
        did: str,
        skey: str,
        *,
        parent: str | None,
        parts: list[dict[str, Any]],
        generation: dict[str, Any] | None,
    ) -> PostResult:
        if await self._store.get_record(did, skey, INFO, "self") is None:
            raise RecordNotFound(f"no conversation {skey}")
        if parent is not None and await self._store.get_record(did, skey, MESSAGE, parent) is None:
            raise RecordNotFound(f"no message {parent} in conversation {skey}")
        key = new_tid()
        value: dict[str, Any] = {
            "$type": MESSAGE,
            "role": "user",
            "content": {"$type": PLAIN, "parts": parts},
            "createdAt": now_iso(),
        }
        if parent is not None:
            value["parent"] = parent
        if generation is not None:
            value["generation"] = {
                **{k: v for k, v in generation.items() if v is not None},
                "attempt": 0,
            }
        created = await self._store.create_record(did, skey, MESSAGE, key, value)
        if generation is None:
            await self._touch_ref(did, skey)
            return PostResult(key, None, None)
        # The conversationRef is touched when the reply is written.
        turn = await self._start(did, skey, created, fresh=True)
        return PostResult(key, reply_key(key, 0), turn)

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
        record = await self._store.get_record(did, skey, MESSAGE, key)
        # A record at a reply-shaped key is never a user message, whatever it says.
        if record is None or record.value.get("role") != "user" or parse_reply_key(key):
            raise RecordNotFound(f"no user message {key} in conversation {skey}")
        generation = dict(record.value.get("generation") or {})
        attempt = triggers.attempt_of(generation) + 1
        generation["attempt"] = attempt
        if model is not None:
            generation["model"] = model
        if effort is not None:
            generation["effort"] = effort
        value = {**record.value, "generation": generation}
        await self._store.put_record(did, skey, MESSAGE, key, value, swap_cid=record.cid)
        turn = await self.start_turn(did, skey, key)
        return reply_key(key, attempt), turn

    async def cancel(self, did: str, skey: str, reply: str) -> bool:
        running = self._running.get((did, skey, reply))
        if running is None:
            return False
        running.cancel_requested = True
        running.scope.cancel()
        return True

    def stream(self, did: str, skey: str, reply: str) -> StreamBuffer | None:
        return self._streams.get(did, skey, reply)

    # -- the direct-write trigger ------------------------------------------------------

    async def on_change(self, change: Change, owners: Mapping[str, Any]) -> None:
        """Apply the direct-write rules to one change of the store."""
        settings = self._settings()
        decision = triggers.decide(change, owners, settings.backfill_minutes)
        if decision is None:
            return
        if decision.error is not None:
            await self._error_reply(change.did, change.space, change.key, decision.attempt, decision.error)
            return
        reply = reply_key(change.key, decision.attempt)
        if self._streams.get(change.did, change.space, reply) is not None:
            return  # started here (a POST, or this feed earlier): nothing to read
        await self.start_turn(change.did, change.space, change.key)

    async def _error_reply(self, did: str, skey: str, key: str, attempt: int, message: str) -> None:
        value = {
            "$type": MESSAGE,
            "role": "assistant",
            "parent": key,
            "content": {"$type": PLAIN, "parts": []},
            "status": "error",
            "error": message[:3000],
            "createdAt": now_iso(),
        }
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

    async def _start(self, did: str, skey: str, record: Record, *, fresh: bool) -> str | None:
        """start_turn for a message already read; ``fresh``: just created, so unanswered."""
        user_key = record.key
        if parse_reply_key(user_key) is not None:
            return None  # reply keys belong to the runners (as in triggers.decide)
        generation = record.value.get("generation")
        if not isinstance(generation, dict) or record.value.get("role") != "user":
            return None
        attempt = triggers.attempt_of(generation)
        reply = reply_key(user_key, attempt)
        address = (did, skey, reply)
        start = self._starts.get(address)
        if start is None and not fresh:
            if await self._store.get_record(did, skey, MESSAGE, reply) is not None:
                return "answered"
            # Another caller (the change feed, a POST) may have started it during that read.
            start = self._starts.get(address)
        if start is None:
            if not self._accepting:
                # Shutting down: keep the request so the next start runs it.
                await self._state.add_request(did, skey, user_key, attempt)
                return "queued"
            start = self._starts[address] = _Start()
            if self._active == 0:
                self._idle = anyio.Event()
            self._active += 1
            self.task_group.start_soon(self._turn, did, skey, user_key, attempt, start)
        await start.done.wait()
        return start.result

    async def _turn(self, did: str, skey: str, user_key: str, attempt: int, start: _Start) -> None:
        address = (did, skey, reply_key(user_key, attempt))
        try:
            await self._claim_and_run(did, skey, user_key, attempt, start)
        except Exception:
            log.exception("turn %s/%s failed before it could finish", skey, address[2])
        finally:
            start.set(None)
            self._starts.pop(address, None)
            self._active -= 1
            if self._active == 0:
                self._idle.set()

    async def _claim_and_run(
        self, did: str, skey: str, user_key: str, attempt: int, start: _Start
    ) -> None:
        reply = reply_key(user_key, attempt)
        settings = self._settings()
        # 1. Load, once per turn.
        conversation = await self._load(did, skey)
        user_message = conversation.messages.get(user_key)
        if user_message is None:
            await self._state.drop_request(did, skey, user_key, attempt)
            return
        chain = branch(conversation.messages, user_key)
        generation = user_message.get("generation") or {}
        # 2. Choose the model and effort.
        model = choose_model(
            generation, chain[:-1], conversation.preferences, self._default_model
        )
        effort = choose_effort(generation, conversation.preferences)
        running = _Running(anyio.CancelScope())
        # 3. Rate limit: wait unclaimed.
        was_queued = not self._limiter.try_acquire(did, settings.rate_per_minute)
        if was_queued:
            running.queued = True
            running.buffer = self._streams.open(did, skey, reply)
            running.buffer.publish("queued", {})
            self._running[(did, skey, reply)] = running
            # Durable while it waits: a restart runs it if it is still young.
            await self._state.add_request(did, skey, user_key, attempt)
            start.set("queued")
            self.metrics.queue.inc()
            try:
                with running.scope:
                    await self._limiter.acquire(did, settings.rate_per_minute)
            finally:
                self.metrics.queue.dec()
                self._running.pop((did, skey, reply), None)
                running.queued = False
            if running.scope.cancel_called:
                if running.shutdown:
                    running.buffer.close()
                    return  # the request stays in turn_request for the next start
                running = _Running(anyio.CancelScope(), cancel_requested=True, buffer=running.buffer)
                running.scope.cancel()
        # 4. Claim.
        placeholder: dict[str, Any] = {
            "$type": MESSAGE,
            "role": "assistant",
            "parent": user_key,
            "content": {"$type": PLAIN, "parts": []},
            "model": model,
            "status": "pending",
            # Unique per claim: two runners' placeholders must never be the same bytes.
            "claim": f"{self._state.instance_id}:{secrets.token_hex(6)}",
            "createdAt": now_iso(),
        }
        if effort:
            placeholder["effort"] = effort
        # The stream opens before the placeholder is visible: a client that sees
        # `pending` and subscribes at once must find the live stream, not a stored status.
        running.buffer = running.buffer or self._streams.open(did, skey, reply)
        self._running[(did, skey, reply)] = running
        # The claim row goes first: a crash right after the create still finds it.
        await self._state.add_claim(did, skey, reply)
        try:
            claimed = await self._store.create_record(did, skey, MESSAGE, reply, placeholder)
        except RecordExists:
            self._running.pop((did, skey, reply), None)
            await self._state.drop_claim(did, skey, reply)
            await self._state.drop_request(did, skey, user_key, attempt)
            start.set("answered")
            await self._close_with_stored_status(did, skey, reply, running.buffer)
            return
        except BaseException:
            self._running.pop((did, skey, reply), None)
            running.buffer.close()
            raise
        start.set("claimed")
        if was_queued:
            await self._state.drop_request(did, skey, user_key, attempt)
        try:
            await self._generate(
                did, skey, reply, claimed.cid, placeholder, conversation, user_message, chain,
                model, effort, settings, running,
            )
        finally:
            self._running.pop((did, skey, reply), None)
        # Only once the final record is written: if that write failed (a store down for
        # longer than its retries), the claim stays and the next start marks it interrupted.
        await self._state.drop_claim(did, skey, reply)

    async def _generate(
        self,
        did: str,
        skey: str,
        reply: str,
        placeholder_cid: str,
        placeholder: dict[str, Any],
        conversation: _Conversation,
        user_message: dict[str, Any],
        chain: list[dict[str, Any]],
        model: dict[str, str],
        effort: str | None,
        settings: TurnSettings,
        running: _Running,
    ) -> None:
        assert running.buffer is not None
        buffer = running.buffer
        started = time.monotonic()
        parts = PartsBuilder(buffer)
        usage = Usage()
        status, error = "complete", None
        tool_names = self._tool_names(did, user_message)
        context = TurnContext(
            user=did,
            conversation=conversation_uri(did, skey),
            info=conversation.info,
            preferences=conversation.preferences,
            user_message=user_message,
            reply=placeholder,
            model=model,
            provider=model["provider"],
            effort=effort,
            tools=tool_names,
        )
        scope = running.scope
        scope.deadline = anyio.current_time() + settings.timeout_seconds
        cancelled = anyio.Event()
        self.metrics.running.inc()
        try:
            with scope:
                try:
                    # 5. Resolve the provider.
                    provider = self._clients.provider(model)
                    # 6. Build the prompt from the branch.
                    system = instructions(settings, conversation.preferences, conversation.info)
                    messages = await chat_messages(self._store, did, chain, system)
                    # 7. Filter.
                    messages = await self._plugins.filter(BEFORE_MODEL, messages, context)
                    # 8-9. Generate and stream.
                    assert self._http is not None
                    await run_steps(
                        self._clients.client(provider, settings.retries),
                        model=model["id"],
                        messages=messages,
                        tools=self._plugins.tools(tool_names),
                        effort=reasoning_effort(effort),
                        settings=settings,
                        parts=parts,
                        tool_context=ToolContext(did, context.conversation, cancelled, self._http),
                        usage=usage,
                    )
                except (TurnFailed, ModelResolutionError, HookError) as exc:
                    status, error = "error", scrub(str(exc), self._secrets)
                except Exception as exc:
                    log.exception("turn %s/%s failed", skey, reply)
                    status, error = "error", scrub(f"turnd failed: {type(exc).__name__}", self._secrets)
            if scope.cancel_called:
                cancelled.set()
                status = "cancelled"
                if not running.cancel_requested and not running.shutdown:
                    error = f"timed out after {settings.timeout_seconds:g} s"
        finally:
            self.metrics.running.dec()
        # 10. Finish; shielded so a shutdown cannot leave the reply pending.
        with anyio.CancelScope(shield=True):
            record = {**placeholder, "content": {"$type": PLAIN, "parts": parts.finish()}}
            del record["claim"]
            record["status"] = status
            if error:
                record["error"] = error
            if usage.record():
                record["usage"] = usage.record()
            context.reply = record
            try:
                record = await self._plugins.filter(AFTER_MODEL, record, context)
            except HookError as exc:
                record = {**record, "status": "error", "error": scrub(str(exc), self._secrets)}
            record = await self._write_final(did, skey, reply, record, placeholder_cid)
            self._running.pop((did, skey, reply), None)  # written: nothing left to cancel
            final = {"status": record["status"], "model": model}
            for name in ("error", "usage"):
                if name in record:
                    final[name] = record[name]
            buffer.publish("status", final)
            buffer.close()
            ttft = (
                parts.first_delta_at - started if parts.first_delta_at is not None else None
            )
            self._observe(did, skey, reply, model, record, ttft, time.monotonic() - started)
            await self._touch_ref(did, skey)
            context.reply = record
            try:
                await self._plugins.action(TURN_AFTER, context)
            except Exception:
                log.exception("turn:after hook failed for %s/%s", skey, reply)

    def _tool_names(self, did: str, user_message: Mapping[str, Any]) -> list[str]:
        generation = user_message.get("generation") or {}
        named = generation.get("tools")
        if isinstance(named, list):
            names = [n for n in named if isinstance(n, str)]
        else:
            names = list(self._user_tools.get(did, ()))
        return [t.name for t in self._plugins.tools(names)]

    # -- finishing -----------------------------------------------------------------------

    async def _write_final(
        self, did: str, skey: str, reply: str, record: dict[str, Any], swap_cid: str
    ) -> dict[str, Any]:
        """Put the final record; large tool outputs go to blobs; what cannot be stored is an error."""
        record = await fit_record(self._store, did, record)
        try:
            await self._store.put_record(did, skey, MESSAGE, reply, record, swap_cid=swap_cid)
            return record
        except InvalidSwap:
            log.warning("reply %s/%s was changed by someone else; not overwritten", skey, reply)
            return record
        except InvalidRecord as exc:
            fallback = {
                **record,
                "content": {"$type": PLAIN, "parts": []},
                "status": "error",
                "error": f"the reply could not be stored: {exc}"[:3000],
            }
            await self._store.put_record(did, skey, MESSAGE, reply, fallback, swap_cid=swap_cid)
            return fallback

    async def _close_with_stored_status(
        self, did: str, skey: str, reply: str, buffer: StreamBuffer
    ) -> None:
        record = await self._store.get_record(did, skey, MESSAGE, reply)
        status = record.value.get("status", "pending") if record else "pending"
        buffer.publish("status", {"status": status})
        buffer.close()

    def _observe(
        self,
        did: str,
        skey: str,
        reply: str,
        model: Mapping[str, str],
        record: Mapping[str, Any],
        ttft: float | None,
        duration: float,
    ) -> None:
        status = record["status"]
        self.metrics.turns.labels(status).inc()
        if ttft is not None:
            self.metrics.ttft.observe(ttft)
        usage = record.get("usage") or {}
        log.info(
            "turn %s/%s %s:%s %s",
            skey,
            reply,
            model["provider"],
            model["id"],
            status,
            extra={
                "turn": {
                    "conversation": skey,
                    "key": reply,
                    "model": f"{model['provider']}:{model['id']}",
                    "status": status,
                    "ttft_ms": round(ttft * 1000, 1) if ttft is not None else None,
                    "duration_ms": round(duration * 1000, 1),
                    "input_tokens": usage.get("inputTokens"),
                    "output_tokens": usage.get("outputTokens"),
                    "error": record.get("error"),
                }
            },
        )

    # -- reading -------------------------------------------------------------------------

    async def _load(self, did: str, skey: str) -> _Conversation:
        info = await self._store.get_record(did, skey, INFO, "self")
        preferences = await self._store.get_record(did, SETTINGS_SPACE, PREFERENCES, "self")
        messages: dict[str, dict[str, Any]] = {}
        cursor: str | None = None
        while True:
            page, cursor = await self._store.list_records(
                did, skey, MESSAGE, cursor=cursor, limit=100
            )
            for record in page:
                messages[record.key] = record.value
            if cursor is None or not page:
                break
        return _Conversation(
            info.value if info else None, preferences.value if preferences else None, messages
        )

    async def _touch_ref(self, did: str, skey: str, title: str | None = None) -> None:
        """Keep the settings space's conversationRef current (the listing reads it)."""
        try:
            existing = await self._store.get_record(did, SETTINGS_SPACE, CONVERSATION_REF, skey)
            value: dict[str, Any] = dict(existing.value) if existing else {
                "$type": CONVERSATION_REF,
                "conversation": conversation_uri(did, skey),
            }
            if title:
                value["title"] = title
            value["updatedAt"] = now_iso()
            if existing is None:
                await self._store.create_space(did, SETTINGS, SETTINGS_SPACE)
            await self._store.put_record(did, SETTINGS_SPACE, CONVERSATION_REF, skey, value)
        except StoreError as exc:
            log.warning("could not update the conversationRef of %s: %s", skey, exc)
