"""The /api routes' FastAPI dependencies: the service, the caller's account, a conversation.

A conversation is looked up under the caller's DID only, so somebody else's
conversation is indistinguishable from a missing one (404).
"""

# No "from __future__ import annotations": FastAPI reads these annotations at runtime.

from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Header, HTTPException, Query, Request

import recordstore
from daemon.accounts import Account
from daemon.auth import bearer_token
from daemon.served import Served
from recordstore import keys
from turns import conversations

__all__ = [
    "AccountDep",
    "Caller",
    "ConversationAt",
    "ConversationDep",
    "ConversationKey",
    "ConversationKeyDep",
    "LastEventIdDep",
    "ServiceDep",
]


@dataclass(frozen=True, slots=True)
class ConversationAt:
    did: str
    skey: str
    info: recordstore.Record


async def _service(request: Request) -> Served:
    # async: FastAPI runs a plain `def` dependency in a worker thread, a thread hop
    # per request (two a turn) for an attribute read.
    service: Served = request.app.state.service
    return service


ServiceDep = Annotated[Served, Depends(_service)]


@dataclass(frozen=True, slots=True)
class Caller:
    """The account an /api request acts for (its bearer token's), by its DID."""

    did: str
    account: Account


async def _account(request: Request) -> Caller:
    # The service read here, not as a sub-dependency: FastAPI resolves each one per
    # request, and every /api request (two a turn) asks for the account.
    service: Served = request.app.state.service
    token = bearer_token(request)
    found = service.account_for_token(token) if token else None
    if found is None or not found.did:
        raise HTTPException(
            401,
            "a valid 'Authorization: Bearer <token>' is required",
            headers={"WWW-Authenticate": "Bearer"},
        )
    return Caller(found.did, found)


AccountDep = Annotated[Caller, Depends(_account)]


@dataclass(frozen=True, slots=True)
class ConversationKey:
    did: str
    skey: str


async def _conversation_key(skey: str, acct: AccountDep) -> ConversationKey:
    # For routes whose engine call reads the conversation anyway (and raises
    # RecordNotFound -> 404 for a missing or foreign one): one read less per message.
    keys.validate_space_key(skey)
    return ConversationKey(acct.did, skey)


ConversationKeyDep = Annotated[ConversationKey, Depends(_conversation_key)]


async def _conversation(key: ConversationKeyDep, service: ServiceDep) -> ConversationAt:
    info = await conversations.info(service.store, key.did, key.skey)
    if info is None:
        raise HTTPException(404, f"no conversation {key.skey}")
    return ConversationAt(key.did, key.skey, info)


ConversationDep = Annotated[ConversationAt, Depends(_conversation)]


async def _last_event_id(  # async: a plain def would run in a worker thread (a hop)
    last_event_id: Annotated[int | None, Header(alias="Last-Event-ID", ge=0)] = None,
    lastEventId: Annotated[int | None, Query(ge=0)] = None,  # noqa: N803 - for fetch readers
) -> int | None:
    # A reconnecting EventSource sends the header; a fetch reader can only use the query.
    return last_event_id if last_event_id is not None else lastEventId


# The last event id a stream's subscriber saw, if it says one (SSE resumption).
LastEventIdDep = Annotated[int | None, Depends(_last_event_id)]
