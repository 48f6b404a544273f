"""A free TCP port on loopback, for a server that must be told its port before it starts."""

from __future__ import annotations

import socket


def free_port() -> int:
    # Bound and released at once: another process may take it before the server binds,
    # which on loopback in a test run is rare enough to accept (servers that can report
    # the port they bound — the daemon's Service, FakeModel — bind port 0 instead).
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
