"""Shared pieces of the reliability tests: real ``turnd serve`` processes on loopback.

- :class:`Turnd` runs ``turnd serve --config ... --log-format json`` as a subprocess
  with its own config, state file and port, stdout/stderr captured to files;
- :class:`FakeProc` runs the fake model server in its own process (``python -m
  tests.support.reliability fake``), appending one JSON line per chat request (the text of
  the request's last user message) to a log file, so the tests count generations at
  the model;
- ``python -m tests.support.reliability writer`` hammers a local store with creates, puts
  and deletes until it is killed (the crash tests ``kill -9`` it).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from testbed.ports import free_port
from testbed.processes import stop
from tests.support import cli
from tests.support.accounts import ACCOUNT_ENV, ALICE, ALICE_TOKEN, BOB
from tests.support.cli import TURND
from tests.support.records import MESSAGE, user_message
from turns.tls import tls_context

ROOT = Path(__file__).resolve().parents[2]
# Not shaped like an OpenAI key, so only the configured-secret redaction can hide it.
API_KEY = "key-SeCrEt-7f3a9b2c4d5e6f708192a3b4"



def clean_env(**extra: str) -> dict[str, str]:
    """The host's environment without provider keys or TURND_*, with the accounts'
    secrets and the fake provider's key."""
    return cli.clean_env(**{**ACCOUNT_ENV, "T_FAKE_KEY": API_KEY, **extra})


# Both accounts of a local store, their secrets from clean_env().
LOCAL_ACCOUNTS = f"""
[accounts.alice]
handle = "alice.test"
did = "{ALICE}"
password_env = "T_ALICE_PASSWORD"
token_env = "T_ALICE_TOKEN"

[accounts.bob]
handle = "bob.test"
did = "{BOB}"
password_env = "T_BOB_PASSWORD"
token_env = "T_BOB_TOKEN"
"""


def write_config(
    path: Path,
    *,
    data: Path,
    state: Path,
    port: int,
    model_url: str,
    turns: dict[str, Any] | None = None,
    extra: str = "",
    store: str | None = None,
    accounts: str = LOCAL_ACCOUNTS,
) -> Path:
    """A ``turnd serve`` config; ``store`` is the [store] table's body (a local store in
    ``data`` unless given), ``accounts`` the [accounts.*] tables."""
    # No generated titles: they are model requests these counts do not expect.
    settings = {"retries": 0, "ratePerMinute": 100_000, "titleModel": "", **(turns or {})}
    lines = "\n".join(f"{k} = {json.dumps(v)}" for k, v in settings.items())
    store = store or f'kind = "local"\npath = "{data}"'
    path.write_text(
        f"""
[store]
{store}

[state]
path = "{state}"

[http]
listen = "127.0.0.1:{port}"
web = false

[models]
default = "fake:fake-model"

[turns]
{lines}

[providers.fake]
base_url = "{model_url}"
api_key_env = "T_FAKE_KEY"
{accounts}{extra}
"""
    )
    return path


@dataclass
class Turnd:
    """One ``turnd serve`` process. ``start()`` again after ``kill()`` restarts it."""

    work: Path
    name: str
    data: Path
    model_url: str
    turns: dict[str, Any] = field(default_factory=dict)
    extra: str = ""
    env: dict[str, str] = field(default_factory=dict)  # more variables for the process
    port: int = 0
    proc: subprocess.Popen[bytes] | None = None
    runs: int = 0

    def __post_init__(self) -> None:
        self.port = self.port or free_port()
        self.state = self.work / f"{self.name}.state.sqlite3"
        self.config = self.work / f"{self.name}.toml"
        self.write_config()

    def write_config(self) -> None:
        write_config(
            self.config,
            data=self.data,
            state=self.state,
            port=self.port,
            model_url=self.model_url,
            turns=self.turns,
            extra=self.extra,
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def out_path(self, run: int | None = None) -> Path:
        return self.work / f"{self.name}.{self.runs if run is None else run}.out"

    def err_path(self, run: int | None = None) -> Path:
        return self.work / f"{self.name}.{self.runs if run is None else run}.err"

    def start(self, timeout: float = 30) -> Turnd:
        self.runs += 1
        with self.out_path().open("wb") as o, self.err_path().open("wb") as e:
            self.proc = subprocess.Popen(
                [TURND, "serve", "--config", str(self.config), "--log-format", "json"],
                cwd=self.work,
                env=clean_env(**self.env),
                stdout=o,
                stderr=e,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if "turnd: serving" in self.out_path().read_text():
                break
            if self.proc.poll() is not None:
                raise AssertionError(f"{self.name} exited {self.proc.returncode}: {self.logs()}")
            time.sleep(0.05)
        else:
            raise AssertionError(f"{self.name} not serving after {timeout}s: {self.logs()}")
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.url}/healthz", timeout=2, verify=tls_context()).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        raise AssertionError(f"{self.name}: /healthz not 200: {self.logs()}")

    def kill(self) -> None:
        """kill -9, as a crash."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self, timeout: float = 45) -> int | None:
        if self.proc is None:
            return None
        stop(self.proc, timeout)
        return self.proc.returncode

    def logs(self) -> str:
        """stdout and stderr of every run so far."""
        out = []
        for run in range(1, self.runs + 1):
            for p in (self.out_path(run), self.err_path(run)):
                if p.exists():
                    out.append(p.read_text(errors="replace"))
        return "\n".join(out)

    def turn_lines(self) -> list[dict[str, Any]]:
        """The one-line-per-turn JSON log records of every run."""
        found = []
        for line in self.logs().splitlines():
            if line.startswith("{"):
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue
                if rec.get("logger") == "turnd.turns" and "status" in rec and "key" in rec:
                    found.append(rec)
        return found

    def rss_kb(self) -> int:
        assert self.proc is not None
        status = Path(f"/proc/{self.proc.pid}/status").read_text()
        return int(re.search(r"VmRSS:\s+(\d+)", status).group(1))  # type: ignore[union-attr]

    def client(self, token: str = ALICE_TOKEN, timeout: float = 30) -> httpx.Client:
        return httpx.Client(
            base_url=self.url,
            headers={"Authorization": f"Bearer {token}"},
            timeout=timeout,
            verify=tls_context(),
        )

    def aclient(self, token: str = ALICE_TOKEN, timeout: float = 30, **kw: Any) -> httpx.AsyncClient:
        # httpx keeps an idle connection 5 s, exactly uvicorn's keep-alive timeout: a POST
        # sent as the server closes it fails with ReadError (httpx retries no POST). A
        # client that lets idle connections go first never races the server's close.
        kw.setdefault("limits", httpx.Limits(keepalive_expiry=2.0))
        kw.setdefault("verify", tls_context())
        return httpx.AsyncClient(
            base_url=self.url, headers={"Authorization": f"Bearer {token}"}, timeout=timeout, **kw
        )


class FakeProc:
    """The fake model server in its own process, logging each chat request's prompt."""

    def __init__(
        self,
        work: Path,
        *,
        tokens: int = 5,
        chunk_delay_ms: float = 0,
        ttft_ms: float = 0,
        word: str = "tok",
    ) -> None:
        self.log = work / f"fake-{os.getpid()}-{time.monotonic_ns()}.jsonl"
        self.log.touch()
        self.proc = subprocess.Popen(
            [
                sys.executable, "-m", "tests.support.reliability", "fake", "--log", str(self.log),
                "--tokens", str(tokens), "--chunk-delay-ms", str(chunk_delay_ms),
                "--ttft-ms", str(ttft_ms), "--word", word,
            ],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        ready = json.loads(self.proc.stdout.readline())
        self.base_url: str = ready["base_url"]
        self.pid = ready["pid"]

    def prompts(self) -> Counter[str]:
        """How many chat requests each last-user-message text got."""
        counts: Counter[str] = Counter()
        for line in self.log.read_text().splitlines():
            if line:
                counts[json.loads(line)["prompt"]] += 1
        return counts

    def stop(self) -> None:
        stop(self.proc)


def wait_until(predicate: Any, timeout: float, what: str, interval: float = 0.1) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        got = predicate()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


# -- subprocess entry points ------------------------------------------------------------------


def _last_user_text(request: dict[str, Any]) -> str:
    for message in reversed(request.get("messages") or []):
        if message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, list):
                return "".join(c.get("text", "") for c in content if isinstance(c, dict))
            return str(content)
    return ""


def _fake_main(args: argparse.Namespace) -> int:
    from testbed.fakemodel import FakeModel, Reply

    log = open(args.log, "a", buffering=1)  # noqa: SIM115 - lives as long as the process

    def responder(request: dict[str, Any]) -> None:
        log.write(json.dumps({"prompt": _last_user_text(request), "t": time.time()}) + "\n")
        return None  # the default reply

    fake = FakeModel(
        record=False,
        responder=responder,
        default=Reply.tokens(args.tokens, args.word).delayed(args.ttft_ms / 1000, args.chunk_delay_ms / 1000),
    )

    def ready(f: FakeModel) -> None:
        print(json.dumps({"base_url": f.base_url, "pid": os.getpid()}), flush=True)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, f.stop)

    asyncio.run(fake.serve(ready))
    return 0


def _writer_main(args: argparse.Namespace) -> int:
    """A zygote of store writers: imports once, then for each ``go SEED`` line on stdin
    forks a child that creates, puts and deletes records in a loop until it is killed.

    Prints ``loaded`` once imported, ``ready PID`` when a child has the store open, and
    ``exit PID SIGNAL`` when that child has died (the test kills it with SIGKILL)."""
    from recordstore import CONVERSATION
    from recordstore.keys import new_tid
    from recordstore.local import LocalStore

    async def run(seed: int) -> None:
        rng = random.Random(seed)
        async with LocalStore.open(args.data, poll_interval=0.05) as store:
            skey = args.space
            await store.create_space(ALICE, CONVERSATION, skey)
            mine = [r.key for r in (await store.list_records(ALICE, skey, MESSAGE, limit=100))[0]]
            print(f"ready {os.getpid()}", flush=True)
            i = 0
            while True:
                i += 1
                roll = rng.random()
                if roll < 0.5 or not mine:
                    key = new_tid()
                    text = f"w{seed}-{i} " + "x" * rng.randrange(0, 1500)
                    await store.create_record(ALICE, skey, MESSAGE, key, user_message(text))
                    mine.append(key)
                elif roll < 0.9:
                    key = rng.choice(mine)
                    rec = await store.get_record(ALICE, skey, MESSAGE, key)
                    value = user_message(f"put {i} " + "y" * rng.randrange(0, 1500))
                    await store.put_record(
                        ALICE, skey, MESSAGE, key, value, swap_cid=rec.cid if rec else None
                    )
                else:
                    key = mine.pop(rng.randrange(len(mine)))
                    await store.delete_record(ALICE, skey, MESSAGE, key)

    print("loaded", flush=True)
    for line in sys.stdin:
        command, _, seed = line.partition(" ")
        if command != "go":
            break
        pid = os.fork()
        if pid == 0:  # the child: write until killed
            try:
                asyncio.run(run(int(seed)))
            finally:
                os._exit(1)
        _, status = os.waitpid(pid, 0)
        print(f"exit {pid} {os.WTERMSIG(status) if os.WIFSIGNALED(status) else -1}", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.support.reliability")
    sub = p.add_subparsers(dest="command", required=True)
    f = sub.add_parser("fake")
    f.add_argument("--log", required=True)
    f.add_argument("--tokens", type=int, default=5)
    f.add_argument("--chunk-delay-ms", type=float, default=0)
    f.add_argument("--ttft-ms", type=float, default=0)
    f.add_argument("--word", default="tok")
    w = sub.add_parser("writer")
    w.add_argument("--data", required=True)
    w.add_argument("--space", required=True)
    w.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    return _fake_main(args) if args.command == "fake" else _writer_main(args)


if __name__ == "__main__":
    sys.exit(main())
