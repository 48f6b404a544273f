"""One TLS context for every HTTP client of the process.

Each client built without one makes its own and loads the CA bundle into it: 40-120 ms
of CPU and ~0.5 MB apiece on a 2-core machine. A `turnd serve` start built three (one
shared by the providers' openai clients, the engine's client for tools and URL
attachments, the start-up probe of the default provider), `turnd check` one a provider,
and the model picker one per listing; the test suite's helpers one per poll and request.
The context holds the defaults every one of them would have built. The tests and the
bench pass it to their own clients too, so a process that runs a daemon in-process and
talks to it has one context, not two.
"""

from __future__ import annotations

import ssl
from functools import cache

import httpx


@cache
def tls_context() -> ssl.SSLContext:
    return httpx.create_ssl_context()
