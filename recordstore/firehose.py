"""The change feed of the pds store: ``com.atproto.sync.subscribeRepos`` plus a sweep.

One firehose per PDS (the accounts a :class:`~recordstore.pds.PdsStore` serves may live on
several), through the SDK's ``AsyncFirehoseSubscribeReposClient``. Commits of the served
DIDs touching ``network.sharedcomputer.chat.*`` become :class:`~recordstore.Change` ops,
their records decoded from the commit's CAR blocks.

Cursors. The feed's cursor is a JSON object ``{"<pds url>": <seq>, ...}``: per PDS, the
sequence number of the last commit whose ops were all *handed to the consumer*. Because it
is built when a change is yielded, it is never ahead of what the consumer handled; within a
commit of several ops, all but the last carry the previous position, so a consumer that
stops half-way through a commit sees its remaining ops again. The SDK client reconnects
with the cursor it was given unless moved on, so it is moved (``update_params``) after each
handled commit.

Gaps. A cursor older than what the PDS keeps (``OutdatedCursor``) or ahead of it
(``FutureCursor``, e.g. a reset PDS) means ops were lost; so does anything else going
wrong between the PDS and us. Each ``sweep_interval`` the feed compares every served
repo's current revision (``getLatestCommit``) with the last one the firehose delivered;
a repo still behind at the next check, or known to have lost ops, is swept: its chat
records are listed and whatever differs from what the feed last reported is emitted
(``live=False``). The firehose and the sweep share one record of "last reported state"
per key, so neither repeats what the other already said.

``live`` is False for ops the PDS sequenced before this feed started (a catch-up from a
stored cursor) and for everything a sweep finds; True for the rest.

One PDS being unreachable only stalls its own firehose (reconnected with backoff); the
others go on.
"""

from __future__ import annotations

import json
import logging
import random
from collections.abc import AsyncIterator, Sequence
from contextlib import aclosing, asynccontextmanager
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any, Protocol

import anyio
from anyio.abc import TaskGroup
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from atproto_core.car import CAR
from atproto_firehose import AsyncFirehoseSubscribeReposClient, parse_subscribe_repos_message
from atproto_subscription.exceptions import SubscriptionError
from atproto_subscription.frames import MessageFrame

from recordstore import (
    CONVERSATION_REF,
    INFO,
    MESSAGE,
    NSID,
    PREFERENCES,
    Change,
    InvalidKey,
    InvalidRecord,
    Op,
    Record,
    StoreError,
)
from recordstore.cid import ipld_to_json
from recordstore.keys import split_repo_rkey
from recordstore.lexicon import validate_record

__all__ = ["FeedAccount", "FeedSource", "PdsFeed", "decode_cursor", "encode_cursor"]


class FeedAccount(Protocol):
    """One account the feed follows."""

    @property
    def did(self) -> str | None: ...
    @property
    def identifier(self) -> str: ...
    @property
    def logged_in(self) -> bool: ...
    @property
    def endpoint(self) -> str:
        """The PDS its repo is on (known once logged in)."""
        ...


class FeedSource(Protocol):
    """What the feed needs of the store it follows (:class:`~recordstore.pds.PdsStore`)."""

    def feed_accounts(self) -> Sequence[FeedAccount]: ...
    async def log_in(self, account: FeedAccount) -> None: ...
    async def get_record(
        self, did: str, space: str, collection: str, key: str
    ) -> Record | None: ...
    def iter_repo(
        self, did: str, collection: str
    ) -> AsyncIterator[tuple[str, str, dict[str, Any]]]: ...
    async def latest_rev(self, did: str) -> str: ...

log = logging.getLogger(__name__)

CHAT_PREFIX = f"{NSID}."
SWEPT_COLLECTIONS = (MESSAGE, INFO, PREFERENCES, CONVERSATION_REF)
_BACKOFF_MAX = 30.0
_HEALTHY_SECONDS = 30.0  # a connection that lived this long resets the backoff
# The SDK client reconnects by itself (a refused or dropped connection never reaches our
# loop) after 2, 4, ... up to 64 s: a PDS restarted after 30 s went unnoticed for another
# 30. Its delays are capped here, so a restarted PDS is followed again within seconds.
_RECONNECT_MAX = 5.0


class _FirehoseClient(AsyncFirehoseSubscribeReposClient):
    """The SDK's client with its own reconnection delays capped (see ``_RECONNECT_MAX``)."""

    def _get_reconnection_delay(self) -> float:
        return min(_RECONNECT_MAX, _backoff(self._reconnect_no))


def encode_cursor(positions: dict[str, int]) -> str:
    return json.dumps(dict(sorted(positions.items())), separators=(",", ":"))


def decode_cursor(cursor: str | None) -> dict[str, int]:
    if cursor is None:
        return {}
    try:
        positions = json.loads(cursor)
    except ValueError:
        positions = None
    if not isinstance(positions, dict) or not all(
        isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) and v >= 0
        for k, v in positions.items()
    ):
        raise StoreError(f'invalid change-feed cursor {cursor!r} (expected {{"<pds>": seq}})')
    return positions


@dataclass(slots=True)
class _Item:
    """A change on its way to the consumer, with the firehose position it completes."""

    endpoint: str
    seq: int | None  # None: a sweep's change, which moves no cursor
    completes: bool  # the last op of its commit: handling it handles the commit
    change: Change


@dataclass(slots=True)
class _Known:
    cid: str
    rev: str  # the repo revision at which this state was seen


class _Endpoint:
    """One PDS: its firehose, its sweeps, and what was last reported for each key."""

    def __init__(
        self,
        feed: PdsFeed,
        endpoint: str,
        dids: set[str],
        cursor: int | None,
        send: MemoryObjectSendStream[_Item],
    ) -> None:
        self.feed = feed
        self.store = feed.store
        self.endpoint = endpoint
        self.dids = dids
        self.cursor = cursor  # the last seq read from the firehose (sent on reconnect)
        self.send = send
        self.known: dict[tuple[str, str, str], _Known] = {}  # (did, collection, rkey)
        self.fh_rev: dict[str, str] = {}  # did -> last revision the firehose delivered
        self.lag: dict[str, str] = {}  # did -> a revision the firehose had not reached
        self.needs_sweep: set[str] = set()  # dids known to have lost ops
        self.sweep_now = anyio.Event()
        self.waiting_on_consumer = False  # the firehose is blocked handing over a commit

    # -- firehose ---------------------------------------------------------------------

    async def run_firehose(self) -> None:
        failures = 0
        while True:
            started = anyio.current_time()
            params: dict[str, Any] = {} if self.cursor is None else {"cursor": self.cursor}
            # recv_timeout=None: an idle repo is not a dead connection (websockets' pings
            # find those); the SDK's timeout would reconnect every idle half minute.
            client = _FirehoseClient(params, base_uri=_ws_base(self.endpoint), recv_timeout=None)
            self.client = client
            try:
                await client.start(self._on_frame)
                log.info("firehose %s closed by the PDS; reconnecting", self.endpoint)
            except SubscriptionError as e:
                name = getattr(e.args[0], "error", None) if e.args else None
                if name == "FutureCursor":
                    # The PDS never sequenced our cursor (reset, or another PDS).
                    log.warning(
                        "firehose %s: cursor %s is ahead of the PDS; resetting",
                        self.endpoint,
                        self.cursor,
                    )
                    self.from_start()
                else:
                    log.warning("firehose %s: %s", self.endpoint, e)
            except Exception as e:  # noqa: BLE001 - any failure: reconnect, never stop the feed
                log.warning("firehose %s failed: %s: %s", self.endpoint, type(e).__name__, e)
            failures = 0 if anyio.current_time() - started > _HEALTHY_SECONDS else failures + 1
            await anyio.sleep(_backoff(failures))

    async def _send(self, item: _Item) -> None:
        try:
            await self.send.send(item)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            # The consumer closed the feed; its cancellation of this task is on the way.
            await anyio.sleep_forever()

    def from_start(self) -> None:
        """No usable position on this PDS: replay all the firehose still holds (from seq 0,
        so nothing falls between a sweep and the connection) and sweep every repo for what
        it no longer holds. ``known`` keeps the two from reporting a state twice."""
        self.cursor = 0
        self._lost_everything()

    def _lost_everything(self) -> None:
        self.needs_sweep |= self.dids
        self.sweep_now.set()

    async def _on_frame(self, frame: MessageFrame) -> None:
        # The SDK swallows (prints) what this raises, so nothing may escape but cancellation.
        try:
            message = parse_subscribe_repos_message(frame)
        except Exception as e:  # noqa: BLE001
            log.warning("firehose %s: undecodable %s frame: %s", self.endpoint, frame.type, e)
            return
        kind = frame.type
        if kind == "#info":
            if getattr(message, "name", None) == "OutdatedCursor":
                log.warning(
                    "firehose %s: cursor %s is older than the PDS keeps; sweeping",
                    self.endpoint,
                    self.cursor,
                )
                self._lost_everything()
            return
        seq = getattr(message, "seq", None)
        if kind == "#commit":
            await self._on_commit(message)
        elif kind == "#sync" and message.did in self.dids:
            # The repo was reset to a new state: only a sweep can tell what changed.
            self.needs_sweep.add(message.did)
            self.sweep_now.set()
        if isinstance(seq, int):
            self.cursor = seq
            self.client.update_params({"cursor": seq})

    async def _on_commit(self, commit: Any) -> None:
        did = commit.repo
        if did not in self.dids:
            return
        # Received is delivered, as far as the gap check is concerned.
        if did not in self.fh_rev or commit.rev > self.fh_rev[did]:
            self.fh_rev[did] = commit.rev
        ops = [op for op in commit.ops if op.path.startswith(CHAT_PREFIX)]
        if ops:
            try:
                blocks = CAR.from_bytes(commit.blocks).blocks if commit.blocks else {}
            except Exception as e:  # noqa: BLE001
                log.warning("firehose %s: bad CAR in commit %s: %s", self.endpoint, commit.seq, e)
                blocks = {}
            live = _parse_time(commit.time) >= self.feed.started
            changes: list[Change] = []
            for op in ops:
                change = await self._op_change(did, commit.rev, op, blocks, live)
                if change is not None:
                    changes.append(change)
            if not changes:
                changes_or_nothing = [_NOTHING]
            else:
                changes_or_nothing = changes
            self.waiting_on_consumer = True
            try:
                last = len(changes_or_nothing) - 1
                for i, change in enumerate(changes_or_nothing):
                    await self._send(_Item(self.endpoint, commit.seq, i == last, change))
            finally:
                self.waiting_on_consumer = False

    async def _op_change(
        self, did: str, rev: str, op: Any, blocks: dict[Any, Any], live: bool
    ) -> Change | None:
        collection, _, rkey = op.path.partition("/")
        try:
            space, key = split_repo_rkey(rkey)
        except InvalidKey:
            return None  # not in the classic-repo layout: not a record turnd reads
        known_key = (did, collection, rkey)
        before = self.known.get(known_key)
        if op.action == "delete":
            if before is None and did in self.feed.complete:
                return None  # already reported gone (by a sweep)
            if before is not None and before.rev > rev:
                return None  # a replayed delete, older than what a sweep reported
            self.known.pop(known_key, None)
            return _change(did, space, collection, key, "delete", None, None, live)
        cid = str(op.cid)
        if before is not None and (before.cid == cid or before.rev > rev):
            return None  # already reported: this state, or (by a sweep) a newer one
        self.known[known_key] = _Known(cid, rev)
        block = blocks.get(op.cid)
        value = ipld_to_json(block) if block is not None else None
        if value is None:
            # The commit did not carry the block (too big): read the record itself.
            try:
                got = await self.store.get_record(did, space, collection, key)
            except StoreError as e:
                log.warning("firehose: cannot read %s/%s: %s", collection, rkey, e)
                got = None
            if got is None:
                return None
            value = got.value
        op_kind: Op = "create" if op.action == "create" else "update"
        return _change(did, space, collection, key, op_kind, cid, value, live)

    # -- sweeps -------------------------------------------------------------------------

    async def run_sweeps(self) -> None:
        interval = self.feed.sweep_interval
        while True:
            with anyio.move_on_after(interval):
                await self.sweep_now.wait()
            self.sweep_now = anyio.Event()
            for did in sorted(self.dids):
                try:
                    await self._check(did)
                except StoreError as e:
                    log.warning("sweep of %s on %s: %s", did, self.endpoint, e)
                except Exception as e:  # noqa: BLE001 - one repo's failure stops no other
                    log.warning("sweep of %s failed: %s: %s", did, type(e).__name__, e)

    async def _check(self, did: str) -> None:
        head = await self.store.latest_rev(did)
        if did not in self.needs_sweep:
            seen = self.fh_rev.get(did)
            if seen is None:
                # Nothing delivered yet: take the repo as current now (a stored cursor
                # replays anything after it); later checks compare against this.
                self.fh_rev[did] = head
                return
            if head <= seen:
                self.lag.pop(did, None)
                return
            target = self.lag.get(did)
            if target is None or seen >= target or self.waiting_on_consumer:
                # (A firehose held up by a slow consumer is not a lost one.)
                # Behind, but maybe only in flight: the firehose has one interval to
                # reach this revision.
                self.lag[did] = head
                return
            log.warning(
                "firehose %s: %s stuck before revision %s; sweeping", self.endpoint, did, target
            )
        await self._sweep(did, head)

    async def _sweep(self, did: str, head: str) -> None:
        """Report what differs between the repo (at ``head`` or later) and ``known``."""
        listed: set[tuple[str, str, str]] = set()
        for collection in SWEPT_COLLECTIONS:
            async for rkey, cid, value in self.store.iter_repo(did, collection):
                try:
                    space, key = split_repo_rkey(rkey)
                except InvalidKey:
                    continue
                known_key = (did, collection, rkey)
                listed.add(known_key)
                before = self.known.get(known_key)
                if before is not None and (before.cid == cid or before.rev > head):
                    continue  # already reported, or the firehose knows something newer
                self.known[known_key] = _Known(cid, head)
                op: Op = "create" if before is None else "update"
                change = _change(did, space, collection, key, op, cid, value, False)
                await self._send(_Item(self.endpoint, None, False, change))
        for known_key, state in list(self.known.items()):
            if known_key[0] != did or known_key in listed or state.rev > head:
                continue
            if known_key[1] not in SWEPT_COLLECTIONS:
                continue
            del self.known[known_key]
            space, key = split_repo_rkey(known_key[2])
            change = _change(did, space, known_key[1], key, "delete", None, None, False)
            await self._send(_Item(self.endpoint, None, False, change))
        self.feed.complete.add(did)
        self.needs_sweep.discard(did)
        self.lag.pop(did, None)
        if did not in self.fh_rev or head > self.fh_rev[did]:
            self.fh_rev[did] = head


# Stands for a commit of served chat ops that all turned out to need no report; it moves
# the cursor and is never yielded.
_NOTHING = Change("", "", "", "", "create", None, None, None, "", False)


class PdsFeed:
    """The change feed of a :class:`~recordstore.pds.PdsStore` (see the module doc)."""

    def __init__(self, store: FeedSource, *, sweep_interval: float = 60.0) -> None:
        self.store = store
        self.sweep_interval = sweep_interval
        self.started = datetime.now(UTC)
        self.complete: set[str] = set()  # DIDs swept in full: `known` is their whole state

    @asynccontextmanager
    async def changes(self, cursor: str | None = None) -> AsyncIterator[AsyncIterator[Change]]:
        """The feed from just after ``cursor``, running while the ``async with`` lasts."""
        positions = decode_cursor(cursor)
        handled = dict(positions)
        self.started = datetime.now(UTC)
        send, receive = anyio.create_memory_object_stream[_Item](0)
        failure: Exception | None = None
        with send, receive:
            async with anyio.create_task_group() as tg:
                await self._start_endpoints(tg, positions, send, from_start=cursor is None)
                try:
                    async with aclosing(self._deliver(receive, handled)) as feed:
                        yield feed
                except Exception as exc:
                    # The consumer's own error: raised as it is once the feed has stopped,
                    # not wrapped in the task group's exception group.
                    failure = exc
                finally:
                    tg.cancel_scope.cancel()
        if failure is not None:
            raise failure

    @staticmethod
    async def _deliver(
        receive: MemoryObjectReceiveStream[_Item], handled: dict[str, int]
    ) -> AsyncIterator[Change]:
        async for item in receive:
            if item.seq is not None and item.completes:
                handled[item.endpoint] = item.seq
            if item.change is not _NOTHING:
                yield replace(item.change, cursor=encode_cursor(handled))

    async def _start_endpoints(
        self,
        tg: TaskGroup,
        positions: dict[str, int],
        send: MemoryObjectSendStream[_Item],
        *,
        from_start: bool,
    ) -> None:
        by_endpoint: dict[str, set[str]] = {}
        for account in self.store.feed_accounts():
            if not account.logged_in:
                tg.start_soon(self._start_late, tg, account, positions, send, from_start)
                continue
            assert account.did is not None
            by_endpoint.setdefault(account.endpoint, set()).add(account.did)
        for endpoint, dids in by_endpoint.items():
            self._start_endpoint(tg, endpoint, dids, positions, send, from_start)

    def _start_endpoint(
        self,
        tg: TaskGroup,
        endpoint: str,
        dids: set[str],
        positions: dict[str, int],
        send: MemoryObjectSendStream[_Item],
        from_start: bool,
    ) -> None:
        ep = _Endpoint(self, endpoint, dids, positions.get(endpoint), send)
        if from_start or endpoint not in positions:
            ep.from_start()
        tg.start_soon(ep.run_firehose)
        tg.start_soon(ep.run_sweeps)

    async def _start_late(
        self,
        tg: TaskGroup,
        account: FeedAccount,
        positions: dict[str, int],
        send: MemoryObjectSendStream[_Item],
        from_start: bool,
    ) -> None:
        """An account whose PDS was down at open: keep logging in, then feed it."""
        failures = 0
        while not account.logged_in:
            try:
                await self.store.log_in(account)
            except Exception as e:  # noqa: BLE001 - unreachable or refused: try again later
                failures += 1
                log.warning("%s: login failed, retrying: %s", account.identifier, e)
                await anyio.sleep(_backoff(failures))
        assert account.did is not None
        self._start_endpoint(tg, account.endpoint, {account.did}, positions, send, from_start)


def _change(
    did: str,
    space: str,
    collection: str,
    key: str,
    op: Op,
    cid: str | None,
    value: dict[str, Any] | None,
    live: bool,
) -> Change:
    error = None
    if value is not None:
        try:
            validate_record(collection, value)
        except InvalidRecord as e:
            error = str(e)
    return Change(did, space, collection, key, op, cid, value, error, "", live)


def _ws_base(endpoint: str) -> str:
    if endpoint.startswith("https://"):
        return "wss://" + endpoint[len("https://") :] + "/xrpc"
    if endpoint.startswith("http://"):
        return "ws://" + endpoint[len("http://") :] + "/xrpc"
    return endpoint + "/xrpc"


def _parse_time(value: str) -> datetime:
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except (AttributeError, ValueError):
        return datetime.now(UTC)


def _backoff(failures: int) -> float:
    if failures <= 0:
        return 0.0
    return min(_BACKOFF_MAX, 0.25 * 2 ** (failures - 1)) * random.uniform(0.8, 1.2)
