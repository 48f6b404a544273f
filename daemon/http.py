"""The HTTP side server (SPEC §6): the /api routes, reply streams, health, metrics.

Every /api route acts for the account its bearer token maps to; a conversation
is looked up under that account's DID only, so somebody else's conversation is
indistinguishable from a missing one (404). Every error is ``{error, message}``:
bad input is a 4xx naming the field, never a 500 and never a half-written
record, because the engine validates a record before it writes it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import anyio
from fastapi import APIRouter, FastAPI, Header, HTTPException, Request, Response
from fastapi.responses import JSONResponse
from fastapi.sse import KEEPALIVE_COMMENT
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel, ConfigDict, Field
from starlette.middleware.cors import CORSMiddleware

from daemon import echo, tools_http, uploads, usage_api, webui, xrpc
from daemon.connections import SUBSCRIBER_EXTENSION
from daemon.conversations import router as conversations_api
from daemon.deps import (
    RESUME_PARAMETERS,
    AccountDep,
    ConversationDep,
    ServiceDep,
    caller,
    last_event_id,
    served,
)
from daemon.errors import install_error_handlers
from daemon.hosts import HostCheck, OwnNames
from daemon.limits import JSON_BODY_LIMIT, BodyLimit
from daemon.served import Served
from daemon.sse_response import ReplyEvents
from daemon.turn_routes import serve_turn_routes
from recordstore import keys
from recordstore.mime import blob_mime
from recordstore.vocabulary import FILE_PART, IMAGE_PART
from turns import account_space, conversations, reply
from turns.models import Effort
from turns.streams import ReplyStream, frame

log = logging.getLogger("turnd.http")

__all__ = ["JSON_BODY_LIMIT", "create_app"]

WEB_DIR = Path(__file__).parent / "web"
KEEPALIVE_SECONDS = 15.0  # a comment line on a quiet stream, for idle proxies
MAX_IMAGE_BYTES = 20_000_000  # the lexicon's imagePart.image maxSize
MAX_FILE_BYTES = 50_000_000  # and filePart.file's
IMAGE_TYPES = frozenset({"image/png", "image/jpeg", "image/webp", "image/gif"})


# -- request bodies ------------------------------------------------------------------------


class _Body(BaseModel):
    # An unknown field is a mistake the client should hear about (422 naming it).
    model_config = ConfigDict(extra="forbid")


class ModelRef(_Body):
    provider: str = Field(min_length=1, max_length=128)
    id: str = Field(min_length=1, max_length=256)


class GenerationRequest(_Body):
    model: ModelRef | None = None
    effort: Effort | None = None
    attempt: int = Field(default=0, ge=0, le=1000)
    tools: list[str] | None = Field(default=None, max_length=64)


class NewMessage(_Body):
    parent: str | None = None
    # The parts are checked by the lexicon validator, which names the bad field.
    parts: list[dict[str, Any]] = Field(max_length=1000)
    generation: GenerationRequest | None = None


class Regenerate(_Body):
    model: ModelRef | None = None
    effort: Effort | None = None


# -- the app -------------------------------------------------------------------------------------


def create_app(service: Served) -> FastAPI:
    """The side server for ``service`` (a :class:`daemon.service.Service`)."""
    app = FastAPI(
        title="turnd",
        summary="LLM chat turns stored as AT Protocol records",
        version="0.1.0",
        docs_url=None,
        redoc_url=None,
        # turnd's traces are its own ([otel], turns.telemetry, on a provider of its own);
        # FastAPI's native telemetry would look for global OpenTelemetry providers on
        # every request (three lookups), and trace requests if a process-wide one appeared.
        telemetry={"tracing": False, "metrics": False, "logs": False},
    )
    install_error_handlers(app)
    config = service.config
    app.state.service = service
    _mount(app, conversations_api)  # §15: create, list, rename, delete, events
    _mount(app, api)
    web = webui.router(service)  # /api/models, /api/render for the page
    app.state.render_pool = web.render_pool  # type: ignore[attr-defined]
    _mount(app, web)
    _mount(app, tools_http.router(service))  # /api/tools, approvals (SPEC §14)
    _mount(app, usage_api.router(service))  # /api/usage (SPEC §16)
    _add_ops_routes(app, service)
    if config.store_kind == "local":
        _mount(app, xrpc.router(service))
    _mount(app, echo.router())  # the built-in provider, at /echo/v1
    # The two requests of every turn: matched first, without FastAPI's per-request handler.
    serve_turn_routes(app, post=post_message, post_body=NewMessage, stream=stream)

    blob_limit = config.max_body_bytes
    app.add_middleware(
        BodyLimit, json_limit=min(JSON_BODY_LIMIT, blob_limit), blob_limit=blob_limit
    )
    origins = list(config.cors_origins)
    if origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=origins,
            allow_methods=["GET", "POST", "PUT", "PATCH", "DELETE"],
            allow_headers=["Authorization", "Content-Type", "X-Filename", "Last-Event-ID"],
        )
    # Added last, so it runs first: a request for a foreign Host never reaches a body read.
    # Its config's listen address and allowed_hosts, at the port it actually bound.
    names = OwnNames(config.host, lambda: service.port or config.port, config.allowed_hosts)
    app.add_middleware(HostCheck, names=names)
    # Mounted last: "/" would otherwise shadow every route after it.
    if config.web and WEB_DIR.is_dir():
        app.mount("/", webui.static_files(WEB_DIR), name="web")  # with its CSP headers
    return app


def _mount(app: FastAPI, router: APIRouter) -> None:
    """``router``'s routes, as routes of the app itself.

    ``app.include_router`` in this FastAPI keeps each included router as a node that is
    matched on every request (its routes' version checked, its candidates tried, twice:
    to match and to handle): with seven routers that was a fifth of the CPU of a small
    request (docs/performance-history.md, "Issue 18, fifth round, the edge"). Our routers' routes are complete
    as they stand: ``APIRouter`` applies its prefix, tags, dependencies and route class
    when a route is added to it, and the app has nothing of its own to add.
    """
    app.router.routes.extend(router.routes)


def _add_ops_routes(app: FastAPI, service: Served) -> None:
    @app.get("/healthz", tags=["ops"])
    async def healthz() -> Response:
        # Final records the store refused count as the store being down (SPEC §12).
        store_ok = service.engine.store_writable and await _store_up(service)
        feed_ok = service.feed_up
        body = {"store": store_ok, "changeFeed": feed_ok, **tools_http.tool_health(service)}
        if service.cluster is not None:
            # SPEC §18: Redis being down is no outage of this instance (still 200).
            body["cluster"] = service.cluster.up
        if store_ok and feed_ok:
            return JSONResponse({"status": "ok", **body})
        down = " and ".join(
            n for n, ok in (("store", store_ok), ("change feed", feed_ok)) if not ok
        )
        return JSONResponse(
            {"error": "Unavailable", "message": f"{down} down", **body}, status_code=503
        )

    @app.get("/metrics", tags=["ops"])
    async def metrics() -> Response:
        return Response(generate_latest(service.registry), media_type=CONTENT_TYPE_LATEST)


async def _store_up(service: Served) -> bool:
    """A cheap read through the store: it answers within two seconds."""
    did = next((a.did for a in service.accounts if a.did), None)
    if did is None:
        return True  # no account to read for; nothing says the store is down
    with anyio.move_on_after(2):
        try:
            await account_space.get_preferences(service.store, did)
        except Exception as exc:
            # One line, no traceback: a load balancer may poll this every second.
            log.warning("health check: the store failed a read: %s", exc)
            return False
        return True
    return False


# -- /api ------------------------------------------------------------------------------------
# Route functions live at module level so their annotations resolve; the service they
# act on is the app's (``app.state.service``), set by create_app.


@dataclass(frozen=True, slots=True)
class _StreamSource:
    after: int
    buffer: ReplyStream | None
    stored: dict[str, Any] | None


api = APIRouter(prefix="/api", tags=["api"])


@api.get("/conversations/{skey}")
async def get_conversation(conv: ConversationDep, service: ServiceDep) -> dict[str, Any]:
    records = await conversations.messages(service.store, conv.did, conv.skey)
    return {
        "info": conv.info.value,
        "messages": [{"key": r.key, "cid": r.cid, "value": r.value} for r in records],
    }


@api.post("/conversations/{skey}/messages", status_code=201)
async def post_message(
    request: Request, skey: str, acct: AccountDep, body: NewMessage
) -> dict[str, Any]:
    # The account as the one dependency (it answers 401 before the body's 422), the
    # rest read here: FastAPI's dependency machinery costs per dependency and request,
    # and this is half of a turn's requests. The engine reads the conversation anyway
    # (RecordNotFound -> 404 for a missing or foreign one).
    keys.validate_space_key(skey)
    generation = body.generation.model_dump(exclude_none=True) if body.generation else None
    result = await served(request).engine.post_message(
        acct.did, skey, parent=body.parent, parts=body.parts, generation=generation
    )
    return {"userKey": result.user_key, "replyKey": result.reply_key, "turn": result.turn}


@api.post("/conversations/{skey}/messages/{key}/regenerate")
async def regenerate(
    conv: ConversationDep, key: str, service: ServiceDep, body: Regenerate | None = None
) -> dict[str, Any]:
    body = body or Regenerate()
    keys.validate_key(key)
    reply_key, turn = await service.engine.regenerate(
        conv.did,
        conv.skey,
        key,
        model=body.model.model_dump() if body.model else None,
        effort=body.effort,
    )
    return {"replyKey": reply_key, "turn": turn}


@api.post("/conversations/{skey}/messages/{replyKey}/cancel")
async def cancel(
    conv: ConversationDep,
    replyKey: str,  # noqa: N803 - the SPEC's name, shown in the OpenAPI document
    service: ServiceDep,
) -> dict[str, bool]:
    keys.validate_key(replyKey)
    return {"cancelled": bool(await service.engine.cancel(conv.did, conv.skey, replyKey))}


@api.get(
    "/conversations/{skey}/messages/{replyKey}/stream",
    response_class=Response,
    responses={200: {"content": {"text/event-stream": {}}, "description": "The reply's events"}},
    openapi_extra={"parameters": RESUME_PARAMETERS},
)
async def stream(
    request: Request,
    skey: str,
    replyKey: str,  # noqa: N803 - the SPEC's name, shown in the OpenAPI document
) -> ReplyEvents:
    # No FastAPI dependencies: the other half of a turn's requests, and each one costs
    # (the account, the service and Last-Event-ID are read from the request here).
    acct = caller(request)
    after = last_event_id(request) or 0
    keys.validate_space_key(skey)
    keys.validate_key(replyKey)
    service = served(request)
    # Resolved before the response starts, so a missing reply is a real 404.
    live = await service.engine.reply_stream(acct.did, skey, replyKey, after)
    if live is not None:
        source = _StreamSource(after, live, None)
    else:
        stored = await reply.read_status(service.store, (acct.did, skey, replyKey), reply_only=True)
        if stored is None:
            raise HTTPException(404, f"no reply {replyKey} in conversation {skey}")
        source = _StreamSource(after, None, stored)
    # The turn runs in the engine, not in this request: a subscriber that goes away
    # ends only this response.
    watch = request.scope.get("extensions", {}).get(SUBSCRIBER_EXTENSION)
    if watch is not None and live is not None:
        watch(live)  # closed once it reads nothing for 60 s after the turn
    return ReplyEvents(
        _sse_bytes(source),
        ended=(lambda: live.done) if live is not None else (lambda: True),
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


async def _sse_bytes(source: _StreamSource) -> AsyncIterator[bytes]:
    """The reply's events as SSE (framed by fastapi.sse), everything available sent in
    one write.

    fastapi's generator route sends each event through two task hops and its own
    write; batching what has accumulated is what keeps 200 streams cheap.
    """
    if source.buffer is None:
        # Not running here: one status from the stored record. Its id follows the
        # client's, so a reconnecting EventSource keeps counting up.
        yield frame("status", json.dumps(source.stored), source.after + 1)
        return
    async for framed in source.buffer.frames(source.after, idle=KEEPALIVE_SECONDS):
        # Framed once when published, however many subscribers the reply has.
        yield framed or KEEPALIVE_COMMENT  # idle proxies must not close a quiet stream


@api.post("/attachments")
async def attachments(
    request: Request,
    acct: AccountDep,
    service: ServiceDep,
    content_type: Annotated[str | None, Header()] = None,
    x_filename: Annotated[str | None, Header()] = None,
) -> dict[str, Any]:
    guard = service.uploads
    try:
        # SPEC §12: two at once per account, the account's cap, 507 on a full disk.
        async with guard.slot(acct.did):
            data = await request.body()
            if not data:
                raise HTTPException(400, "the request body (the file) is empty")
            mime = blob_mime(data, content_type)
            image = mime in IMAGE_TYPES
            if image:
                _check_size(len(data), MAX_IMAGE_BYTES, "an image")
            else:
                _check_size(len(data), MAX_FILE_BYTES, "a file")
            cap = uploads.storage_cap(service.accounts, acct.did)
            blob = await guard.store(service.store, acct.did, data, mime, cap)
    except uploads.UploadError as err:
        return JSONResponse({"error": err.error, "message": err.message}, status_code=err.status)
    if image:
        return {"part": {"$type": IMAGE_PART, "image": blob}}
    part: dict[str, Any] = {"$type": FILE_PART, "file": blob}
    # Non-ASCII names travel percent-encoded (HTTP headers are Latin-1); what is kept
    # is a base name without control characters, at most 255 bytes.
    name = uploads.clean_filename(x_filename)
    if name:
        part["name"] = name
    return {"part": part}


def _check_size(size: int, limit: int, what: str) -> None:
    if size > limit:
        raise HTTPException(413, f"{what} may be at most {limit} bytes, got {size}")
