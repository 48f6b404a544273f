"""One TLS context per HTTP library for every client of the process.

Each client built without one makes its own and loads the CA bundle into it: 40-120 ms
of CPU and ~0.5 MB apiece on a 2-core machine. A `turnd serve` start built three (one
shared by the providers' openai clients, the engine's client for tools and URL
attachments, the start-up probe of the default provider), `turnd check` one a provider,
and the model picker one per listing; the test suite's helpers one per poll and request.
The tests and the bench pass it to their own clients too, so a process that runs a daemon
in-process and talks to it has one context, not two.

The two libraries trust different roots, and each context keeps its library's own
defaults: httpx's is certifi's bundle; the ``openai`` client's httpx2 trusts the system's
store (where a self-hoster adds the CA of an internal model server). Whatever talks to a
model provider (its openai clients, `turnd check` and the start-up probe, the model picker's
listing) takes :func:`model_tls_context`, so it trusts what the openai client would.
"""

from __future__ import annotations

import ssl
from functools import cache

import httpx


@cache
def tls_context() -> ssl.SSLContext:
    """What every ``httpx`` client would build for itself."""
    return httpx.create_ssl_context()


def tls_context_for(url: str) -> ssl.SSLContext:
    """The shared context for an ``https`` URL; for plain ``http``, one that trusts nothing.

    httpx builds its transport's context up front, whatever the scheme, and loading the
    CA bundle is ~35 ms of a `turnd send` against the local daemon's ``http://`` URL
    (SPEC §10: ≤ 0.5 s). A redirect from there to ``https`` then fails verification
    rather than skipping it.
    """
    if url[:6].lower() == "https:":
        return tls_context()
    return _trusts_nothing()


@cache
def _trusts_nothing() -> ssl.SSLContext:
    return ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # verifies, with no root to verify against


@cache
def model_tls_context() -> ssl.SSLContext:
    """What every ``openai`` client (``httpx2``) would build for itself."""
    import httpx2  # openai's, imported by then; not by commands that never ask a model

    return httpx2.create_ssl_context()
