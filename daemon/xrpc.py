"""The local store served as a PDS would serve it: ``com.atproto.*`` over XRPC.

A script written with the stock atproto SDK against a PDS runs unchanged against
turnd: it logs in with ``createSession`` (an account of the config, its password),
writes records in the classic-repo layout (rkey ``<skey>:<key>``, SPEC §3) and
reads them back. Errors carry the reference PDS's names and status codes, so the
SDK raises the same exception types it raises against a PDS (400 ->
``BadRequestError``, 401 -> ``UnauthorizedError``).

One deliberate difference: a ``createRecord`` at a key that is taken answers
``400 InvalidRequest`` "record already exists", where the reference PDS gives a
bare 500. Clients can tell a lost claim from a failure without reading back.

The methods, by job: :mod:`daemon.xrpc_server` (logins and sessions),
:mod:`daemon.xrpc_repo` (records), :mod:`daemon.xrpc_sync` (blobs);
:mod:`daemon.xrpc_access` checks callers, :mod:`daemon.xrpc_errors` answers failures.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, Depends

from daemon.auth import SessionTokens, load_secret
from daemon.served import Served
from daemon.sessions import SessionStore
from daemon.xrpc_access import XrpcAccess
from daemon.xrpc_errors import XrpcError, XrpcRoute, not_implemented
from daemon.xrpc_repo import RepoMethods
from daemon.xrpc_server import ServerMethods
from daemon.xrpc_sync import BlobMethods

__all__ = ["XrpcError", "router", "session_tokens"]

SECRET_FILE = "xrpc-session.key"
SESSIONS_FILE = "xrpc-sessions.sqlite3"  # beside the secret (SPEC §12: rotation, revocation)


def session_tokens(state_path: Path | None, audience: str) -> SessionTokens:
    """The session token issuer, its secret kept beside the state file."""
    secret = load_secret(state_path.with_name(SECRET_FILE) if state_path else None)
    return SessionTokens(secret, audience)


def router(service: Served, tokens: SessionTokens | None = None) -> APIRouter:
    """The ``/xrpc`` routes for ``service``'s local store and accounts."""
    state_path = service.config.state_path
    if tokens is None:
        tokens = session_tokens(state_path, "did:web:localhost")
    sessions = SessionStore(state_path.with_name(SESSIONS_FILE), tokens.secret, tokens.refresh_ttl)
    access = XrpcAccess(service, tokens, sessions)
    server, repo, blobs = ServerMethods(access), RepoMethods(access), BlobMethods(access)
    r = APIRouter(
        prefix="/xrpc",
        route_class=XrpcRoute,
        tags=["xrpc"],
        dependencies=[Depends(access.live_session)],
    )
    post, get = ["POST"], ["GET"]
    for nsid, endpoint, verbs in (
        ("com.atproto.server.createSession", server.create_session, post),
        ("com.atproto.server.refreshSession", server.refresh_session, post),
        ("com.atproto.server.getSession", server.get_session, get),
        ("com.atproto.server.deleteSession", server.delete_session, post),
        ("com.atproto.server.describeServer", server.describe_server, get),
        ("com.atproto.identity.resolveHandle", server.resolve_handle, get),
        ("com.atproto.repo.createRecord", repo.create_record, post),
        ("com.atproto.repo.putRecord", repo.put_record, post),
        ("com.atproto.repo.deleteRecord", repo.delete_record, post),
        ("com.atproto.repo.getRecord", repo.get_record, get),
        ("com.atproto.repo.listRecords", repo.list_records, get),
        ("com.atproto.repo.describeRepo", repo.describe_repo, get),
        ("com.atproto.repo.applyWrites", repo.apply_writes, post),
        ("com.atproto.repo.uploadBlob", blobs.upload_blob, post),
        ("com.atproto.sync.getBlob", blobs.get_blob, get),
    ):
        r.add_api_route(f"/{nsid}", endpoint, methods=verbs)
    # Anything else is a method this server does not serve, as a PDS says it.
    r.add_api_route("/{nsid}", not_implemented, methods=["GET", "POST"], include_in_schema=False)
    return r
