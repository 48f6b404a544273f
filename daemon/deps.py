"""The /api routes' FastAPI dependencies: the service, the caller's account, a conversation.

A conversation is looked up under the caller's DID only, so somebody else's
conversation is indistinguishable from a missing one (404).
"""

# No "from __future__ import annotations": FastAPI reads these annotations at runtime.

from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from pydantic import NonNegativeInt, TypeAdapter, ValidationError

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
    "RESUME_PARAMETERS",
    "VALIDATION_ERROR",
    "ServiceDep",
    "caller",
    "last_event_id",
    "served",
]


@dataclass(frozen=True, slots=True)
class ConversationAt:
    did: str
    skey: str
    info: recordstore.Record


def served(request: Request) -> Served:
    """The service the app acts on (set by ``create_app``)."""
    service: Served = request.app.state.service
    return service


async def _service(request: Request) -> Served:
    # async: FastAPI runs a plain `def` dependency in a worker thread, a thread hop
    # per request for an attribute read.
    return served(request)


ServiceDep = Annotated[Served, Depends(_service)]


@dataclass(frozen=True, slots=True)
class Caller:
    """The account an /api request acts for (its bearer token's), by its DID."""

    did: str
    account: Account


def caller(request: Request) -> Caller:
    """The account of the request's bearer token; 401 without a valid one."""
    token = bearer_token(request)
    found = served(request).account_for_token(token) if token else None
    if found is None or not found.did:
        raise HTTPException(
            401,
            "a valid 'Authorization: Bearer <token>' is required",
            headers={"WWW-Authenticate": "Bearer"},
        )
    return Caller(found.did, found)


async def _account(request: Request) -> Caller:
    # The service read in `caller`, not as a sub-dependency: FastAPI resolves each one
    # per request, and every /api request asks for the account.
    return caller(request)


AccountDep = Annotated[Caller, Depends(_account)]


async def _conversation(skey: str, acct: AccountDep, service: ServiceDep) -> ConversationAt:
    keys.validate_space_key(skey)
    info = await conversations.info(service.store, acct.did, skey)
    if info is None:
        raise HTTPException(404, f"no conversation {skey}")
    return ConversationAt(acct.did, skey, info)


ConversationDep = Annotated[ConversationAt, Depends(_conversation)]


_EVENT_ID: TypeAdapter[int] = TypeAdapter(NonNegativeInt)

# What `last_event_id` reads, in the OpenAPI document as FastAPI would put it.
_OPTIONAL_ID = {"anyOf": [{"minimum": 0, "type": "integer"}, {"type": "null"}]}
# A route whose only validated input is read by `last_event_id` still answers 422.
VALIDATION_ERROR = {
    "description": "Validation Error",
    "content": {"application/json": {"schema": {"$ref": "#/components/schemas/HTTPValidationError"}}},
}
RESUME_PARAMETERS = [
    {"in": "query", "name": "lastEventId", "required": False,
     "schema": {**_OPTIONAL_ID, "title": "Lasteventid"}},
    {"in": "header", "name": "Last-Event-ID", "required": False,
     "schema": {**_OPTIONAL_ID, "title": "Last-Event-Id"}},
]


def last_event_id(request: Request) -> int | None:
    """The last event id a stream's subscriber saw, if it says one (SSE resumption).

    A reconnecting EventSource sends the ``Last-Event-ID`` header; a fetch reader can
    only use the query (``?lastEventId=``); the header wins. A bad value is FastAPI's 422
    naming it. Read here rather than declared as FastAPI parameters, which cost ~20 µs a
    request in FastAPI's parameter machinery, and the reply stream is two requests a turn
    (README, issue 18); routes that use it list ``RESUME_PARAMETERS`` in ``openapi_extra``.
    """
    raw = request.headers.get("last-event-id")
    where: tuple[str, str] = ("header", "Last-Event-ID")
    if raw is None:
        if not request.scope.get("query_string"):
            return None
        raw = request.query_params.get("lastEventId")
        if raw is None:
            return None
        where = ("query", "lastEventId")
    try:
        return _EVENT_ID.validate_python(raw)
    except ValidationError as exc:
        errors = [{**e, "loc": where} for e in exc.errors(include_url=False)]
        raise RequestValidationError(errors) from None
