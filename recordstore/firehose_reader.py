"""The firehose of one PDS, read: ``com.atproto.sync.subscribeRepos`` frames, their
commits, and each chat op's record out of the commit's CAR blocks, as changes.

The SDK client reconnects with the cursor it was given unless moved on, so it is moved
(``update_params``) after each handled frame; a connection that fails is opened again
with backoff, and the feed never stops over it.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any

import anyio
from atproto_client.models import ComAtprotoSyncSubscribeRepos as SubscribeRepos
from atproto_client.models.common import XrpcError
from atproto_core.car import CAR
from atproto_firehose import AsyncFirehoseSubscribeReposClient, parse_subscribe_repos_message
from atproto_subscription.exceptions import SubscriptionError
from atproto_subscription.frames import MessageFrame

from recordstore import NSID, Change, InvalidKey, Op, StoreError
from recordstore.cid import ipld_to_json
from recordstore.feed_state import NOTHING, Endpoint, Item, Known, backoff, make_change
from recordstore.keys import split_repo_rkey

__all__ = ["CHAT_PREFIX", "FirehoseReader"]

log = logging.getLogger("recordstore.firehose")  # one logger for the whole feed

CHAT_PREFIX = f"{NSID}."
_HEALTHY_SECONDS = 30.0  # a connection that lived this long resets the backoff
# The SDK client reconnects by itself (a refused or dropped connection never reaches our
# loop) after 2, 4, ... up to 64 s: a PDS restarted after 30 s went unnoticed for another
# 30. Its delays are capped here, so a restarted PDS is followed again within seconds.
_RECONNECT_MAX = 5.0


class _FirehoseClient(AsyncFirehoseSubscribeReposClient):
    """The SDK's client with its own reconnection delays capped (see ``_RECONNECT_MAX``)."""

    def _get_reconnection_delay(self) -> float:
        return min(_RECONNECT_MAX, backoff(self._reconnect_no))


class FirehoseReader:
    """Reads the firehose of ``ep``'s PDS into its feed, for as long as it runs."""

    def __init__(self, ep: Endpoint) -> None:
        self.ep = ep
        self.client: _FirehoseClient | None = None

    async def run(self) -> None:
        ep = self.ep
        failures = 0
        while True:
            started = anyio.current_time()
            params: dict[str, Any] = {} if ep.cursor is None else {"cursor": ep.cursor}
            # recv_timeout=None: an idle repo is not a dead connection (websockets' pings
            # find those); the SDK's timeout would reconnect every idle half minute.
            client = _FirehoseClient(params, base_uri=_ws_base(ep.endpoint), recv_timeout=None)
            self.client = client
            try:
                await client.start(self._on_frame)
                log.info("firehose %s closed by the PDS; reconnecting", ep.endpoint)
            except SubscriptionError as e:
                if _error_name(e) == "FutureCursor":
                    # The PDS never sequenced our cursor (reset, or another PDS).
                    log.warning(
                        "firehose %s: cursor %s is ahead of the PDS; resetting",
                        ep.endpoint,
                        ep.cursor,
                    )
                    ep.from_start()
                else:
                    log.warning("firehose %s: %s", ep.endpoint, e)
            except Exception as e:  # noqa: BLE001 - any failure: reconnect, never stop the feed
                log.warning("firehose %s failed: %s: %s", ep.endpoint, type(e).__name__, e)
            failures = 0 if anyio.current_time() - started > _HEALTHY_SECONDS else failures + 1
            await anyio.sleep(backoff(failures))

    async def _on_frame(self, frame: MessageFrame) -> None:
        ep = self.ep
        # The SDK swallows (prints) what this raises, so nothing may escape but cancellation.
        try:
            message = parse_subscribe_repos_message(frame)
        except Exception as e:  # noqa: BLE001
            log.warning("firehose %s: undecodable %s frame: %s", ep.endpoint, frame.type, e)
            return
        if isinstance(message, SubscribeRepos.Info):
            if message.name == "OutdatedCursor":
                log.warning(
                    "firehose %s: cursor %s is older than the PDS keeps; sweeping",
                    ep.endpoint,
                    ep.cursor,
                )
                ep.lost_everything()
            return
        if isinstance(message, SubscribeRepos.Commit):
            await self._on_commit(message)
        elif isinstance(message, SubscribeRepos.Sync) and message.did in ep.dids:
            # The repo was reset to a new state: only a sweep can tell what changed.
            ep.needs_sweep.add(message.did)
            ep.sweep_now.set()
        # Every message but #info is sequenced.
        ep.cursor = message.seq
        assert self.client is not None  # the frame came from it
        self.client.update_params({"cursor": message.seq})

    async def _on_commit(self, commit: SubscribeRepos.Commit) -> None:
        ep = self.ep
        did = commit.repo
        if did not in ep.dids:
            return
        # Received is delivered, as far as the gap check is concerned.
        if did not in ep.fh_rev or commit.rev > ep.fh_rev[did]:
            ep.fh_rev[did] = commit.rev
        ops = [op for op in commit.ops if op.path.startswith(CHAT_PREFIX)]
        if ops:
            try:
                blocks = CAR.from_bytes(commit.blocks).blocks if commit.blocks else {}
            except Exception as e:  # noqa: BLE001
                log.warning("firehose %s: bad CAR in commit %s: %s", ep.endpoint, commit.seq, e)
                blocks = {}
            live = _parse_time(commit.time) >= ep.started
            changes: list[Change] = []
            for op in ops:
                change = await self._op_change(did, commit.rev, op, blocks, live)
                if change is not None:
                    changes.append(change)
            if not changes:
                changes_or_nothing = [NOTHING]
            else:
                changes_or_nothing = changes
            ep.waiting_on_consumer = True
            try:
                last = len(changes_or_nothing) - 1
                for i, change in enumerate(changes_or_nothing):
                    await ep.hand_over(Item(ep.endpoint, commit.seq, i == last, change))
            finally:
                ep.waiting_on_consumer = False

    async def _op_change(
        self, did: str, rev: str, op: SubscribeRepos.RepoOp, blocks: dict[Any, Any], live: bool
    ) -> Change | None:
        ep = self.ep
        collection, _, rkey = op.path.partition("/")
        try:
            space, key = split_repo_rkey(rkey)
        except InvalidKey:
            return None  # not in the classic-repo layout: not a record turnd reads
        known_key = (did, collection, rkey)
        before = ep.known.get(known_key)
        if op.action == "delete":
            if before is None and did in ep.complete:
                return None  # already reported gone (by a sweep)
            if before is not None and before.rev > rev:
                return None  # a replayed delete, older than what a sweep reported
            ep.known.pop(known_key, None)
            return make_change(did, space, collection, key, "delete", None, None, live)
        cid = str(op.cid)
        if before is not None and (before.cid == cid or before.rev > rev):
            return None  # already reported: this state, or (by a sweep) a newer one
        ep.known[known_key] = Known(cid, rev)
        block = blocks.get(op.cid)
        value = ipld_to_json(block) if block is not None else None
        if value is None:
            # The commit did not carry the block (too big): read the record itself.
            try:
                got = await ep.store.get_record(did, space, collection, key)
            except StoreError as e:
                log.warning("firehose: cannot read %s/%s: %s", collection, rkey, e)
                got = None
            if got is None:
                return None
            value = got.value
        op_kind: Op = "create" if op.action == "create" else "update"
        return make_change(did, space, collection, key, op_kind, cid, value, live)


def _error_name(e: SubscriptionError) -> str | None:
    """The XRPC error an error frame carried (``FutureCursor``, ...), if it was one."""
    detail = e.args[0] if e.args else None
    return detail.error if isinstance(detail, XrpcError) else None


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
