"""The two requests of every turn — a message's POST and its reply's stream — answered
without FastAPI's per-request machinery when nothing about them needs it.

FastAPI's handler does the same work for every request of every route: it looks up the
endpoint's context for error messages, reads the content type through ``email.message``,
resolves the parameters and the dependencies, and serializes the result through the
response model. For these two routes that was about a twentieth of a short turn's CPU
(README, "Where the figures stand"). Here each route's handler reads what it needs itself:

- the stream route takes its two path parameters, which FastAPI would only check to be
  strings (the endpoint reads the rest from the request, as it did);
- the POST takes the fast way only for ``Content-Type: application/json``, a body that is
  JSON, a valid bearer token and a body the model accepts. Anything else goes to FastAPI's
  own handler for the route, which answers as it always did, with its errors in its
  order (a malformed body's 422 before the token's 401). Nothing has been changed by
  then: the endpoint has not run.

The routes stay FastAPI's (:class:`~fastapi.routing.APIRoute`): the OpenAPI document, the
matching and the exception handlers are theirs; only ``route.app`` is replaced, wrapped
as FastAPI (the POST, whose handler may pass a request on to FastAPI's) or Starlette (the
stream) wraps its handlers.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

import pydantic_core
from fastapi import FastAPI, HTTPException, Request, Response
from fastapi.routing import APIRoute, request_response
from pydantic import BaseModel
from starlette import routing as starlette_routing

from daemon.deps import caller

__all__ = ["lean_post", "lean_stream"]


def lean_post(
    app: FastAPI,
    endpoint: Callable[..., Awaitable[dict[str, Any]]],
    body_model: type[BaseModel],
    status_code: int,
) -> None:
    """``endpoint(request, skey, acct, body)``'s route answered as described above."""
    route = _route(app, endpoint)
    general = route.get_route_handler()

    async def handle(request: Request) -> Response:
        body = await _json_body(request, body_model)
        if body is None:
            return await general(request)
        try:
            acct = caller(request)
        except HTTPException:
            return await general(request)  # its 401, after any 422 of the body's
        result = await endpoint(request, request.path_params["skey"], acct, body)
        # As FastAPI serializes a ``dict[str, Any]`` response model: pydantic's JSON.
        return Response(
            pydantic_core.to_json(result), status_code=status_code, media_type="application/json"
        )

    route.app = request_response(handle)


def lean_stream(app: FastAPI, endpoint: Callable[..., Awaitable[Response]]) -> None:
    """``endpoint(request, skey, replyKey)``'s route, its path parameters read here."""
    route = _route(app, endpoint)

    async def handle(request: Request) -> Response:
        params = request.path_params
        return await endpoint(request, params["skey"], params["replyKey"])

    # Starlette's wrapper: FastAPI's adds two exit stacks for dependencies with ``yield``,
    # which this route has none of.
    route.app = starlette_routing.request_response(handle)


async def _json_body(request: Request, model: type[BaseModel]) -> BaseModel | None:
    """The body as ``model``, or None when FastAPI's handler should have its say."""
    if request.headers.get("content-type") != "application/json":
        return None  # no type, a charset, another type: FastAPI's rules decide
    try:
        raw = await request.body()  # kept on the request, for the handler that may follow
    except HTTPException:
        raise  # the body limit's 413 (daemon.limits), which FastAPI's handler lets through
    except Exception:
        # A body that could not be read (the client went away): FastAPI's handler finds
        # the stream consumed and answers its 400, as it did when it read the body itself.
        return None
    try:
        # As FastAPI reads it (Starlette's request.json()), then validates the object.
        return model.model_validate(json.loads(raw))
    except Exception:  # not JSON, too deep, not the model: FastAPI's handler answers it
        return None


def _route(app: FastAPI, endpoint: Callable[..., Any]) -> APIRoute:
    for route in app.router.routes:
        if isinstance(route, APIRoute) and route.endpoint is endpoint:
            return route
    raise LookupError(f"no route for {endpoint.__name__}")
