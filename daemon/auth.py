"""Credentials of the side server: /api bearer tokens and the XRPC session JWTs.

The local store's XRPC endpoints hand out session tokens the way a PDS does, so
the stock atproto SDK can log in, read ``exp`` from the access token to decide
when to refresh, and call ``refreshSession`` with the refresh token. The tokens
are HS256 JWTs signed with a secret turnd keeps next to its state file (or, with
no place to keep it, one made per process: sessions then end with the process).

Parsing and the time checks are the SDK's own (``atproto_server.auth.jwt``);
only the HMAC is done here, since the SDK verifies asymmetric keys only.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal

from atproto_server.auth.utils import base64url_encode
from atproto_server.exceptions import (
    InvalidTokenError,
    TokenExpiredSignatureError,
)
from starlette.requests import HTTPConnection

from daemon.errors import NamedError

__all__ = [
    "ACCESS_SCOPE",
    "REFRESH_SCOPE",
    "SessionClaims",
    "SessionTokens",
    "TokenError",
    "bearer_token",
    "load_secret",
]

# The scopes and token types a PDS puts in its legacy (password) session tokens.
Scope = Literal["com.atproto.access", "com.atproto.refresh"]
ACCESS_SCOPE: Final = "com.atproto.access"
REFRESH_SCOPE: Final = "com.atproto.refresh"
_TYP = {ACCESS_SCOPE: "at+jwt", REFRESH_SCOPE: "refresh+jwt"}

ACCESS_TTL = 2 * 60 * 60  # seconds; the PDS's access tokens live two hours
REFRESH_TTL = 90 * 24 * 60 * 60  # and its refresh tokens ninety days


class TokenError(NamedError):
    """A session token was refused; ``error``/``status`` are the PDS's for the case."""


@dataclass(frozen=True, slots=True)
class SessionClaims:
    did: str
    scope: str
    jti: str | None
    sid: str | None = None  # the login session the token belongs to (SPEC §12)


def bearer_token(conn: HTTPConnection) -> str | None:
    """The token of an ``Authorization: Bearer`` header, or None."""
    header = conn.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


def load_secret(path: Path | None) -> bytes:
    """The signing secret kept at ``path`` (made on first use), or a fresh one.

    The secret is written to a private temporary file and linked into place, so
    two daemons starting on one state directory end up sharing one complete
    secret: neither overwrites the other's nor reads a half-written file.
    """
    if path is None:
        return secrets.token_bytes(32)
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(secrets.token_bytes(32))
            os.link(tmp, path)
        except FileExistsError:
            pass  # somebody else's is in place: use theirs
        finally:
            tmp.unlink(missing_ok=True)
    secret = path.read_bytes()
    if len(secret) < 32:
        raise ValueError(f"{path}: the session secret is too short; delete it to make a new one")
    return secret


_VERIFIED_KEPT = 256  # access tokens remembered as verified (a few hundred bytes each)


class SessionTokens:
    """Issues and checks the XRPC session JWTs of one server."""

    def __init__(
        self,
        secret: bytes,
        audience: str,
        *,
        access_ttl: int = ACCESS_TTL,
        refresh_ttl: int = REFRESH_TTL,
    ) -> None:
        self._secret = secret
        self.audience = audience
        self._ttl = {ACCESS_SCOPE: access_ttl, REFRESH_SCOPE: refresh_ttl}
        # Access tokens verified here, with their expiry: a client sends the same one with
        # every call, and parsing, the HMAC and the SDK's payload model took ~0.1 ms of each
        # direct write's way to its claim. Only the exact token string finds its entry.
        self._verified: dict[str, tuple[SessionClaims, int]] = {}

    @property
    def secret(self) -> bytes:
        return self._secret

    @property
    def refresh_ttl(self) -> int:
        return self._ttl[REFRESH_SCOPE]

    def issue(
        self, did: str, scope: Scope, *, sid: str | None = None, jti: str | None = None
    ) -> str:
        now = int(time.time())
        payload: dict[str, object] = {
            "scope": scope,
            "sub": did,
            "aud": self.audience,
            "iat": now,
            "exp": now + self._ttl[scope],
        }
        if scope == REFRESH_SCOPE:
            payload["jti"] = jti or uuid.uuid4().hex  # the PDS's refresh tokens carry an id
        if sid is not None:
            payload["sid"] = sid
        header = {"typ": _TYP[scope], "alg": "HS256"}
        signing_input = _segment(header) + b"." + _segment(payload)
        return (signing_input + b"." + base64url_encode(self._sign(signing_input))).decode()

    def verify(self, token: str, scope: Scope) -> SessionClaims:
        """The claims of a valid token of ``scope``; raises TokenError as a PDS answers."""
        if scope == ACCESS_SCOPE:
            known = self._verified.get(token)
            if known is not None:
                if known[1] > time.time():  # the SDK's own test: expired once exp <= now
                    return known[0]
                del self._verified[token]
                raise TokenError(400, "ExpiredToken", "Token has expired")
        claims, expires = self._verify(token, scope)
        if scope == ACCESS_SCOPE and expires is not None:
            if len(self._verified) >= _VERIFIED_KEPT:
                del self._verified[next(iter(self._verified))]
            self._verified[token] = (claims, expires)
        return claims

    def _verify(self, token: str, scope: Scope) -> tuple[SessionClaims, int | None]:
        # Imported on the first verify: the module loads the SDK's asymmetric verifiers
        # (cryptography's ciphers), ~0.1 s of CPU at every daemon start that never sees one.
        from atproto_server.auth.jwt import decode_jwt_payload, parse_jwt, validate_jwt_payload

        try:
            raw_payload, signing_input, header, signature = parse_jwt(token)
        except InvalidTokenError:
            raise _could_not_verify() from None
        if header.get("alg") != "HS256" or not hmac.compare_digest(
            signature, self._sign(signing_input)
        ):
            raise _could_not_verify()
        try:
            payload = decode_jwt_payload(raw_payload)
            validate_jwt_payload(payload)
        except TokenExpiredSignatureError:
            raise TokenError(400, "ExpiredToken", "Token has expired") from None
        except InvalidTokenError:
            raise _could_not_verify() from None
        if header.get("typ") != _TYP[scope]:
            raise TokenError(400, "InvalidToken", "Invalid token type")
        if payload.scope != scope:
            raise TokenError(400, "InvalidToken", "Bad token scope")
        if not payload.sub or payload.aud != self.audience:
            raise TokenError(400, "InvalidToken", "Malformed token")
        sid = (payload.model_extra or {}).get("sid")
        claims = SessionClaims(
            did=payload.sub,
            scope=scope,
            jti=payload.jti,
            sid=sid if isinstance(sid, str) else None,
        )
        return claims, None if payload.exp is None else int(payload.exp)

    def _sign(self, signing_input: bytes) -> bytes:
        return hmac.new(self._secret, signing_input, hashlib.sha256).digest()


def _segment(obj: dict[str, object]) -> bytes:
    return base64url_encode(json.dumps(obj, separators=(",", ":")).encode())


def _could_not_verify() -> TokenError:
    return TokenError(400, "InvalidToken", "Token could not be verified")
