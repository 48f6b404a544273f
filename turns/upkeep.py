"""The engine's upkeep, once a minute: abandoned claims and the state file (SPEC §12);
at start-up, this process's own claims the last run left.

Pending replies too old for any live turn are rewritten ``error: "abandoned"``
(see :mod:`turns.abandoned` for which ones are tracked), and a state file deleted
while running is recreated with the claims and requests of this process's turns.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

import anyio

from recordstore import (
    CONVERSATION_REF,
    MESSAGE,
    SETTINGS_SPACE,
    InvalidSwap,
    RecordStore,
    StoreError,
)
from recordstore.keys import parse_reply_key
from turns import records
from turns.abandoned import PendingReplies, pending_since
from turns.metrics import TurnMetrics
from turns.settings import TurnSettings
from turns.state import StateDB
from turns.turn import Turn, TurnAddress

log = logging.getLogger("turnd.turns")


class Upkeep:
    def __init__(
        self,
        store: RecordStore,
        state: StateDB,
        settings: Callable[[], TurnSettings],
        running: dict[TurnAddress, Turn],
        metrics: TurnMetrics,
        interval: float = 60,
    ) -> None:
        self._store = store
        self._state = state
        self._settings = settings
        self._running = running  # the engine's running set, read only
        self._metrics = metrics
        self._interval = interval
        self._scope = anyio.CancelScope()
        self.pending = PendingReplies()
        self.accounts: list[str] = []  # scanned once, after start-up

    async def interrupt_claims(self) -> None:
        """At start-up: this process's claims left by the last run (a crash, a kill -9)
        whose replies are still pending become ``interrupted``; each claim row goes."""
        for claim in await self._state.claims():
            record = await self._store.get_record(claim.did, claim.skey, MESSAGE, claim.reply_key)
            if record is not None and record.value.get("status") == "pending" and self._mine(record.value):
                value = records.interrupted(record.value)
                try:
                    await self._store.put_record(
                        claim.did, claim.skey, MESSAGE, claim.reply_key, value, swap_cid=record.cid
                    )
                except (InvalidSwap, StoreError) as exc:
                    log.warning("could not mark %s interrupted: %s", claim.reply_key, exc)
            await self._state.drop_claim(claim.did, claim.skey, claim.reply_key)

    def _mine(self, value: Mapping[str, Any]) -> bool:
        """Whether a placeholder is this instance's claim (another runner may have won)."""
        claim = value.get("claim")
        return not isinstance(claim, str) or claim.startswith(self._state.instance_id + ":")

    def stop(self) -> None:
        self._scope.cancel()

    async def run(self) -> None:
        """Once a minute: sweep abandoned claims, check that the state file is still there."""
        with self._scope:
            scanned = False
            while True:
                await anyio.sleep(self._interval)
                try:
                    if not scanned:
                        for did in self.accounts:
                            await self.scan_pending(did)
                        scanned = True
                    await self.check_state_file()
                    await self.sweep_abandoned()
                except StoreError as exc:
                    log.warning("upkeep failed, trying again in a minute: %s", exc)

    async def scan_pending(self, did: str) -> None:
        """Note ``did``'s pending replies, conversation by conversation (references only)."""
        refs_cursor: str | None = None
        while True:
            refs, refs_cursor = await self._store.list_records(
                did, SETTINGS_SPACE, CONVERSATION_REF, cursor=refs_cursor, limit=100
            )
            for ref in refs:
                skey = str(ref.value.get("conversation", "")).rsplit("/", 1)[-1]
                cursor: str | None = None
                while skey:
                    page, cursor = await self._store.list_records(
                        did, skey, MESSAGE, cursor=cursor, limit=100
                    )
                    for record in page:
                        if parse_reply_key(record.key) is not None:
                            self.pending.note(did, skey, record.key, record.value)
                    if cursor is None or not page:
                        break
            if refs_cursor is None or not refs:
                return

    async def sweep_abandoned(self, now: datetime | None = None) -> int:
        """Rewrite pending replies too old for a live turn as ``error: "abandoned"``.

        A swap on the CID read makes exactly one runner win; the number this one
        rewrote is returned.
        """
        cutoff = (now or datetime.now(UTC)) - timedelta(
            seconds=self._settings().abandon_after_seconds
        )
        rewritten = 0
        for reply in self.pending.older_than(cutoff):
            parsed = parse_reply_key(reply.key)
            if parsed and TurnAddress(reply.did, reply.skey, *parsed) in self._running:
                continue  # ours and live (it cannot be this old, but never touch it)
            record = await self._store.get_record(reply.did, reply.skey, MESSAGE, reply.key)
            value = record.value if record is not None else None
            self.pending.note(reply.did, reply.skey, reply.key, value)
            since = pending_since(value)
            if record is None or since is None or since >= cutoff:
                continue  # finished, or rewritten meanwhile: not abandoned (yet)
            self.pending.forget(reply)
            try:
                await self._store.put_record(
                    reply.did, reply.skey, MESSAGE, reply.key,
                    records.interrupted(record.value, "abandoned"), swap_cid=record.cid,
                )
            except InvalidSwap:
                continue  # another runner won, or the reply was finished meanwhile
            log.warning("reply %s/%s was abandoned by its runner; marked error", reply.skey, reply.key)
            self._metrics.turns.labels("error").inc()
            rewritten += 1
        return rewritten

    async def check_state_file(self) -> None:
        """Recreate a deleted state file, with the claims and requests of this process's turns."""
        if not await self._state.ensure_file():
            return
        for address, turn in list(self._running.items()):
            if turn.queued:
                await self._state.add_request(
                    address.did, address.skey, address.user_key, address.attempt
                )
            else:
                await self._state.add_claim(address.did, address.skey, address.reply)
