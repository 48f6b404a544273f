"""Which turn: its address (account, conversation, user message, attempt) and its start."""

from __future__ import annotations

from dataclasses import dataclass, field

import anyio

from recordstore import Record
from recordstore.keys import reply_key
from turns import records


@dataclass(frozen=True, slots=True)
class TurnAddress:
    """Which turn: the account, the conversation's space key, the user message and attempt.

    ``reply`` is the key the turn answers at (``<user_key>.r<attempt>``).
    """

    did: str
    skey: str
    user_key: str
    attempt: int
    reply: str = field(init=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "reply", reply_key(self.user_key, self.attempt))

    @property
    def conversation_uri(self) -> str:
        return records.conversation_uri(self.did, self.skey)


class Start:
    """An in-flight start: callers wait for the claim's outcome."""

    def __init__(self, info: Record | None = None) -> None:
        # The conversation's info as its POST read it a moment ago: the load reads no other.
        self.info = info
        self.done = anyio.Event()
        self.finished = anyio.Event()  # the turn has ended (its final record is written)
        self.result: str | None = None

    def set(self, result: str | None) -> None:
        if not self.done.is_set():
            self.result = result
            self.done.set()
