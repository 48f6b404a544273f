"""The bench's phases. Each returns, per run, a dict of figures; ``__main__`` takes the
median over runs and shows min and max beside it."""

from __future__ import annotations

import contextlib
import math
import os
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio

from bench import client as c
from bench.procs import DID, HANDLE, FakeModelProc, TurndProc, cpu_seconds, rss_bytes
from recordstore.keys import new_tid
from recordstore.times import now_iso

Log = Callable[[str], None]


def pct(values: list[float], q: float) -> float:
    """The q-th percentile (0-100), nearest rank on the sorted values."""
    s = sorted(values)
    if not s:
        raise ValueError("no values")
    k = max(0, min(len(s) - 1, round(q / 100 * (len(s) - 1))))
    return s[k]


def ms(seconds: float) -> float:
    return seconds * 1000.0


async def _gather(factories: list[Callable[[], Awaitable[Any]]]) -> list[Any]:
    results: list[Any] = [None] * len(factories)

    async def one(i: int, f: Callable[[], Awaitable[Any]]) -> None:
        results[i] = await f()

    async with anyio.create_task_group() as tg:
        for i, f in enumerate(factories):
            tg.start_soon(one, i, f)
    return results


# -- time to first token -----------------------------------------------------------------


async def ttft(turnd: TurndProc, fake: FakeModelProc, runs: int, samples: int,
               log: Log) -> list[dict[str, float]]:
    """POST -> first delta at a subscriber, against the bare client's request -> first
    chunk from the same fake server, interleaved one for one."""
    out = []
    async with c.api_client(turnd.base_url, turnd.token) as http, c.bare_client(fake.base_url) as bare:
        for _ in range(5):  # warm-up: connections, the provider's client, caches
            await c.turnd_turn(http, await c.new_conversation(http))
            await c.bare_stream(bare)
        for run in range(runs):
            turnd_s, bare_s = [], []
            for _ in range(samples):
                skey = await c.new_conversation(http)
                bare_s.append(await c.bare_stream(bare))
                turnd_s.append(await c.turnd_turn(http, skey))
            model = statistics.median(s.ttft for s in bare_s)
            tt = [s.ttft for s in turnd_s]
            tok_t = statistics.median(s.per_token for s in turnd_s if s.per_token is not None)
            tok_b = statistics.median(s.per_token for s in bare_s if s.per_token is not None)
            fig = {
                "ttft_overhead_ms_p50": ms(statistics.median(tt) - model),
                "ttft_overhead_ms_p99": ms(pct(tt, 99) - model),
                "turnd_ttft_ms_p50": ms(statistics.median(tt)),
                "model_ttft_ms_p50": ms(model),
                "per_token_overhead_us": (tok_t - tok_b) * 1e6,
                "turnd_per_token_us": tok_t * 1e6,
                "bare_per_token_us": tok_b * 1e6,
            }
            log(f"  ttft run {run + 1}/{runs}: overhead p50 {fig['ttft_overhead_ms_p50']:.2f} ms, "
                f"p99 {fig['ttft_overhead_ms_p99']:.2f} ms (model {fig['model_ttft_ms_p50']:.2f} ms)")
            out.append(fig)
    return out


# -- claims of direct writes -------------------------------------------------------------


def _user_message() -> dict[str, Any]:
    return {
        "$type": c.MESSAGE,
        "role": "user",
        "content": {"$type": c.PLAIN, "parts": [{"$type": c.TEXT_PART, "text": "hi"}]},
        "generation": {"attempt": 0},
        "createdAt": now_iso(),
    }


async def claims(turnd: TurndProc, runs: int, samples: int, log: Log) -> list[dict[str, float]]:
    """A direct write through turnd's XRPC (this process is the other process) -> the
    reply's placeholder in the store file -> the first delta on its stream."""
    out = []
    early_status = [0]  # subscriptions answered "pending" before the stream opened
    built: list[float] = []  # seconds the bench's client took to build each write
    watcher = c.ClaimWatcher(turnd.store_file, DID)
    try:
        async with c.api_client(turnd.base_url, turnd.token) as http:
            jwt = await c.xrpc_session(http, HANDLE, turnd.password)

            async def one() -> tuple[float, float, float]:
                skey = new_tid()
                await c.xrpc_create(http, jwt, DID, c.INFO, f"{skey}:self",
                                    {"$type": c.INFO, "createdAt": now_iso()})
                await anyio.sleep(0.01)  # let the feed pass the info record
                key = new_tid()
                record = _user_message()
                claimed: list[float] = []

                async def watch() -> None:
                    claimed.append(await watcher.wait(skey, f"{key}.r0"))

                # Watched from the write's start: the claim may come before the write's
                # answer (turnd answers a message it starts after its claim, as a POST).
                # The request is built (its JSON, its headers) before the clock starts:
                # httpx took ~0.45 ms of this process's CPU for that here, which was in
                # the figure and is the writer's, not turnd's (README, "Benchmarks").
                b0 = c.now()
                request = c.xrpc_create_request(http, jwt, DID, c.MESSAGE, f"{skey}:{key}", record)
                async with anyio.create_task_group() as tg:
                    t0 = c.now()
                    built.append(t0 - b0)
                    tg.start_soon(watch)
                    await c.xrpc_send(http, request)
                t_claim = claimed[0]
                url = f"/api/conversations/{skey}/messages/{key}.r0/stream"
                res = await c.read_reply(http, url)
                for _ in range(100):
                    # The placeholder can be in the store a moment before turnd opens the
                    # reply's stream buffer; until then the route answers the stored
                    # "pending" and closes. Subscribe again.
                    if res.first_delta is not None or '"pending"' not in (res.status or ""):
                        break
                    early_status[0] += 1
                    await anyio.sleep(0.001)
                    res = await c.read_reply(http, url)
                if res.first_delta is None:
                    raise RuntimeError(f"direct write {key}: no delta (status {res.status})")
                return t_claim - t0, res.first_delta - t0, res.first_delta - t_claim

            for _ in range(3):
                await one()
            for run in range(runs):
                built.clear()
                rows = [await one() for _ in range(samples)]
                fig = {
                    "claim_latency_ms_p50": ms(statistics.median(r[0] for r in rows)),
                    "xrpc_request_build_ms_p50": ms(statistics.median(built)),
                    "claim_latency_ms_p99": ms(pct([r[0] for r in rows], 99)),
                    "xrpc_write_to_first_delta_ms_p50": ms(statistics.median(r[1] for r in rows)),
                    "claim_to_first_delta_ms_p50": ms(statistics.median(r[2] for r in rows)),
                    "stream_not_yet_open": float(early_status[0]),
                }
                early_status[0] = 0
                log(f"  claim run {run + 1}/{runs}: claimed p50 {fig['claim_latency_ms_p50']:.2f} ms, "
                    f"write->first delta p50 {fig['xrpc_write_to_first_delta_ms_p50']:.2f} ms")
                out.append(fig)
    finally:
        watcher.close()
    return out


# -- streaming throughput -----------------------------------------------------------------


async def streaming(turnd: TurndProc, fake: FakeModelProc, runs: int, streams: int,
                    log: Log, provider: str | None = None,
                    warm_up: int = 50) -> list[dict[str, float]]:
    """Tokens/s to SSE subscribers with ``streams`` concurrent turns, against tokens/s the
    bare client reads with ``streams`` concurrent streams from the same fake server.

    Every stream is checked: ``stream_events_missing`` counts the events a subscriber
    did not receive (gaps in the ids, and tokens short of the fake's ``tokens``),
    ``stream_incomplete`` the turns that did not end ``complete``."""
    out = []
    async with contextlib.AsyncExitStack() as stack:
        # One client per stream on both sides, as every subscriber and every bare reader
        # is a user of its own. One client for all held 2 x streams connections, and
        # httpcore's pool walks every connection at each request and each release: half
        # of the bench process's CPU at 200 streams (py-spy), so that process, not turnd,
        # set the pace of turnd's side (README, "Benchmarks").
        https = [await stack.enter_async_context(c.api_client(turnd.base_url, turnd.token, 2))
                 for _ in range(streams)]
        bares = [await stack.enter_async_context(c.bare_client(fake.base_url, 1))
                 for _ in range(streams)]

        async def bare_batch(n: int = streams) -> tuple[float, int, float]:
            # Both sides start a timed batch with their ``n`` connections open: turnd's
            # from creating the conversations, the bare one's from a model list.
            await _gather([lambda b=b: b.models.list() for b in bares[:n]])
            cpu0, t0 = time.process_time(), c.now()
            got = await _gather([lambda b=b: c.bare_stream(b) for b in bares[:n]])
            wall, cpu = c.now() - t0, time.process_time() - cpu0
            tokens = sum(s.tokens for s in got)
            return tokens / wall, tokens, cpu / tokens

        async def turnd_batch(n: int = streams) -> tuple[float, int, float, int, int]:
            skeys = await _gather([lambda h=h: c.new_conversation(h) for h in https[:n]])
            cpu0, t0 = cpu_seconds(turnd.pid), c.now()
            got = await _gather([lambda h=h, s=s: c.turnd_turn(h, s, provider)
                                 for h, s in zip(https[:n], skeys, strict=True)])
            wall, cpu = c.now() - t0, cpu_seconds(turnd.pid) - cpu0
            tokens = sum(s.tokens for s in got)
            bad = [s.status for s in got if s.status is None or '"complete"' not in s.status]
            missing = sum(s.last_id - s.events + max(0, fake.tokens - s.tokens) for s in got)
            if bad or missing:
                # Reported, not hidden: the run's figures say how many.
                log(f"  {len(bad)} of {n} turns did not end complete ({bad[:1]}), "
                    f"{missing} events not delivered")
            resubscribed[0] += sum(s.resubscribed for s in got)
            return tokens / wall, tokens, cpu / max(tokens, 1), len(bad), missing

        resubscribed = [0]
        await bare_batch(min(streams, warm_up))  # warm-up of both paths
        await turnd_batch(min(streams, warm_up))
        for run in range(runs):
            resubscribed[0] = 0
            b_rate, b_tokens, b_cpu = await bare_batch()
            t_rate, t_tokens, t_cpu, incomplete, missing = await turnd_batch()
            fig = {
                "stream_ratio": t_rate / b_rate,
                "turnd_tokens_per_s": t_rate,
                "bare_tokens_per_s": b_rate,
                "turnd_cpu_us_per_token": t_cpu * 1e6,
                "bare_client_cpu_us_per_token": b_cpu * 1e6,
                "stream_incomplete": float(incomplete),
                "stream_events_missing": float(missing),
                "stream_resubscribed": float(resubscribed[0]),
            }
            log(f"  stream run {run + 1}/{runs}: turnd {t_rate:.0f} tok/s ({t_tokens} tokens), "
                f"bare {b_rate:.0f} tok/s ({b_tokens}) -> ratio {fig['stream_ratio']:.3f}")
            out.append(fig)
    return out


# -- memory -----------------------------------------------------------------------------------


async def memory(fake: FakeModelProc, runs: int, first: int, total: int, concurrency: int,
                 log: Log) -> list[dict[str, float]]:
    """A fresh ``turnd serve`` per run: RSS after ``first`` finished turns and after ``total``."""
    out = []
    for run in range(runs):
        with TurndProc({"short": fake.base_url}) as turnd:
            async with c.api_client(turnd.base_url, turnd.token, concurrency + 4) as http:

                async def turns(n: int) -> None:
                    # Ten turns per conversation, ``concurrency`` conversations at a time.
                    groups = iter([min(10, n - i) for i in range(0, n, 10)])

                    async def worker() -> None:
                        for size in groups:
                            skey = await c.new_conversation(http)
                            for _ in range(size):
                                await c.turnd_turn(http, skey)

                    async with anyio.create_task_group() as tg:
                        for _ in range(concurrency):
                            tg.start_soon(worker)

                t0 = c.now()
                await turns(first)
                await anyio.sleep(0.5)
                rss_first = rss_bytes(turnd.pid)
                await turns(total - first)
                await anyio.sleep(0.5)
                rss_total = rss_bytes(turnd.pid)
                wall = c.now() - t0 - 1.0
        fig = {
            "rss_growth_pct": (rss_total - rss_first) / rss_first * 100.0,
            "rss_mb_after_first": rss_first / 2**20,
            "rss_mb_after_total": rss_total / 2**20,
            "memory_turns_per_s": total / wall,
        }
        log(f"  memory run {run + 1}/{runs}: RSS {fig['rss_mb_after_first']:.1f} MB after {first}, "
            f"{fig['rss_mb_after_total']:.1f} MB after {total} ({fig['rss_growth_pct']:+.1f} %)")
        out.append(fig)
    return out


# -- CPU per finished turn ------------------------------------------------------------------


async def short_turns(turnd: TurndProc, runs: int, turns: int, concurrency: int, tokens: int,
                      log: Log, provider: str | None = None,
                      long: tuple[str, int] | None = None) -> list[dict[str, float]]:
    """Many short turns (``tokens`` each), ``concurrency`` at a time: turnd's CPU time per
    finished turn (POST, claim, placeholder, final record, SSE) and turns finished per second.

    With ``long`` (a provider and its tokens a turn), each run also makes as many turns of
    that length, and the relay's CPU a token is their difference: (CPU a long turn - CPU a
    short turn) / (long tokens - short tokens). ``turnd_cpu_ms_per_turn`` is then a short
    turn's CPU less its ``tokens`` relayed that way. The 200-stream run's CPU a token is not
    the relay's: it holds each turn's own work, a tenth of it per token at 50 tokens."""
    out = []
    async with c.api_client(turnd.base_url, turnd.token, 2 * concurrency + 8) as http:

        async def batch(n: int, via: str | None, length: int) -> tuple[float, float]:
            skeys = await _gather([lambda: c.new_conversation(http)] * concurrency)
            todo = iter(range(n))

            async def worker(skey: str) -> None:
                for _ in todo:
                    s = await c.turnd_turn(http, skey, via)
                    if s.status is None or '"complete"' not in s.status:
                        raise RuntimeError(f"short turn did not complete: {s.status}")
                    if s.tokens != length:
                        raise RuntimeError(f"a turn relayed {s.tokens} tokens, not {length}")

            cpu0, t0 = cpu_seconds(turnd.pid), c.now()
            async with anyio.create_task_group() as tg:
                for skey in skeys:
                    tg.start_soon(worker, skey)
            return c.now() - t0, cpu_seconds(turnd.pid) - cpu0

        await batch(min(turns, 50), provider, tokens)  # warm-up
        if long is not None:
            await batch(min(turns, 50), *long)
        for run in range(runs):
            wall, cpu = await batch(turns, provider, tokens)
            fig = {
                "turnd_cpu_ms_per_turn_with_relay": cpu / turns * 1000.0,
                "turns_per_s_wall": turns / wall,
            }
            relay = 0.0
            if long is not None:
                _, cpu_long = await batch(turns, *long)
                relay = max(0.0, (cpu_long - cpu) / turns / (long[1] - tokens))
                fig["relay_cpu_us_per_token"] = relay * 1e6
            per_turn = cpu / turns - relay * tokens
            fig["turnd_cpu_ms_per_turn"] = per_turn * 1000.0
            # SPEC §10's "turns/s on one core": finished turns per second of turnd's CPU.
            # Counted with the relay, as it was before the relay was measured here.
            fig["turns_per_s"] = turns / cpu if cpu else math.inf
            log(f"  short turns run {run + 1}/{runs}: {turns} turns x {tokens} tokens in "
                f"{wall:.2f} s ({fig['turns_per_s_wall']:.0f}/s), CPU {per_turn * 1000:.2f} ms a "
                f"turn without the relay ({fig['turnd_cpu_ms_per_turn_with_relay']:.2f} with; "
                f"relay {relay * 1e6:.1f} us a token)")
            out.append(fig)
    return out


# -- turnd send -----------------------------------------------------------------------------------


def send_wall(turnd: TurndProc, runs: int, log: Log) -> list[dict[str, float]]:
    """``turnd send "hello"`` on the echo provider against the running daemon: the wall
    time of the whole command (start, imports, login, write, the streamed reply, exit)."""
    import subprocess

    from bench.procs import turnd_command

    assert turnd.tmp is not None
    env = {k: v for k, v in os.environ.items() if not k.startswith("TURND_")}
    env |= {"BENCH_PASSWORD": turnd.password, "BENCH_TOKEN": turnd.token,
            "BENCH_PROVIDER_KEY": "sk-bench-fake", "BENCH_REDIS_URL": ""}
    argv = [*turnd_command(), "send", "hello", "--model", "echo:echo",
            "--config", str(turnd.tmp / "turnd.toml")]
    out = []
    subprocess.run(argv, env=env, cwd=turnd.tmp, capture_output=True, timeout=120)  # warm caches
    for run in range(runs):
        t0 = time.monotonic()
        done = subprocess.run(argv, env=env, cwd=turnd.tmp, capture_output=True, timeout=120)
        wall = time.monotonic() - t0
        if done.returncode != 0:
            raise RuntimeError(f"turnd send: exit {done.returncode}: {done.stderr[-300:]!r}")
        out.append({"send_wall_s": wall})
        log(f"  send run {run + 1}/{runs}: {wall:.3f} s")
    return out
