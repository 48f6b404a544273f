"""Asking the other instances about a reply: cancel it, or mirror its stream.

Every instance subscribes to one broadcast channel and to a channel of its own.
A request goes to the broadcast channel; ``PUBLISH`` answers how many instances
heard it, and each of them answers on the asker's channel whether it runs that
reply (and, for a cancel, has cancelled it). So the asker knows within a round
trip or two: yes as soon as the runner answers, no once every other instance
has said no — never by waiting out a timeout while the cluster is healthy.
Redis carries the question; the runner alone decides, from its own running set.

An answer is a rank, not a yes: for a stream, 2 is "I hold its claim", 1 "I have
it queued" (two instances' change feeds may both queue one message; the claim
decides later), 0 "not here". The asker takes the best answer.
"""

from __future__ import annotations

import json
import logging
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import anyio

from turns.cluster.link import RedisLink

log = logging.getLogger("turnd.cluster")

# An instance that has not answered by then is taken as a no. Only a stuck instance
# runs into it (a dead one's subscription is gone, so PUBLISH does not count it), and a
# busy one answers late: at 2 s, 200 subscribers arriving at once on a loaded machine
# got "no" from a runner whose answer was on its way, and were served the stored
# `pending` as the reply's final status (bench/cluster.py's 200-stream run).
ASK_TIMEOUT = 10.0
Address = tuple[str, str, str]  # (did, conversation, reply key)
Handler = Callable[[str, Address], Awaitable[int]]
BEST = 2  # the highest rank: no other answer can beat it


@dataclass
class _Question:
    expected: int | None = None  # known once PUBLISH answers; an answer may come first
    answered: int = 0
    rank: int = 0
    instance: str | None = None
    done: anyio.Event = field(default_factory=anyio.Event)

    def answer(self, rank: int, instance: str) -> None:
        self.answered += 1
        if rank > self.rank:
            self.rank, self.instance = rank, instance
        self.check()

    def check(self) -> None:
        if self.rank >= BEST or (self.expected is not None and self.answered >= self.expected):
            self.done.set()


class Control:
    """The broadcast channel: ``ask`` on one instance, ``handler`` on every other."""

    def __init__(self, link: RedisLink, handler: Handler) -> None:
        self._link = link
        self._handler = handler
        self._broadcast = link.key("ctl")
        self._mine = link.key("ctl", link.instance)
        self._questions: dict[str, _Question] = {}
        self.listening = False
        self.subscribed = anyio.Event()  # set once, at the first subscription

    async def ask(self, op: str, address: Address) -> tuple[int, str | None]:
        """The best answer of the other instances to ``op`` on ``address``: (rank, instance)."""
        from redis.exceptions import RedisError

        if not self.listening:  # no answers could reach us
            return 0, None
        nonce = secrets.token_hex(8)
        question = self._questions[nonce] = _Question()
        message = json.dumps({"op": op, "addr": list(address), "from": self._link.instance, "n": nonce})
        try:
            heard = await self._link.redis.publish(self._broadcast, message)
            question.expected = int(heard) - 1  # our own listener hears it too
            if question.expected <= 0:
                return 0, None
            question.check()
            with anyio.move_on_after(ASK_TIMEOUT):
                await question.done.wait()
            return question.rank, question.instance
        except (RedisError, OSError, TimeoutError) as err:
            self._link.mark_down(err)
            return 0, None
        finally:
            del self._questions[nonce]

    async def listen(self) -> None:
        """Serve requests and collect answers forever, resubscribing after an outage."""
        from redis.exceptions import RedisError

        delay = 0.1
        while True:
            pubsub = self._link.blocking.pubsub(ignore_subscribe_messages=True)
            try:
                await pubsub.subscribe(self._broadcast, self._mine)
                self.listening = True
                self.subscribed.set()
                delay = 0.1
                async for message in pubsub.listen():
                    if message.get("type") == "message":
                        await self._dispatch(message["channel"], message["data"])
            except (RedisError, OSError, TimeoutError) as err:
                self._link.mark_down(err)
            finally:
                self.listening = False
                with anyio.CancelScope(shield=True), anyio.move_on_after(1):
                    try:
                        await pubsub.aclose()
                    except (RedisError, OSError):
                        pass
            await anyio.sleep(delay)
            delay = min(delay * 2, 1.0)

    async def _dispatch(self, channel: bytes, data: bytes) -> None:
        try:
            message = json.loads(data)
        except ValueError:
            return
        if channel.decode() == self._mine:
            question = self._questions.get(message.get("n"))
            if question is not None:
                question.answer(int(message.get("rank") or 0), str(message.get("by")))
            return
        if message.get("from") == self._link.instance:
            return
        address = message.get("addr")
        if not (isinstance(address, list) and len(address) == 3):
            return
        try:
            rank = await self._handler(str(message.get("op")), (address[0], address[1], address[2]))
        except Exception:
            log.exception("cluster: request %s failed", message.get("op"))
            rank = 0
        reply = json.dumps({"n": message.get("n"), "rank": rank, "by": self._link.instance})
        await self._link.redis.publish(self._link.key("ctl", str(message.get("from"))), reply)
