"""Step 1 with step 4's claim row: the conversation, read while the row is written.

The claim row (in the state file) must only precede the placeholder, so that a
crash right after the create still finds it; its hop took as long as the load
(~1 ms at load, docs/performance-history.md, fourth round), so the two run side by side when
the row cannot be written on the loop's thread at once; when it can, it goes first. A
row left by a turn that claims nothing is dropped; one a crash leaves is dropped
at the next start (``TurnEngine.recover``).
"""

from __future__ import annotations

import contextlib

import anyio

from recordstore import Record, RecordStore
from turns import conversations
from turns.address import TurnAddress
from turns.conversations import Conversation
from turns.message_cache import MessageCache
from turns.state import StateDB

__all__ = ["load_with_claim_row"]


async def load_with_claim_row(
    store: RecordStore,
    state: StateDB,
    a: TurnAddress,
    info: Record | None = None,
    cache: MessageCache | None = None,
) -> Conversation:
    """The conversation of ``a``, with its claim row written meanwhile; the load's
    error first if both fail (the row is then dropped, as a stray one would be)."""
    if state.add_claim_at_once(a.did, a.skey, a.reply):
        # Written on the loop's thread, no hop to overlap: no task group to run it in.
        try:
            return await conversations.load(store, a.did, a.skey, info, cache)
        except Exception:
            with contextlib.suppress(Exception):  # a stray row is harmless (see above)
                await state.drop_claim(a.did, a.skey, a.reply)
            raise
    failed: list[Exception] = []

    async def claim_row() -> None:
        try:
            await state.add_claim(a.did, a.skey, a.reply)
        except Exception as exc:  # noqa: BLE001 - raised below, as the load's would be
            failed.append(exc)

    conversation: Conversation | None = None
    async with anyio.create_task_group() as tg:
        tg.start_soon(claim_row)
        try:
            conversation = await conversations.load(store, a.did, a.skey, info, cache)
        except Exception as exc:  # noqa: BLE001 - raised below, after the row's write
            failed.insert(0, exc)
    if conversation is None or failed:
        if conversation is None:
            with contextlib.suppress(Exception):  # a stray row is harmless (see above)
                await state.drop_claim(a.did, a.skey, a.reply)
        raise failed[0]
    return conversation
