"""What a PDS's error answers mean to the store: their names, whether to try again, and
the :class:`~recordstore.StoreError` each becomes.

The SDK raises a ``RequestErrorBase`` whose ``response`` (absent when there was no
answer at all) carries the XRPC error body as ``content.error`` / ``content.message``.
"""

from __future__ import annotations

from atproto_client.exceptions import NetworkError, RequestErrorBase
from atproto_client.models.common import XrpcError
from atproto_client.models.dot_dict import DotDict
from atproto_client.request import Response

from recordstore.errors import InvalidRecord, StoreError
from recordstore.write import BlobRefError

__all__ = ["TOKEN_ERRORS", "describe", "error_name", "store_error", "transient"]

# The names under which a PDS says the session's token will not do.
TOKEN_ERRORS = {"ExpiredToken", "InvalidToken", "AuthenticationRequired", "AuthMissing"}
_BLOB_ERRORS = {"BlobNotFound", "InvalidMimeType", "InvalidSize"}


def error_name(e: BaseException) -> str | None:
    """The XRPC error name of the PDS's answer (``InvalidSwap``, ...), if any."""
    return _error_body(e)[0]


def transient(e: BaseException) -> bool:
    """The PDS could not be reached, or failed on its side: worth another try."""
    response = _response(e)
    if response is None:
        return isinstance(e, NetworkError)  # no answer: refused, reset, timed out
    return response.status_code >= 500  # (the SDK's NetworkError also covers 409 and 413)


def describe(e: BaseException) -> str:
    """One line for a log or an error message: the status, name and message, or the cause."""
    response = _response(e)
    if response is None:
        cause = e.__cause__ or e.__context__
        return f"{type(e).__name__}: {cause or e}"
    name, message = _error_body(e)
    parts = [str(response.status_code), name, message]
    return " ".join(str(p) for p in parts if p)


def store_error(e: BaseException, what: str) -> StoreError:
    """The store's error for the PDS's answer to ``what`` (``putRecord <collection>/<rkey>``)."""
    name = error_name(e)
    if name in _BLOB_ERRORS:
        message = _error_body(e)[1]
        return BlobRefError(str(name), str(message or name))
    response = _response(e)
    if response is not None and response.status_code == 413:
        return InvalidRecord(f"{what}: too large for the PDS (413)")
    return StoreError(f"{what}: {describe(e)}")


def _response(e: BaseException) -> Response | None:
    return e.response if isinstance(e, RequestErrorBase) else None


def _error_body(e: BaseException) -> tuple[str | None, str | None]:
    """``(error, message)`` of the PDS's XRPC error body."""
    response = _response(e)
    content = response.content if response is not None else None
    # The SDK makes an error body an XrpcError, or a DotDict when it does not fit one (an
    # error without a message, say).
    if isinstance(content, XrpcError):
        return content.error, content.message
    if isinstance(content, DotDict):
        body = content.to_dict()
        return _text(body.get("error")), _text(body.get("message"))
    return None, None


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None
