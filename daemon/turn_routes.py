"""The two requests of every turn — a message's POST and its reply's stream — answered
without FastAPI's per-request machinery when nothing about them needs it.

FastAPI's handler does the same work for every request of every route: it looks up the
endpoint's context for error messages, reads the content type through ``email.message``,
resolves the parameters and the dependencies, and serializes the result through the
response model. For these two routes that was about a twentieth of a short turn's CPU
(docs/performance-history.md, "Issue 18, twentieth round"). Here each route's handler reads what it needs itself:

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

__all__ = ["serve_turn_routes"]


def serve_turn_routes(
    app: FastAPI,
    *,
    post: Callable[..., Awaitable[Any]],
    post_body: type[BaseModel],
    stream: Callable[..., Awaitable[Response]],
) -> None:
    """Put the routes of ``post`` (its body ``post_body``) and ``stream`` first among the
    app's routes, and answer them as described above.

    ``post`` is called with ``request``, ``acct``, ``body`` and its path parameters,
    ``stream`` with ``request`` and its path parameters, all by name.
    """
    post_route, stream_route = _route(app, post), _route(app, stream)
    # Starlette tries the routes' patterns in order until one matches (~0.5 µs each; the
    # stream route was the fifteenth). No other route matches their paths with their
    # methods, so the order changes nothing but the time to find them.
    routes = app.router.routes
    routes[:] = [post_route, stream_route] + [
        r for r in routes if r is not post_route and r is not stream_route
    ]
    post_route.app = request_response(_lean_post(post_route, post, post_body))
    # Starlette's wrapper: FastAPI's adds two exit stacks for dependencies with ``yield``,
    # which this route has none of.
    stream_route.app = starlette_routing.request_response(_lean_stream(stream))


def _lean_post(
    route: APIRoute, endpoint: Callable[..., Awaitable[Any]], model: type[BaseModel]
) -> Callable[[Request], Awaitable[Response]]:
    general = route.get_route_handler()
    status_code = route.status_code

    async def handle(request: Request) -> Response:
        body = await _json_body(request, model)
        if body is None:
            return await general(request)
        try:
            acct = caller(request)
        except HTTPException:
            return await general(request)  # its 401, after any 422 of the body's
        result = await endpoint(request=request, acct=acct, body=body, **request.path_params)
        # As FastAPI serializes a ``dict[str, Any]`` response model: pydantic's JSON.
        return Response(
            pydantic_core.to_json(result), status_code=status_code, media_type="application/json"
        )

    return handle


def _lean_stream(
    endpoint: Callable[..., Awaitable[Response]],
) -> Callable[[Request], Awaitable[Response]]:
    async def handle(request: Request) -> Response:
        return await endpoint(request=request, **request.path_params)

    return handle


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
