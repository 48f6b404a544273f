"""The Host check (SPEC §12): only requests addressed to one of the daemon's own names.

A web page on another origin can point a name it controls at 127.0.0.1 (DNS
rebinding) and then read whatever the daemon serves, since the browser thinks it
talks to the attacker's host. The browser still sends that name in ``Host``, so a
request whose Host is not one of ours is refused before its body is read.

Our names: the listen address, ``localhost``/``127.0.0.1``/``[::1]`` at the bound
port, and ``[http] allowed_hosts`` entries (``host`` for any port, ``host:port``).
With a wildcard listen address (``0.0.0.0``, ``::``) any IP literal is ours too:
an IP cannot be rebound, only names can.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Iterable

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

__all__ = ["HostCheck", "OwnNames", "split_host"]

WILDCARDS = frozenset({"0.0.0.0", "::", ""})


def split_host(value: str) -> tuple[str, int | None]:
    """``host[:port]`` or ``[v6][:port]`` -> (lower-case host without brackets, port)."""
    value = value.strip().lower()
    if value.startswith("["):
        host, sep, rest = value[1:].partition("]")
        if not sep:
            raise ValueError("unclosed [")
        if not rest:
            return host, None
        if not rest.startswith(":"):
            raise ValueError("junk after ]")
        return host, _port(rest[1:])
    if value.count(":") > 1:
        raise ValueError("an IPv6 host needs brackets")
    host, sep, port = value.partition(":")
    return host.rstrip("."), (_port(port) if sep else None)


def _port(text: str) -> int:
    if not text.isdigit() or not 0 < int(text) < 65536:
        raise ValueError(f"bad port {text!r}")
    return int(text)


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


class OwnNames:
    """Decides whether a Host header names this daemon."""

    def __init__(self, listen_host: str, port: Callable[[], int], allowed: Iterable[str]) -> None:
        self._listen = listen_host.strip("[]").lower()
        self._port = port  # read per request: the bound port is known only after bind
        self._any_port: set[str] = set()
        self._exact: set[tuple[str, int]] = set()
        for entry in allowed:
            host, entry_port = split_host(entry)
            if entry_port is None:
                self._any_port.add(host)
            else:
                self._exact.add((host, entry_port))

    def accepts(self, header: str) -> bool:
        try:
            host, port = split_host(header)
        except ValueError:
            return False
        if not host:
            return False
        if host in self._any_port:
            return True
        if port is None:
            port = 80  # http's default: a Host without a port means port 80
        if (host, port) in self._exact:
            return True
        if self._listen in WILDCARDS and _is_ip(host):
            return True
        own = {self._listen, "localhost", "127.0.0.1", "::1"}
        return host in own and port == self._port()


class HostCheck:
    """ASGI middleware: 400 ``InvalidHost`` unless the request's Host is one of ours."""

    def __init__(self, app: ASGIApp, *, names: OwnNames) -> None:
        self.app = app
        self.names = names

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        hosts = [v for k, v in scope.get("headers", ()) if k == b"host"]
        # Two Host headers are a request smuggling trick, not a name of ours.
        if len(hosts) == 1 and self.names.accepts(hosts[0].decode("latin-1")):
            await self.app(scope, receive, send)
            return
        message = (
            "the Host header is missing"
            if not hosts
            else "the Host header does not name this server (add it to [http] allowed_hosts)"
        )
        # Answered without calling receive(): the body is never read.
        response = JSONResponse({"error": "InvalidHost", "message": message}, status_code=400)
        await response(scope, receive, send)
