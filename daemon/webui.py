"""The built-in web chat page's side of the server (issue 8).

Two small /api routes the page needs beyond SPEC §6, usable by any web client:

- ``GET /api/models``: the configured providers' models (the echo labelled as such)
  and the default, for the model picker, and the signed-in account's ``did``;
- ``POST /api/render`` ``{texts: [...]}`` -> ``{html: [...]}``: Markdown rendered on
  the server with markdown-it-py, raw HTML off and linkify off. Images are never
  loaded by the page: each becomes a link that opens it on click. The page shows
  plain text while a part streams and asks for the rendered form once it is done.

And :func:`static_files`, the page itself (``daemon/web/``) served with a strict
Content-Security-Policy: no inline script or style, everything from this origin.
"""

# No "from __future__ import annotations": FastAPI reads the route annotations below.

from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException
from pydantic import BaseModel, ConfigDict, Field
from starlette.responses import JSONResponse
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from daemon.deps import AccountDep
from daemon.render import MAX_RENDER_BYTES, RenderPool, RenderTooComplex
from daemon.served import Served

__all__ = ["CSP", "router", "static_files"]

CSP = "; ".join(
    (
        "default-src 'self'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self' data: blob:",
        "connect-src 'self'",
        "object-src 'none'",
        "base-uri 'none'",
        "form-action 'self'",
        "frame-ancestors 'none'",
    )
)
_PAGE_HEADERS = [
    (b"content-security-policy", CSP.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-frame-options", b"DENY"),
    # Small files that change with the package: always revalidate (ETag makes it cheap).
    (b"cache-control", b"no-cache"),
]
MAX_RENDER_TEXTS = 200


class RenderBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    texts: list[Annotated[str, Field(max_length=MAX_RENDER_BYTES)]] = Field(
        max_length=MAX_RENDER_TEXTS
    )


def router(service: Served) -> APIRouter:
    """The page's /api routes; each needs the same bearer token as the rest of /api."""
    api = APIRouter(prefix="/api", tags=["web"])
    pool = RenderPool()
    from daemon.provider_models import ProviderModels

    offered = ProviderModels()  # providers without a `models` list: their /models, cached
    api.render_pool = pool  # type: ignore[attr-defined]  # closed by create_app's owner

    @api.get("/models")
    async def models(acct: AccountDep) -> dict[str, Any]:
        # The account's DID too: the page fetches attached images with getBlob(did, cid).
        return {
            "models": await offered.list(service.config),
            "default": service.config.default_model,
            "did": acct.did,
        }

    @api.post("/render")
    async def render(body: RenderBody, acct: AccountDep) -> Any:
        size = sum(len(t.encode()) for t in body.texts)
        if size > MAX_RENDER_BYTES:
            raise HTTPException(
                413, f"texts of {size} bytes in all; at most {MAX_RENDER_BYTES} bytes"
            )
        try:
            return {"html": await pool.render(body.texts)}
        except RenderTooComplex as err:
            return JSONResponse({"error": "TooComplex", "message": str(err)}, status_code=422)

    return api


# -- the page --------------------------------------------------------------------------------


class _Headers:
    """Adds the page's security headers to every response of the wrapped app."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *_PAGE_HEADERS]
            await send(message)

        await self.app(scope, receive, send_with_headers)


def static_files(directory: Path) -> ASGIApp:
    """``daemon/web`` at ``/`` (``index.html`` for the directory) with the CSP headers."""
    return _Headers(StaticFiles(directory=directory, html=True))
