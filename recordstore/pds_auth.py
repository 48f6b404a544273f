"""The PDS store's sessions: each served account's login, and XRPC calls made as it.

Each account logs in with an app password (``createSession``); the SDK's ``AsyncClient``
refreshes the access token before it expires, and a session whose refresh token is gone
(expired, revoked) is replaced by a new login. An account whose PDS is unreachable at
open logs in on first use, so one PDS being down stops nobody else.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio
import httpx
from atproto_client import AsyncClient
from atproto_client.exceptions import (
    BadRequestError,
    LoginRequiredError,
    NetworkError,
    UnauthorizedError,
)
from atproto_client.request import AsyncRequest

from recordstore.errors import StoreError
from recordstore.keys import validate_did
from recordstore.pds_errors import TOKEN_ERRORS, describe, error_name

__all__ = ["PdsAccount", "PdsSession", "PdsSessions"]

log = logging.getLogger("recordstore.pds")  # one logger for the whole pds store


@dataclass(slots=True)
class PdsAccount:
    """One account turnd serves on a PDS.

    ``service`` is where it logs in (its PDS, or an entryway); after login the SDK talks to
    the PDS named in the account's DID document. ``password`` is an app password.
    """

    identifier: str  # handle or DID
    password: str = field(repr=False)
    service: str
    did: str | None = None


@dataclass(slots=True)
class PdsSession:
    """One account's SDK client (:class:`recordstore.firehose.FeedAccount`)."""

    account: PdsAccount
    client: AsyncClient
    lock: anyio.Lock = field(default_factory=anyio.Lock)
    logged_in: bool = False

    @property
    def did(self) -> str | None:
        return self.account.did

    @property
    def identifier(self) -> str:
        return self.account.identifier

    @property
    def endpoint(self) -> str:
        """The PDS this account's records are on (known after login)."""
        session = self.client._session  # the SDK keeps the DID document's PDS there
        if session is not None and session.pds_endpoint:
            return session.pds_endpoint.rstrip("/").removesuffix("/xrpc")
        return self.account.service.rstrip("/")


class PdsSessions:
    """The sessions of every account a :class:`~recordstore.pds.PdsStore` serves."""

    def __init__(self, accounts: Sequence[PdsAccount], *, request_timeout: float) -> None:
        self.all: list[PdsSession] = [
            PdsSession(a, AsyncClient(a.service, request=AsyncRequest(timeout=request_timeout)))
            for a in accounts
        ]
        self._by_did: dict[str, PdsSession] = {}
        for s in self.all:
            if s.account.did:
                self._by_did[validate_did(s.account.did)] = s

    @property
    def dids(self) -> list[str]:
        """The DIDs served (of the accounts logged in so far)."""
        return list(self._by_did)

    def known_dids(self) -> dict[str, str]:
        """Login identifier -> DID, for the accounts logged in."""
        return {s.account.identifier: s.account.did for s in self.all if s.account.did}

    async def first_logins(self) -> None:
        """Log every account in. Rejected credentials are an error; an unreachable PDS is
        not (its accounts log in on first use)."""
        async with anyio.create_task_group() as tg:
            for s in self.all:
                tg.start_soon(self._first_login, s)

    async def _first_login(self, s: PdsSession) -> None:
        try:
            await self.login(s)
        except (NetworkError, httpx.TransportError) as e:
            log.warning(
                "%s: PDS %s unreachable, will retry: %s", s.account.identifier, s.account.service, e
            )

    async def aclose(self) -> None:
        for s in self.all:
            await s.client.request.close()

    async def login(self, s: PdsSession) -> None:
        async with s.lock:
            await self._login_locked(s)

    async def _login_locked(self, s: PdsSession) -> None:
        try:
            await s.client.login(s.account.identifier, s.account.password, fetch_bsky_profile=False)
        except (BadRequestError, UnauthorizedError) as e:
            raise StoreError(f"{s.account.identifier}: login refused: {describe(e)}") from None
        session = s.client._session
        assert session is not None
        if s.account.did and session.did != s.account.did:
            raise StoreError(
                f"{s.account.identifier}: logged in as {session.did}, configured {s.account.did}"
            )
        s.account.did = session.did
        self._by_did[session.did] = s
        s.logged_in = True

    async def session_for(self, did: str) -> PdsSession:
        """The logged-in session of ``did``; StoreError when no served account is it."""
        validate_did(did)
        s = self._by_did.get(did)
        if s is None:
            # An account whose PDS was down at open may be this DID: try them now.
            for pending in self.all:
                if not pending.logged_in and pending.account.did in (None, did):
                    try:
                        await self.login(pending)
                    except (NetworkError, httpx.TransportError):
                        continue
            s = self._by_did.get(did)
        if s is None:
            raise StoreError(f"{did} is not an account this store serves")
        if not s.logged_in:
            await self.login(s)
        return s

    async def call(self, did: str, kind: str, nsid: str, **kwargs: Any) -> Any:
        """One XRPC call as ``did``; a dead session (refresh token gone) logs in again."""
        s = await self.session_for(did)
        for attempt in (1, 2):
            try:
                if kind == "query":
                    resp = await s.client.invoke_query(nsid, **kwargs)
                else:
                    resp = await s.client.invoke_procedure(nsid, **kwargs)
                return resp.content
            except (LoginRequiredError, BadRequestError, UnauthorizedError) as e:
                if attempt == 2 or not (
                    isinstance(e, LoginRequiredError) or error_name(e) in TOKEN_ERRORS
                ):
                    raise
                log.info("%s: session ended (%s), logging in again", did, describe(e))
                await self.login(s)
        raise AssertionError("unreachable")
