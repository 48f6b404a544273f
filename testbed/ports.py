"""A free TCP port on loopback, for a server that must be told its port before it starts."""

from __future__ import annotations

import random
import socket
from pathlib import Path

_PICK = random.SystemRandom()  # not the random module's: hypothesis seeds that one
_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def free_port() -> int:
    """A port that was free a moment ago, below the kernel's range for ephemeral ports.

    Bound and released at once, so another process may take it before the server binds.
    A port of the ephemeral range (what binding port 0 gives) is also what the kernel gives
    every outgoing connection as its own port; with the suite's workers opening connections
    by the thousand, a server told such a port found it taken ("Address already in use").
    Below that range only another pick like this one can take it. Servers that can report
    the port they bound (the daemon's Service, FakeModel) bind port 0 instead.
    """
    low = _ephemeral_low()
    if low > 2048:
        for _ in range(50):
            port = _PICK.randrange(max(1024, low - 16384), low)
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    continue
                return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ephemeral_low() -> int:
    try:
        return int(_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0  # not Linux, or not readable: port 0's pick
