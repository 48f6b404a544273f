"""Who may call an XRPC method: the served accounts, their sessions and tokens.

A write needs an access token of the repo's owner. SPEC §12: the local store is
private, so a read needs the owner's session or its /api bearer token, unless
``[xrpc] public_reads`` opens it. A session's access token stands only while its
session does (not revoked, not deleted, made with the account's current password).
"""

from __future__ import annotations

from fastapi import Request

from daemon.accounts import Account
from daemon.auth import ACCESS_SCOPE, Scope, SessionClaims, SessionTokens, TokenError, bearer_token
from daemon.served import Served
from daemon.sessions import SessionStore
from daemon.xrpc_errors import XrpcError, invalid_request

__all__ = ["XrpcAccess"]

# The request scope's key for the access token live_session verified, with its claims:
# the method's own check takes them from there instead of verifying the token again.
_VERIFIED = "turnd.verified_access"


def _auth_required() -> XrpcError:
    return XrpcError(401, "AuthenticationRequired", "Authentication Required")


class XrpcAccess:
    """The accounts, tokens and sessions every XRPC method checks its caller against."""

    def __init__(self, service: Served, tokens: SessionTokens, sessions: SessionStore) -> None:
        self.service = service
        self.tokens = tokens
        self.sessions = sessions

    def _password(self, did: str) -> str | None:
        account = next((a for a in self.service.accounts if a.did == did), None)
        return account.password if account is not None else None

    async def live_session(self, request: Request) -> None:
        """Every XRPC call with a session access token: its session must stand (not
        revoked, not deleted, made with the account's current password)."""
        token = bearer_token(request)
        if token is None or token.count(".") != 2:
            return  # none, or an /api bearer token: the route decides
        try:
            claims = self.tokens.verify(token, ACCESS_SCOPE)
        except TokenError:
            return  # the route's own check answers it as a PDS would
        if claims.sid is None or not await self.sessions.valid(
            claims.sid, claims.did, self._password(claims.did)
        ):
            raise XrpcError(400, "ExpiredToken", "Token has been revoked")
        request.scope[_VERIFIED] = (token, claims)

    def account(self, repo: str) -> Account | None:
        """The served account whose DID or handle is ``repo``."""
        handle = repo.lower()
        for account in self.service.accounts:
            if account.did and (account.did == repo or account.handle.lower() == handle):
                return account
        return None

    def repo(self, repo: str, what: str = "repo") -> Account:
        account = self.account(repo)
        if account is None:
            raise invalid_request(f"Could not find {what}: {repo}")
        return account

    def claims(self, request: Request, scope: Scope) -> SessionClaims:
        token = bearer_token(request)
        if token is None:
            if request.headers.get("authorization"):
                raise XrpcError(400, "InvalidToken", "Unexpected authorization type")
            raise XrpcError(401, "AuthMissing", "Authentication Required")
        verified = request.scope.get(_VERIFIED)
        if verified is not None and verified[0] == token and scope == ACCESS_SCOPE:
            claims = verified[1]
        else:
            claims = self.tokens.verify(token, scope)
        if not any(a.did == claims.did for a in self.service.accounts):
            raise XrpcError(403, "AccountNotFound", "Account not found")
        return claims

    def writer(self, request: Request, repo: str) -> str:
        """The DID of ``repo`` when the caller holds an access token of its owner."""
        claims = self.claims(request, ACCESS_SCOPE)
        account = self.repo(repo)
        if account.did != claims.did:
            raise _auth_required()
        return claims.did

    def reader(self, request: Request, account: Account) -> None:
        """SPEC §12: the local store is private. A read needs the owner's session or
        its /api bearer token, unless ``[xrpc] public_reads`` opens it."""
        if self.service.config.public_reads:
            return
        token = bearer_token(request)
        by_token = self.service.account_for_token(token) if token else None
        if by_token is not None:
            if by_token.did != account.did:
                raise _auth_required()
            return
        claims = self.claims(request, ACCESS_SCOPE)
        if claims.did != account.did:
            raise _auth_required()
