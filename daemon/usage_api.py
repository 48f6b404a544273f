"""``GET /api/usage`` (SPEC §16): the account's usage and cost, and its quota.

``from`` and ``to`` are UTC days (``YYYY-MM-DD``, inclusive; default: this month);
``group`` is ``day``, ``model`` (``provider:id``) or ``conversation`` (its key).
A date that is not one answers 422 ``{error, message}`` naming the parameter.

``GET /api/conversations/{skey}/usage`` (SPEC §17's "usage, cost and latency under each
reply", for replies loaded from history): each reply's steps summed, its cost and the
latency its final ``status`` event carried, keyed by reply key; 404 for a conversation
that is not the caller's.
"""

# No "from __future__ import annotations": FastAPI reads the route annotations below.

from typing import Annotated, Any, Literal

from fastapi import APIRouter, HTTPException, Query

from daemon.deps import AccountDep, ConversationDep
from daemon.served import Served
from turns.usage import BadDate, conversation_usage, parse_day, this_month, usage_report

__all__ = ["router"]


def router(service: Served) -> APIRouter:
    api = APIRouter(prefix="/api", tags=["usage"])

    @api.get("/usage")
    async def usage(
        acct: AccountDep,
        from_: Annotated[str | None, Query(alias="from")] = None,
        to: str | None = None,
        group: Literal["day", "model", "conversation"] = "day",
    ) -> dict[str, Any]:
        books = service.engine.books
        first, last = this_month(books.ledger.clock())
        try:
            if from_ is not None:
                first = parse_day("from", from_)
            if to is not None:
                last = parse_day("to", to)
            return await usage_report(
                service.state, acct.did, first, last, group, books.quotas
            )
        except BadDate as err:
            raise HTTPException(422, str(err)) from None

    @api.get("/conversations/{skey}/usage")
    async def reply_usage(conv: ConversationDep) -> dict[str, Any]:
        return await conversation_usage(service.state, conv.did, conv.skey)

    return api
