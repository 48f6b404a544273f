"""XRPC errors as the reference PDS answers them: ``{"error": name, "message": ...}``.

The names and status codes are the PDS's, so the atproto SDK raises the same
exception types against turnd (400 -> ``BadRequestError``, 401 ->
``UnauthorizedError``). FastAPI's app-wide handlers answer the /api way; the XRPC
routes convert their failures here, per route.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute

import recordstore
from daemon.errors import NamedError
from recordstore.write import BlobRefError

log = logging.getLogger("turnd.xrpc")

__all__ = [
    "XrpcError",
    "XrpcRoute",
    "error_response",
    "invalid_request",
    "not_served",
    "not_implemented",
    "rate_limited",
]


class XrpcError(NamedError):
    """An error answered as a PDS answers it: ``{"error": name, "message": ...}``."""


def invalid_request(message: str) -> XrpcError:
    """The PDS's answer to input it will not take: ``400 InvalidRequest``."""
    return XrpcError(400, "InvalidRequest", message)


def not_served() -> XrpcError:
    """A method the store cannot serve (XRPC is served for the local store, which can)."""
    return XrpcError(501, "MethodNotImplemented", "Method Not Implemented")


def error_response(status: int, error: str, message: str) -> JSONResponse:
    return JSONResponse({"error": error, "message": message}, status_code=status)


def rate_limited(wait: float) -> JSONResponse:
    """``createSession`` after too many failed logins: 429 with ``Retry-After``."""
    seconds = max(1, math.ceil(wait))
    return JSONResponse(
        {
            "error": "RateLimitExceeded",
            "message": f"too many failed logins; try again in {seconds} s",
        },
        status_code=429,
        headers={"Retry-After": str(seconds)},
    )


async def not_implemented(nsid: str) -> Response:
    """A method this server does not serve, as a PDS says it."""
    return error_response(501, "MethodNotImplemented", "Method Not Implemented")


def _validation_message(err: RequestValidationError) -> str:
    # The PDS names the bad field as "Input/<field> ..." or "Params/<field> ...".
    first = err.errors()[0]
    where = {"body": "Input", "query": "Params"}.get(str(first["loc"][0]), "Input")
    path = "/".join(str(p) for p in first["loc"][1:])
    return f"{where}/{path}: {first['msg']}" if path else f"{where}: {first['msg']}"


def _store_error(exc: recordstore.StoreError) -> XrpcError:
    if isinstance(exc, BlobRefError):
        return XrpcError(400, exc.error, str(exc))
    if isinstance(exc, recordstore.InvalidRecord):
        return XrpcError(400, "InvalidRecord", str(exc))
    if isinstance(exc, recordstore.InvalidSwap):
        return XrpcError(400, "InvalidSwap", str(exc) or "Record was at a different CID")
    if isinstance(exc, recordstore.RecordNotFound):
        return XrpcError(400, "RecordNotFound", str(exc) or "Could not locate record")
    if isinstance(exc, recordstore.BlobNotFound):
        return XrpcError(400, "BlobNotFound", "Blob not found")
    if isinstance(exc, recordstore.RecordExists):
        return invalid_request("record already exists")
    if isinstance(exc, recordstore.InvalidKey):
        return invalid_request(str(exc))
    return XrpcError(500, "InternalServerError", "Internal Server Error")


class XrpcRoute(APIRoute):
    """Answers every failure of an XRPC method in the PDS's error shape.

    FastAPI's app-wide handlers answer the /api way; an XRPC client expects
    ``400 InvalidRequest`` for bad input, so the conversion happens here, per route.
    """

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def route(request: Request) -> Response:
            try:
                return await handler(request)
            except NamedError as exc:  # XrpcError, a refused token, a refused upload
                return error_response(exc.status, exc.error, exc.message)
            except RequestValidationError as exc:
                return error_response(400, "InvalidRequest", _validation_message(exc))
            except recordstore.StoreError as exc:
                err = _store_error(exc)
                if err.status >= 500:
                    log.exception("store error in %s", request.url.path)
                return error_response(err.status, err.error, err.message)

        return route
