"""``com.atproto.server.*`` and ``identity.resolveHandle``: logins and their sessions.

An account of the config logs in with ``createSession`` (its handle or DID and
its password). Each session's refresh token is one use: the next one replaces
it, and a reused one ends the session (SPEC §12). Failed logins are counted per
account and per address (:class:`daemon.sessions.LoginLimiter`).
"""

from __future__ import annotations

import base64
from typing import Annotated, Any

from fastapi import Query, Request, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict

from daemon.accounts import Account
from daemon.auth import ACCESS_SCOPE, REFRESH_SCOPE, Scope, bearer_token
from daemon.xrpc_access import XrpcAccess
from daemon.xrpc_errors import XrpcError, invalid_request, rate_limited

__all__ = ["CreateSessionInput", "ServerMethods"]


class CreateSessionInput(BaseModel):
    # Lexicon inputs are open: unknown fields pass, as on a PDS.
    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    identifier: str
    password: str
    authFactorToken: str | None = None
    allowTakendown: bool | None = None


def _revoked() -> XrpcError:
    return XrpcError(400, "ExpiredToken", "Token has been revoked")


class ServerMethods:
    def __init__(self, access: XrpcAccess) -> None:
        self._access = access
        self._service = access.service
        self._tokens = access.tokens
        self._sessions = access.sessions

    def _session(self, account: Account, did: str, sid: str, jti: str) -> dict[str, Any]:
        return {
            "accessJwt": self._tokens.issue(did, ACCESS_SCOPE, sid=sid),
            "refreshJwt": self._tokens.issue(did, REFRESH_SCOPE, sid=sid, jti=jti),
            "handle": account.handle,
            "did": did,
            "active": True,
        }

    def _login_keys(self, request: Request, identifier: str) -> tuple[str, str]:
        # A handle and its DID share one counter; anything else counts as typed.
        who = identifier.strip().lower()[:256]
        for account in self._service.accounts:
            if who in (account.handle.lower(), (account.did or "").lower()):
                who = f"account:{account.name}"
                break
        address = request.client.host if request.client else "unknown"
        return f"handle:{who}", f"addr:{address}"

    async def create_session(self, request: Request, body: CreateSessionInput) -> Response:
        # Read per call: tests give the service a limiter with a clock of their own.
        limiter = self._service.login_limiter
        keys_ = self._login_keys(request, body.identifier)
        wait = limiter.retry_after(*keys_)
        if wait is not None:
            return rate_limited(wait)
        account = self._service.account_for_login(body.identifier, body.password)
        if account is None or not account.did:
            limiter.failed(*keys_)
            raise XrpcError(401, "AuthenticationRequired", "Invalid identifier or password")
        sid, jti = await self._sessions.create(account.did, account.password)
        return JSONResponse(self._session(account, account.did, sid, jti))

    async def refresh_session(self, request: Request) -> dict[str, Any]:
        claims = self._access.claims(request, REFRESH_SCOPE)
        account = self._access.repo(claims.did, "account")
        if claims.sid is None or claims.jti is None:
            raise _revoked()
        # One use: the next refresh token replaces this one; a reused one ends it all.
        jti = await self._sessions.rotate(claims.sid, claims.jti, account.password)
        if jti is None:
            raise _revoked()
        return self._session(account, account.did or claims.did, claims.sid, jti)

    async def delete_session(self, request: Request) -> Response:
        # As on a PDS: called with the refresh token; an access token of the session
        # ends it too.
        token = bearer_token(request)
        scope: Scope = REFRESH_SCOPE if token and '"refresh+jwt"' in _jwt_header(token) else ACCESS_SCOPE
        claims = self._access.claims(request, scope)
        if claims.sid is not None:
            await self._sessions.revoke(claims.sid)
        return Response(status_code=200)

    async def get_session(self, request: Request) -> dict[str, Any]:
        claims = self._access.claims(request, ACCESS_SCOPE)
        account = self._access.repo(claims.did, "account")
        return {"handle": account.handle, "did": account.did, "active": True}

    async def describe_server(self) -> dict[str, Any]:
        return {
            "did": self._tokens.audience,
            "availableUserDomains": [],
            "inviteCodeRequired": True,  # accounts come from the config, not from clients
        }

    async def resolve_handle(self, handle: Annotated[str, Query()]) -> dict[str, Any]:
        """The DID of a configured account's handle (the only handles this server knows)."""
        if "." not in handle or handle.startswith("did:"):
            raise invalid_request(f"Error: handle must be a valid handle: {handle}")
        wanted = handle.lower()
        for account in self._service.accounts:
            if account.did and account.handle.lower() == wanted:
                return {"did": account.did}
        raise XrpcError(400, "HandleNotFound", "Unable to resolve handle")


def _jwt_header(token: str) -> str:
    head = token.split(".", 1)[0]
    try:
        return base64.urlsafe_b64decode(head + "=" * (-len(head) % 4)).decode()
    except (ValueError, UnicodeDecodeError):
        return ""
