"""The pds change feed's sweeps: each ``sweep_interval``, every served repo's revision
(``getLatestCommit``) against the last one its firehose delivered.

A repo still behind at the next check, or known to have lost ops, is swept: its chat
records are listed and whatever differs from what the feed last reported is emitted
(``live=False``).
"""

from __future__ import annotations

import logging

import anyio

from recordstore import CONVERSATION_REF, INFO, MESSAGE, PREFERENCES, InvalidKey, Op, StoreError
from recordstore.feed_state import Endpoint, Item, Known, make_change
from recordstore.keys import split_repo_rkey

__all__ = ["SWEPT_COLLECTIONS", "RepoSweeper"]

log = logging.getLogger("recordstore.firehose")  # one logger for the whole feed

SWEPT_COLLECTIONS = (MESSAGE, INFO, PREFERENCES, CONVERSATION_REF)


class RepoSweeper:
    """Checks, and when behind sweeps, the repos of ``ep``'s PDS every ``interval`` s."""

    def __init__(self, ep: Endpoint, interval: float) -> None:
        self.ep = ep
        self.interval = interval

    async def run(self) -> None:
        ep = self.ep
        interval = self.interval
        while True:
            with anyio.move_on_after(interval):
                await ep.sweep_now.wait()
            ep.sweep_now = anyio.Event()
            for did in sorted(ep.dids):
                try:
                    await self._check(did)
                except StoreError as e:
                    log.warning("sweep of %s on %s: %s", did, ep.endpoint, e)
                except Exception as e:  # noqa: BLE001 - one repo's failure stops no other
                    log.warning("sweep of %s failed: %s: %s", did, type(e).__name__, e)

    async def _check(self, did: str) -> None:
        ep = self.ep
        head = await ep.store.latest_rev(did)
        if did not in ep.needs_sweep:
            seen = ep.fh_rev.get(did)
            if seen is None:
                # Nothing delivered yet: take the repo as current now (a stored cursor
                # replays anything after it); later checks compare against this.
                ep.fh_rev[did] = head
                return
            if head <= seen:
                ep.lag.pop(did, None)
                return
            target = ep.lag.get(did)
            if target is None or seen >= target or ep.waiting_on_consumer:
                # (A firehose held up by a slow consumer is not a lost one.)
                # Behind, but maybe only in flight: the firehose has one interval to
                # reach this revision.
                ep.lag[did] = head
                return
            log.warning(
                "firehose %s: %s stuck before revision %s; sweeping", ep.endpoint, did, target
            )
        await self._sweep(did, head)

    async def _sweep(self, did: str, head: str) -> None:
        """Report what differs between the repo (at ``head`` or later) and ``known``."""
        ep = self.ep
        listed: set[tuple[str, str, str]] = set()
        for collection in SWEPT_COLLECTIONS:
            async for rkey, cid, value in ep.store.iter_repo(did, collection):
                try:
                    space, key = split_repo_rkey(rkey)
                except InvalidKey:
                    continue
                known_key = (did, collection, rkey)
                listed.add(known_key)
                before = ep.known.get(known_key)
                if before is not None and (before.cid == cid or before.rev > head):
                    continue  # already reported, or the firehose knows something newer
                ep.known[known_key] = Known(cid, head)
                op: Op = "create" if before is None else "update"
                change = make_change(did, space, collection, key, op, cid, value, False)
                await ep.hand_over(Item(ep.endpoint, None, False, change))
        for known_key, state in list(ep.known.items()):
            if known_key[0] != did or known_key in listed or state.rev > head:
                continue
            if known_key[1] not in SWEPT_COLLECTIONS:
                continue
            del ep.known[known_key]
            space, key = split_repo_rkey(known_key[2])
            change = make_change(did, space, known_key[1], key, "delete", None, None, False)
            await ep.hand_over(Item(ep.endpoint, None, False, change))
        ep.complete.add(did)
        ep.needs_sweep.discard(did)
        ep.lag.pop(did, None)
        if did not in ep.fh_rev or head > ep.fh_rev[did]:
            ep.fh_rev[did] = head
