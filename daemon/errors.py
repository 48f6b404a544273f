"""Every /api error is ``{error, message}``: the names, and the app's exception handlers.

Bad input is a 4xx naming the field; a store error maps to the status its kind
means; anything unexpected is a 500 whose message (which may hold anything) goes
to the log only.
"""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

import recordstore

log = logging.getLogger("turnd.http")

ERROR_NAMES = {
    400: "InvalidRequest",
    401: "AuthRequired",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    409: "Conflict",
    413: "PayloadTooLarge",
    415: "UnsupportedMediaType",
    422: "InvalidRequest",
    503: "Unavailable",
}


class NamedError(Exception):
    """A refusal answered as ``{error, message}`` with its own status and error name."""

    def __init__(self, status: int, error: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.error = error
        self.message = message


def error_response(status: int, message: str, error: str | None = None, **headers: str) -> JSONResponse:
    name = error or ERROR_NAMES.get(status, "InternalServerError" if status >= 500 else "Error")
    return JSONResponse({"error": name, "message": message}, status_code=status, headers=headers)


def _validation_message(exc: RequestValidationError) -> str:
    parts = []
    for err in exc.errors()[:5]:
        where = ".".join(str(p) for p in err["loc"])
        parts.append(f"{where}: {err['msg']}")
    return "; ".join(parts)


def install_error_handlers(app: FastAPI) -> None:
    async def validation(_: Request, exc: Exception) -> Response:
        assert isinstance(exc, RequestValidationError)
        return error_response(422, _validation_message(exc))

    async def http_error(_: Request, exc: Exception) -> Response:
        assert isinstance(exc, StarletteHTTPException)
        return error_response(exc.status_code, str(exc.detail), **(exc.headers or {}))

    async def store_error(_: Request, exc: Exception) -> Response:
        if isinstance(exc, recordstore.InvalidRecord):
            return error_response(400, str(exc), "InvalidRecord")
        if isinstance(exc, recordstore.InvalidKey):
            return error_response(400, str(exc), "InvalidKey")
        if isinstance(exc, recordstore.RecordNotFound | recordstore.BlobNotFound):
            return error_response(404, str(exc) or "not found")
        if isinstance(exc, recordstore.RecordExists | recordstore.InvalidSwap):
            return error_response(409, str(exc))
        return error_response(400, str(exc), "StoreError")

    async def unexpected(request: Request, exc: Exception) -> Response:
        if isinstance(exc, ClientDisconnect):
            # The client went away mid-body: nobody reads this answer, and it is no error
            # of ours. 499 is what proxies log for it.
            log.info("%s %s: the client went away", request.method, request.url.path)
            return error_response(499, "the client went away", "ClientClosedRequest")
        # The message of an unexpected error may hold anything: it goes to the log only.
        log.error("unhandled error in %s %s", request.method, request.url.path, exc_info=exc)
        return error_response(500, "internal error")

    app.add_exception_handler(RequestValidationError, validation)
    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(recordstore.StoreError, store_error)
    app.add_exception_handler(Exception, unexpected)
