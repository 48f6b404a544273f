"""What a PDS's error answers mean to the store: their names, whether to try again, and
the :class:`~recordstore.StoreError` each becomes.

The SDK raises a ``RequestErrorBase`` whose ``response`` (absent when there was no
answer at all) carries the XRPC error body as ``content.error`` / ``content.message``.
"""

from __future__ import annotations

from atproto_client.exceptions import NetworkError, RequestErrorBase
from atproto_client.request import Response

from recordstore.errors import InvalidRecord, StoreError
from recordstore.write import BlobRefError

__all__ = ["TOKEN_ERRORS", "describe", "error_name", "store_error", "transient"]

# The names under which a PDS says the session's token will not do.
TOKEN_ERRORS = {"ExpiredToken", "InvalidToken", "AuthenticationRequired", "AuthMissing"}
_BLOB_ERRORS = {"BlobNotFound", "InvalidMimeType", "InvalidSize"}


def error_name(e: BaseException) -> str | None:
    """The XRPC error name of the PDS's answer (``InvalidSwap``, ...), if any."""
    content = _content(e)
    return getattr(content, "error", None)


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
    content = _content(e)
    name = getattr(content, "error", None)
    message = getattr(content, "message", None)
    parts = [str(response.status_code), name, message]
    return " ".join(str(p) for p in parts if p)


def store_error(e: BaseException, what: str) -> StoreError:
    """The store's error for the PDS's answer to ``what`` (``putRecord <collection>/<rkey>``)."""
    name = error_name(e)
    if name in _BLOB_ERRORS:
        message = getattr(_content(e), "message", None)
        return BlobRefError(str(name), str(message or name))
    response = _response(e)
    if response is not None and response.status_code == 413:
        return InvalidRecord(f"{what}: too large for the PDS (413)")
    return StoreError(f"{what}: {describe(e)}")


def _response(e: BaseException) -> Response | None:
    return e.response if isinstance(e, RequestErrorBase) else None


def _content(e: BaseException) -> object | None:
    # The SDK makes an error body an XrpcError model, or a DotDict when it does not fit one:
    # both answer `.error` and `.message`.
    response = _response(e)
    return response.content if response is not None else None
