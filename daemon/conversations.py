"""The /api routes that manage conversations (SPEC §15, §17): create (with a preset),
the paged and searchable list, rename, delete, the live event streams, the
preferences record and the presets."""

# No "from __future__ import annotations": FastAPI reads these annotations at runtime.

from collections.abc import AsyncIterator, Callable
from typing import Annotated, Any, TypeVar

from fastapi import APIRouter, HTTPException, Query, Request, Response
from fastapi.sse import KEEPALIVE_COMMENT, EventSourceResponse
from pydantic import BaseModel, ConfigDict, Field

import recordstore
from daemon.deps import (
    RESUME_PARAMETERS,
    VALIDATION_ERROR,
    AccountDep,
    ConversationDep,
    ServiceDep,
    last_event_id,
)
from daemon.events import EventLog
from turns import manage

KEEPALIVE_SECONDS = 15.0

router = APIRouter(prefix="/api", tags=["conversations"])
_Route = TypeVar("_Route", bound=Callable[..., Any])


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")  # an unknown field is a 422 naming it


class NewConversation(_Body):
    title: str | None = Field(default=None, max_length=3000)
    systemPrompt: str | None = Field(default=None, max_length=100_000)  # noqa: N815
    preset: str | None = Field(default=None, max_length=128)


class ConversationPatch(_Body):
    title: str | None = Field(default=None, max_length=3000)
    systemPrompt: str | None = Field(default=None, max_length=100_000)  # noqa: N815


class PreferencesBody(_Body):
    preferences: dict[str, Any]


def _invalid(exc: recordstore.InvalidRecord) -> HTTPException:
    # The validator's message starts with the field it refuses ("title must be ...").
    return HTTPException(422, str(exc))


@router.post("/conversations", status_code=201)
async def create_conversation(
    body: NewConversation, acct: AccountDep, service: ServiceDep
) -> dict[str, Any]:
    title, system, preset = body.title, body.systemPrompt, None
    if body.preset is not None:
        preset = service.config.presets.get(body.preset)
        if preset is None:
            known = ", ".join(sorted(service.config.presets)) or "none configured"
            raise HTTPException(422, f"preset: no preset {body.preset!r} (known: {known})")
        title = title or preset.get("title")
        # The preset's prompt first, the conversation's own after it.
        system = "\n\n".join(p for p in (preset.get("systemPrompt"), system) if p) or None
    try:
        skey = await service.engine.create_conversation(acct.did, title=title, system_prompt=system)
    except recordstore.InvalidRecord as exc:
        raise _invalid(exc) from None
    answer: dict[str, Any] = {"skey": skey}
    if preset is not None:
        if preset.get("template"):
            answer["template"] = preset["template"]
        if preset.get("model"):
            provider, _, model_id = preset["model"].partition(":")
            answer["model"] = {"provider": provider, "id": model_id}
    return answer


@router.get("/conversations")
async def list_conversations(
    acct: AccountDep,
    service: ServiceDep,
    limit: Annotated[int, Query(ge=1, le=manage.MAX_PAGE)] = manage.DEFAULT_PAGE,
    cursor: Annotated[str | None, Query(max_length=2000)] = None,
    q: Annotated[str | None, Query(max_length=3000)] = None,
) -> dict[str, Any]:
    try:
        found = await manage.page(service.store, acct.did, limit=limit, cursor=cursor, q=q or None)
    except manage.BadCursor as exc:
        raise HTTPException(422, str(exc)) from None
    return {"conversations": found.conversations, "cursor": found.cursor}


@router.patch("/conversations/{skey}")
async def patch_conversation(
    conv: ConversationDep, body: ConversationPatch, service: ServiceDep
) -> dict[str, Any]:
    changes: dict[str, Any] = {}
    if "title" in body.model_fields_set:
        changes["title"] = body.title
    if "systemPrompt" in body.model_fields_set:
        changes["system_prompt"] = body.systemPrompt
    try:
        info = await manage.update_info(service.store, conv.did, conv.skey, **changes)
    except recordstore.InvalidRecord as exc:
        raise _invalid(exc) from None
    return {"info": info}


@router.delete("/conversations/{skey}", status_code=204, response_class=Response)
async def delete_conversation(conv: ConversationDep, service: ServiceDep) -> Response:
    await service.engine.delete_conversation(conv.did, conv.skey)
    return Response(status_code=204)


def _event_stream(path: str, description: str) -> Callable[[_Route], _Route]:
    """A GET route answering ``text/event-stream`` that resumes after ``Last-Event-ID``
    (so the OpenAPI document says both)."""
    content = {"content": {"text/event-stream": {}}, "description": description}
    return router.get(
        path, response_class=Response, responses={200: content, 422: VALIDATION_ERROR},
        openapi_extra={"parameters": RESUME_PARAMETERS},
    )


@_event_stream("/conversations/{skey}/events", "Record changes")
async def conversation_events(
    request: Request, conv: ConversationDep, service: ServiceDep
) -> EventSourceResponse:
    after = last_event_id(request)
    return _stream(service.events.conversation(conv.did, conv.skey), after)


@_event_stream("/events", "Conversations")
async def account_events(
    request: Request, acct: AccountDep, service: ServiceDep
) -> EventSourceResponse:
    return _stream(service.events.account(acct.did), last_event_id(request))


def _stream(log: EventLog, after: int | None) -> EventSourceResponse:
    # Without Last-Event-ID a subscriber starts now: the log's newest id so far.
    start = after if after is not None else log.last_id
    return EventSourceResponse(
        _sse(log, start), headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    )


async def _sse(log: EventLog, after: int) -> AsyncIterator[bytes]:
    yield KEEPALIVE_COMMENT  # the headers go out now, so a client knows it is following
    async for framed in log.follow(after, idle=KEEPALIVE_SECONDS):
        yield framed or KEEPALIVE_COMMENT


@router.get("/preferences")
async def get_preferences(acct: AccountDep, service: ServiceDep) -> dict[str, Any]:
    return {"preferences": await manage.preferences(service.store, acct.did)}


@router.put("/preferences")
async def put_preferences(
    body: PreferencesBody, acct: AccountDep, service: ServiceDep
) -> dict[str, Any]:
    try:
        value = await manage.put_preferences(service.store, acct.did, body.preferences)
    except recordstore.InvalidRecord as exc:
        raise _invalid(exc) from None
    return {"preferences": value}


@router.get("/presets")
async def presets(acct: AccountDep, service: ServiceDep) -> dict[str, Any]:
    return {
        "presets": [{"name": name, **preset} for name, preset in service.config.presets.items()]
    }
