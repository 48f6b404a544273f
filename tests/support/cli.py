"""``turnd`` as its users run it: the console script in subprocesses on loopback.

- ``TURND``: the console script of this virtual environment;
- ``clean_env``: the host's environment without provider keys or ``TURND_*``;
- ``turnd(...)``: one command run to its end; ``Served``: a ``turnd serve`` process
  (the ``serve`` fixture in ``fixtures`` starts them and kills what is left);
- ``wait_healthy``: poll ``/healthz`` with a deadline;
- ``me_config``: a config file for the one account ``me``; ``fake_config``: one on the
  fake model server, with its environment.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from turns.tls import tls_context

TURND = str(Path(sys.executable).parent / "turnd")
# The secrets me_config's account reads (its password and /api token).
ME_PASSWORD = "pw-123456789"
ME_TOKEN = "tok-123456789"


def clean_env(**extra: str) -> dict[str, str]:
    """No provider keys or TURND_* from the host: the tests pick the echo themselves."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("TURND_") and k not in ("OPENAI_API_KEY", "OPENROUTER_API_KEY")
    }
    env.update(extra)
    return env


@dataclass
class Served:
    proc: subprocess.Popen[bytes]
    out: Path
    err: Path
    url: str

    def stdout(self) -> str:
        return self.out.read_text()

    def stderr(self) -> str:
        return self.err.read_text()

    def wait_for(self, pattern: str, timeout: float = 60, *, stderr: bool = False) -> re.Match[str]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = re.search(pattern, self.stderr() if stderr else self.stdout())
            if found:
                return found
            if self.proc.poll() is not None:
                raise AssertionError(f"turnd exited {self.proc.returncode}: {self.stderr()}")
            time.sleep(0.05)
        raise AssertionError(f"no {pattern!r} in {self.stdout()!r} / {self.stderr()!r}")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 40) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        return self.proc.wait(timeout)


def wait_healthy(url: str, timeout: float = 5) -> None:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = httpx.get(f"{url}/healthz", timeout=2, verify=tls_context())
            if last.status_code == 200:
                return
        except httpx.HTTPError as err:
            last = err
        time.sleep(0.05)
    raise AssertionError(f"/healthz not 200 after {timeout}s: {last}")


def turnd(*args: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [TURND, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=90
    )


def me_config(
    work: Path, port: int, *, default: str, providers: str, turns: str = ""
) -> Path:
    """``work/turnd.toml``: listening on ``port``, the one account ``me`` (its password and
    token from ``ME_PASSWORD`` and ``ME_TOKEN``); ``providers`` and ``turns`` are TOML tables."""
    conf = work / "turnd.toml"
    conf.write_text(
        f"""
[http]
listen = "127.0.0.1:{port}"
[models]
default = "{default}"
{turns}
{providers}
[accounts.me]
handle = "me.test"
password_env = "ME_PASSWORD"
token_env = "ME_TOKEN"
"""
    )
    return conf


def fake_config(work: Path, base_url: str, port: int) -> tuple[Path, dict[str, str]]:
    """``me_config`` on the fake model server at ``base_url``, and the environment
    ``turnd`` runs it with (the secrets, and ``TURND_HTTP_LISTEN`` for ``Served``'s URL)."""
    fake_provider = f'[providers.fake]\nbase_url = "{base_url}"\napi_key_env = "FAKE_KEY"\n'
    conf = me_config(work, port, default="fake:fake-model", providers=fake_provider)
    env = clean_env(FAKE_KEY="sk-fake-123456", ME_PASSWORD=ME_PASSWORD, ME_TOKEN=ME_TOKEN)
    env["TURND_HTTP_LISTEN"] = f"127.0.0.1:{port}"  # the same as the file; tells Served its URL
    return conf, env
