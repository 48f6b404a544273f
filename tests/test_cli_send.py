"""``turnd send`` at the edges a new user meets (SPEC §17), as real subprocesses:

- the very first command, before any ``turnd serve`` (no data directory, no account):
  the one line that says to start the daemon, not "no account";
- a daemon that answers ``/healthz`` and then goes away while the message is being
  written (here a real loopback HTTP server that drops every other request, as a daemon
  killed at that moment does): one "lost turnd at URL" line, no exception name.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from testbed.ports import free_port
from tests.support.cli import ME_PASSWORD, ME_TOKEN, clean_env, me_config, turnd


def test_the_first_send_before_any_serve_says_to_start_it(tmp_path: Path) -> None:
    port = free_port()  # nothing listens there
    sent = turnd("send", "hello", cwd=tmp_path, env=clean_env(TURND_HTTP_LISTEN=f"127.0.0.1:{port}"))
    assert sent.returncode == 1
    assert sent.stderr == (
        f"turnd: cannot reach turnd at http://127.0.0.1:{port} — is `turnd serve` running?\n"
    )
    assert sent.stdout == "" and not (tmp_path / "turnd-data").exists()


class _HealthOnly(BaseHTTPRequestHandler):
    """``/healthz`` answers; anything else finds the connection closed, unanswered."""

    requests: list[str] = []

    def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
        self._handle()

    def do_POST(self) -> None:  # noqa: N802
        self._handle()

    def _handle(self) -> None:
        self.requests.append(f"{self.command} {self.path}")
        if self.path == "/healthz":
            body = b'{"ok":true}'
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        else:
            self.close_connection = True
            self.connection.shutdown(2)  # gone mid-request: no status line at all

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def health_only() -> Iterator[int]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _HealthOnly)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def test_a_daemon_gone_while_the_message_is_written_is_one_line(
    tmp_path: Path, health_only: int
) -> None:
    conf = me_config(tmp_path, health_only, default="echo:echo", providers="")
    env = clean_env(ME_PASSWORD=ME_PASSWORD, ME_TOKEN=ME_TOKEN)
    _HealthOnly.requests.clear()
    sent = turnd("send", "--config", str(conf), "hello", cwd=tmp_path, env=env)
    assert sent.returncode == 1
    assert sent.stderr == (
        f"turnd: lost turnd at http://127.0.0.1:{health_only} — is `turnd serve` still running?\n"
    ), sent.stderr
    # It got past the health check: the login is what found the daemon gone.
    assert _HealthOnly.requests[0] == "GET /healthz"
    assert any("createSession" in r for r in _HealthOnly.requests), _HealthOnly.requests
