"""``[cluster]`` figures (SPEC §10, §18): what Redis adds, measured beside turnd without it.

- ``cluster_ttft_added_ms_p50``: POST -> first ``delta`` at a subscriber on the same
  instance, one instance with ``[cluster]`` minus one without, interleaved one for one
  against the same fake model (what a turn start pays: the shared rate limit's script);
- ``cluster_remote_ttft_ms_p50``: the same POST on instance A with the subscriber on B
  (the stream crosses Redis: the watch question, the mirror, ``XREAD BLOCK``), minus the
  one-instance-without-Redis figure;
- ``cluster_delivery_ms_p50`` / ``_p99``: for every event of a turn, its arrival at a
  subscriber on B minus its arrival at a subscriber on the runner A (which reads the
  runner's memory: that is the publish time plus a loopback hop);
- ``cluster_stream_ratio``: tokens/s delivered by 200 concurrent turns posted on A and
  streamed from B (every stream through Redis) ÷ tokens/s the bare ``openai`` client reads
  with 200 streams from the same fake server.

``python -m bench.cluster [--quick]`` runs these alone; ``python -m bench`` includes them
when ``redis-server`` is installed.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
import httpx

from bench import client as c
from bench.measure import Log, ms, pct
from bench.procs import FakeModelProc, TurndProc
from testbed.redis_server import REDIS_SERVER, RedisServer

_DELTA = b"event: delta"


async def _events_at(http: Any, url: str) -> tuple[dict[int, float], int, str | None]:
    """Arrival time of every event id on one stream, the tokens its deltas carry, the status."""
    seen: dict[int, float] = {}
    tokens = 0
    status = None
    async with http.stream("GET", url) as response:
        if response.status_code != 200:
            raise RuntimeError(f"GET {url}: {response.status_code}")
        buf = b""
        async for chunk in response.aiter_raw():
            t = c.now()
            buf += chunk
            cut = buf.rfind(b"\n\n")
            if cut < 0:
                continue
            complete, buf = buf[: cut + 2], buf[cut + 2 :]
            for block in complete.split(b"\n\n"):
                if not block or block.startswith(b":"):
                    continue
                fields = dict(
                    line.split(b": ", 1) for line in block.split(b"\n") if b": " in line
                )
                if b"id" in fields:
                    seen[int(fields[b"id"])] = t
                if fields.get(b"event") == b"delta":
                    # Deltas are coalesced with [cluster]: count the fake's words, not events.
                    tokens += fields.get(b"data", b"").count(b"tok")
                if fields.get(b"event") == b"status":
                    status = fields.get(b"data", b"").decode()
            if status is not None:
                break
    return seen, tokens, status


async def _post(http: Any, skey: str, provider: str | None = None) -> str:
    r = await http.post(f"/api/conversations/{skey}/messages", json=c.message_body(provider))
    if r.status_code != 201:
        raise RuntimeError(f"POST message: {r.status_code} {r.text[:200]}")
    return str(r.json()["replyKey"])


async def ttft(off: TurndProc, on: TurndProc, other: TurndProc, runs: int, samples: int,
               log: Log) -> list[dict[str, float]]:
    out = []
    async with (
        c.api_client(off.base_url, off.token) as h_off,
        c.api_client(on.base_url, on.token) as h_on,
        c.api_client(other.base_url, other.token) as h_other,
    ):

        async def remote(skey: str) -> float:
            t0 = c.now()
            reply = await _post(h_on, skey)
            res = await c.read_reply(h_other, f"/api/conversations/{skey}/messages/{reply}/stream")
            if res.first_delta is None:
                raise RuntimeError(f"remote stream of {reply}: no delta ({res.status})")
            return res.first_delta - t0

        for _ in range(5):
            await c.turnd_turn(h_off, await c.new_conversation(h_off))
            await c.turnd_turn(h_on, await c.new_conversation(h_on))
            await remote(await c.new_conversation(h_on))
        for run in range(runs):
            t_off, t_on, t_remote = [], [], []
            for _ in range(samples):
                t_off.append((await c.turnd_turn(h_off, await c.new_conversation(h_off))).ttft)
                t_on.append((await c.turnd_turn(h_on, await c.new_conversation(h_on))).ttft)
                t_remote.append(await remote(await c.new_conversation(h_on)))
            base = statistics.median(t_off)
            fig = {
                "cluster_ttft_added_ms_p50": ms(statistics.median(t_on) - base),
                "cluster_remote_ttft_ms_p50": ms(statistics.median(t_remote) - base),
                "cluster_off_ttft_ms_p50": ms(base),
            }
            log(f"  cluster ttft run {run + 1}/{runs}: +{fig['cluster_ttft_added_ms_p50']:.2f} ms "
                f"same instance, +{fig['cluster_remote_ttft_ms_p50']:.2f} ms from another "
                f"(without Redis {fig['cluster_off_ttft_ms_p50']:.2f} ms)")
            out.append(fig)
    return out


async def delivery(a: TurndProc, b: TurndProc, runs: int, turns: int,
                   log: Log) -> list[dict[str, float]]:
    out = []
    async with c.api_client(a.base_url, a.token) as h_a, c.api_client(b.base_url, b.token) as h_b:
        for run in range(runs):
            gaps: list[float] = []
            for _ in range(turns):
                skey = await c.new_conversation(h_a)
                reply = await _post(h_a, skey, "paced")
                url = f"/api/conversations/{skey}/messages/{reply}/stream"
                results: dict[str, Any] = {}

                async def read(name: str, http: Any, url: str = url, into: dict[str, Any] = results) -> None:
                    into[name] = await _events_at(http, url)

                async with anyio.create_task_group() as tg:
                    tg.start_soon(read, "a", h_a)
                    tg.start_soon(read, "b", h_b)
                at_a, at_b = results["a"][0], results["b"][0]
                # Events both saw live (B may join after A's first events: replayed, not timed).
                first_b = min(at_b) if at_b else 0
                gaps += [at_b[i] - at_a[i] for i in at_a if i in at_b and i > first_b]
            if not gaps:
                raise RuntimeError("no event reached both subscribers live")
            fig = {
                "cluster_delivery_ms_p50": ms(statistics.median(gaps)),
                "cluster_delivery_ms_p99": ms(pct(gaps, 99)),
                "cluster_delivery_events": float(len(gaps)),
            }
            log(f"  delivery run {run + 1}/{runs}: runner -> other instance p50 "
                f"{fig['cluster_delivery_ms_p50']:.2f} ms, p99 {fig['cluster_delivery_ms_p99']:.2f} ms "
                f"({len(gaps)} events)")
            out.append(fig)
    return out


async def streaming(a: TurndProc, b: TurndProc, fake: FakeModelProc, runs: int, streams: int,
                    log: Log) -> list[dict[str, float]]:
    from bench.measure import _gather

    out = []
    conns = 2 * streams + 16
    async with (
        c.api_client(a.base_url, a.token, conns) as h_a,
        c.api_client(b.base_url, b.token, conns) as h_b,
        c.bare_client(fake.base_url) as bare,
    ):

        async def one(skey: str) -> tuple[int, str | None, tuple[float, float, float]]:
            t0 = c.now()
            try:
                reply = await _post(h_a, skey, "stream")
                posted = c.now()
                seen, tokens, status = await _events_at(
                    h_b, f"/api/conversations/{skey}/messages/{reply}/stream"
                )
            except httpx.HTTPError as err:
                return 0, f"{type(err).__name__}", (0.0, 0.0, 0.0)
            first = min(seen.values(), default=c.now())
            return tokens, status, (posted - t0, first - posted, c.now() - t0)

        async def turnd_batch(n: int) -> tuple[float, int]:
            skeys = await _gather([lambda: c.new_conversation(h_a)] * n)
            t0 = c.now()
            got = await _gather([lambda s=s: one(s) for s in skeys])
            wall = c.now() - t0
            bad = [s for _, s, _ in got if s is None or '"complete"' not in s]
            if bad:
                # Reported, not hidden: the figure counts only tokens that arrived.
                log(f"  {len(bad)} of {n} streams did not end complete at B: {bad[0]}")
            post, first, total = max((t for _, _, t in got), key=lambda t: t[2])
            if total > 2.0:
                # Where a slow round's time went: the POST on A, or the stream on B.
                log(f"  slowest stream: {total:.2f} s (POST on A {post:.2f} s, "
                    f"then first event at B {first:.2f} s)")
            return sum(t for t, _, _ in got) / wall, len(bad)

        async def bare_batch(n: int) -> float:
            t0 = c.now()
            got = await _gather([lambda: c.bare_stream(bare)] * n)
            return sum(s.tokens for s in got) / (c.now() - t0)

        await bare_batch(min(streams, 50))
        await turnd_batch(min(streams, 50))
        for run in range(runs):
            b_rate = await bare_batch(streams)
            t_rate, failed = await turnd_batch(streams)
            fig = {"cluster_stream_ratio": t_rate / b_rate, "cluster_tokens_per_s": t_rate,
                   "cluster_streams_not_complete": float(failed)}
            log(f"  cluster stream run {run + 1}/{runs}: {t_rate:.0f} tok/s through Redis, "
                f"bare {b_rate:.0f} -> ratio {fig['cluster_stream_ratio']:.3f}")
            out.append(fig)
    return out


async def run_all(sizes: Any, log: Log) -> tuple[list[dict[str, float]], str | None]:
    """Every cluster figure, or (no runs, why) when there is no redis-server."""
    if not Path(REDIS_SERVER).exists():  # noqa: ASYNC240 - once, before anything starts
        return [], "no redis-server (apt-get install redis-server)"
    rows: list[dict[str, float]] = []
    with tempfile.TemporaryDirectory(prefix="turnd-bench-redis-") as tmp:
        redis = RedisServer(Path(tmp)).start()
        try:
            with (
                FakeModelProc(tokens=200, ttft_ms=20) as fake,
                FakeModelProc(tokens=100, ttft_ms=0, chunk_delay_ms=5) as paced,
                FakeModelProc(tokens=sizes.stream_tokens, ttft_ms=0) as stream_fake,
            ):
                providers = {"fake": fake.base_url, "paced": paced.base_url,
                             "stream": stream_fake.base_url}
                shared = Path(tmp) / "data"
                with (
                    TurndProc(providers) as off,
                    TurndProc(providers, redis_url=redis.url, data_dir=shared) as a,
                ):
                    with TurndProc(providers, redis_url=redis.url, data_dir=shared,
                                   token=a.token, password=a.password) as b:
                        log("[cluster] time to first token, on vs off (same fake model):")
                        rows += await ttft(off, a, b, sizes.runs, sizes.samples, log)
                        log("[cluster] runner -> other instance delivery (100 tokens, 5 ms apart):")
                        rows += await delivery(a, b, sizes.runs, max(3, sizes.samples // 5), log)
                        log(f"[cluster] {sizes.streams} streams posted on A, read from B:")
                        rows += await streaming(a, b, stream_fake, sizes.stream_runs, sizes.streams, log)
        finally:
            redis.kill()
    # One row per run index: the figures of the three phases side by side.
    merged: list[dict[str, float]] = []
    for row in rows:
        target = next((m for m in merged if not set(m) & set(row)), None)
        if target is None:
            merged.append(dict(row))
        else:
            target.update(row)
    return merged, None


def main(argv: list[str] | None = None) -> int:
    from bench.__main__ import SIZES, log, summarize

    p = argparse.ArgumentParser(prog="python -m bench.cluster", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--smoke", action="store_true")
    args = p.parse_args(argv)
    sizes = SIZES["smoke" if args.smoke else "quick" if args.quick else "full"]
    started = time.monotonic()
    rows, why = anyio.run(run_all, sizes, log)
    if why:
        print(json.dumps({"cluster": None, "why": why}))
        return 1
    details = summarize(rows)
    for key, d in details.items():
        print(f"{key:32} median {d['median']:.3f}  min {d['min']:.3f}  max {d['max']:.3f}")
    print(json.dumps({"cluster": details, "seconds": round(time.monotonic() - started, 1)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
