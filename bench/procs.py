"""The processes a bench run measures: the fake model, ``turnd serve``, their /proc figures.

Each runs in its own OS process on loopback, as a user would run it; the bench only
talks to them over HTTP (and reads the local store's SQLite file to see claims).
"""

from __future__ import annotations

import json
import os
import secrets
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from daemon.accounts import local_did
from testbed.ports import free_port
from testbed.processes import stop
from turns.tls import tls_context

ROOT = Path(__file__).resolve().parent.parent
HANDLE = "bench.test"
DID = local_did(HANDLE)



def rss_bytes(pid: int) -> int:
    """Resident set size of ``pid`` (VmRSS)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for {pid}")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of ``pid`` so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class FakeModelProc:
    """``python -m testbed.fakemodel`` in its own process."""

    tokens: int = 200
    ttft_ms: float = 20.0
    chunk_delay_ms: float = 0.0
    proc: subprocess.Popen[str] | None = None
    base_url: str = ""

    def __enter__(self) -> FakeModelProc:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "testbed.fakemodel", "--port", "0",
             "--tokens", str(self.tokens), "--ttft-ms", str(self.ttft_ms),
             "--chunk-delay-ms", str(self.chunk_delay_ms), "--no-record"],
            stdout=subprocess.PIPE, text=True, cwd=ROOT,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            stop(self.proc, kill_wait=5)
            raise RuntimeError("the fake model server did not start")
        self.base_url = json.loads(line)["base_url"]
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            stop(self.proc, kill_wait=5)

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid


def wait_ready(
    proc: subprocess.Popen[bytes],
    url: str,
    what: str,
    log_tail: Callable[[], str],
    timeout: float,
    interval: float = 0.05,
    *,
    on_failure: Callable[[], None] = lambda: None,
) -> None:
    """Poll ``url`` until it answers 200; fail at once if ``proc`` exits first. When it
    fails (or is interrupted), ``on_failure`` runs first: the caller's clean-up."""
    try:
        _poll_ready(proc, url, what, log_tail, timeout, interval)
    except BaseException:
        on_failure()
        raise


def _poll_ready(
    proc: subprocess.Popen[bytes], url: str, what: str, log_tail: Callable[[], str],
    timeout: float, interval: float,
) -> None:
    deadline = time.monotonic() + timeout
    with httpx.Client(timeout=2, verify=tls_context()) as client:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"{what} exited: {log_tail()}")
            try:
                if client.get(url).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(interval)
    raise RuntimeError(f"{what} not ready after {timeout:.0f}s: {log_tail()}")


def turnd_command() -> list[str]:
    """``turnd``; ``$TURND_BENCH_TURND`` replaces it (e.g. a profiler or a patched build)."""
    override = os.environ.get("TURND_BENCH_TURND")
    if override:
        return shlex.split(override)
    script = Path(sys.executable).parent / "turnd"
    if script.exists():
        return [str(script)]
    found = shutil.which("turnd")
    if found:
        return [found]
    return [sys.executable, "-m", "daemon.cli"]


@dataclass
class TurndProc:
    """``turnd serve --config <tmp>/turnd.toml`` in its own process, local store.

    ``providers`` maps a provider name to an OpenAI-compatible base URL; the first one
    is the default model's provider.
    """

    providers: dict[str, str]
    rate_per_minute: int = 1_000_000
    # TOML appended to the config (more tables: prices, a quota, [otel]).
    extra: str = ""
    # The command that runs turnd (default: ``turnd``); e.g. a profiler in front of it.
    command: list[str] | None = None
    proc: subprocess.Popen[bytes] | None = None
    port: int = 0
    token: str = field(default_factory=lambda: secrets.token_urlsafe(24))
    password: str = field(default_factory=lambda: secrets.token_urlsafe(18))
    tmp: Path | None = None
    # [cluster] (SPEC §18): the Redis URL, and a store directory shared with other instances.
    redis_url: str | None = None
    data_dir: Path | None = None
    # [http] max_connections: the many-streams run holds more than the default 1000 open.
    max_connections: int | None = None
    _tmpdir: tempfile.TemporaryDirectory[str] | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    @property
    def store_file(self) -> Path:
        assert self.tmp is not None
        return (self.data_dir or self.tmp / "data") / "store.sqlite3"

    @property
    def state_file(self) -> Path:
        assert self.tmp is not None
        return self.tmp / "state.sqlite3"  # the config's [state] path, beside it

    @property
    def log_file(self) -> Path:
        assert self.tmp is not None
        return self.tmp / "turnd.log"

    def _config(self) -> str:
        first = next(iter(self.providers))
        data = str(self.data_dir) if self.data_dir else "data"
        lines = [
            "[store]", 'kind = "local"', f'path = "{data}"', "",
            "[state]", 'path = "state.sqlite3"', "",
            "[http]", f'listen = "127.0.0.1:{self.port}"', "web = false",
            *([f"max_connections = {self.max_connections}"] if self.max_connections else []), "",
            "[models]", f'default = "{first}:fake-model"', "",
            "[turns]", f"ratePerMinute = {self.rate_per_minute}", "retries = 0", "",
        ]
        for name, url in self.providers.items():
            lines += [f"[providers.{name}]", f'base_url = "{url}"',
                      'api_key_env = "BENCH_PROVIDER_KEY"', ""]
        lines += ["[accounts.bench]", f'handle = "{HANDLE}"', f'did = "{DID}"',
                  'password_env = "BENCH_PASSWORD"', 'token_env = "BENCH_TOKEN"', ""]
        if self.redis_url:
            lines += ["[cluster]", 'redis_url_env = "BENCH_REDIS_URL"', ""]
        return "\n".join(lines) + ("\n" + self.extra if self.extra else "")

    def __enter__(self) -> TurndProc:
        self._tmpdir = tempfile.TemporaryDirectory(prefix="turnd-bench-")
        self.tmp = Path(self._tmpdir.name)
        self.port = free_port()
        config = self.tmp / "turnd.toml"
        config.write_text(self._config())
        env = {**os.environ, "BENCH_PROVIDER_KEY": "sk-bench-fake",
               "BENCH_PASSWORD": self.password, "BENCH_TOKEN": self.token,
               "BENCH_REDIS_URL": self.redis_url or ""}
        for var in [v for v in env if v.startswith("TURND_")]:
            del env[var]
        log = self.log_file.open("wb")
        self.proc = subprocess.Popen(
            [*(self.command or turnd_command()), "serve", "--config", str(config)],
            stdout=log, stderr=subprocess.STDOUT, env=env, cwd=self.tmp,
        )
        log.close()
        wait_ready(self.proc, self.base_url + "/healthz", "turnd serve", self.log_tail, 30.0,
                   on_failure=self.__exit__)
        return self

    def log_tail(self, lines: int = 5) -> str:
        try:
            return " | ".join(self.log_file.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            stop(self.proc, 40, 5)
        if self._tmpdir is not None:
            self._tmpdir.cleanup()
            self._tmpdir = None


def spawn(args: Sequence[str], **kw: Any) -> subprocess.Popen[Any]:
    return subprocess.Popen(list(args), **kw)
