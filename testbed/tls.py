"""One TLS context for every HTTP client the tests and the bench make.

httpx builds a context for each client it makes (``httpx.get`` included) and loads the
CA bundle into it: ~40-50 ms of CPU apiece. The suite's helpers make a client for each
poll and each request, thousands in a run, though every server they talk to is plain
HTTP on loopback. Passed as ``verify=tls()``, the context is built once a process.
"""

from __future__ import annotations

import ssl
from functools import cache

import httpx


@cache
def tls() -> ssl.SSLContext:
    return httpx.create_ssl_context()
