"""Local store benchmark: create_record throughput and change-feed latency.

Run from the repository root::

    python -m bench.store [--writes 300] [--creates 3000]

Feed latency is measured from just before a writer calls ``create_record`` (the
time is in the record) to the moment the reader's feed yields the change, so it
includes the write itself; with the writer in another OS process (seen by
polling) and in this process (woken at once).
"""

from __future__ import annotations

import argparse
import multiprocessing
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio

from recordstore import MESSAGE
from recordstore.local import LocalStore
from recordstore.vocabulary import PLAIN_CONTENT, TEXT_PART

DID = "did:plc:bench"
SPACE = "3m2a4b5c6d7e2"


def _message(text: str) -> dict[str, Any]:
    return {
        "$type": MESSAGE,
        "role": "user",
        "content": {
            "$type": PLAIN_CONTENT,
            "parts": [{"$type": TEXT_PART, "text": text}],
        },
        "generation": {"attempt": 0},
        "createdAt": "2026-01-01T00:00:00.000Z",
    }


async def _creates(root: Path, n: int, concurrency: int) -> float:
    async with LocalStore.open(root) as store:
        keys = iter(range(n))

        async def worker() -> None:
            for i in keys:
                await store.create_record(
                    DID, SPACE, MESSAGE, f"c{concurrency}-{i:06}", _message("hi")
                )

        start = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for _ in range(concurrency):
                tg.start_soon(worker)
        return n / (time.perf_counter() - start)


async def _write_paced(root: str, prefix: str, n: int, ready: Any) -> None:
    """Write ``n`` records at irregular intervals, each carrying its write time."""
    rng = random.Random(1)
    async with LocalStore.open(root) as store:
        if ready is not None:
            await anyio.to_thread.run_sync(ready.wait)
        for i in range(n):
            # Irregular spacing, so writes do not line up with the reader's polls.
            await anyio.sleep(rng.uniform(0.005, 0.03))
            value = _message(repr(time.time()))
            await store.create_record(DID, SPACE, MESSAGE, f"{prefix}{i:06}", value)


def _writer_process(root: str, prefix: str, n: int, ready: Any) -> None:
    anyio.run(_write_paced, root, prefix, n, ready)


async def _feed_latency(root: Path, n: int, other_process: bool) -> list[float]:
    """Latencies (s) from a write to the feed yielding it, on a fresh store."""
    prefix = "p" if other_process else "i"
    latencies: list[float] = []
    async with LocalStore.open(root) as store:
        async with store.changes() as feed:
            async with anyio.create_task_group() as tg:
                if other_process:
                    ctx = multiprocessing.get_context("spawn")
                    ready = ctx.Event()
                    proc = ctx.Process(target=_writer_process, args=(str(root), prefix, n, ready))
                    proc.start()
                    ready.set()
                else:
                    tg.start_soon(_write_paced, str(root), prefix, n, None)
                async for change in feed:
                    now = time.time()
                    assert change.record is not None and change.live
                    sent = float(change.record["content"]["parts"][0]["text"])
                    latencies.append(now - sent)
                    if len(latencies) == n:
                        break
            if other_process:
                await anyio.to_thread.run_sync(proc.join)
    return latencies


def _ms(values: list[float], q: float) -> str:
    ordered = sorted(values)
    return f"{ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000:8.2f}"


async def _main(creates: int, writes: int) -> None:
    with tempfile.TemporaryDirectory(prefix="turnd-bench-") as tmp:
        root = Path(tmp)
        rates = {c: await _creates(root / f"c{c}", creates, c) for c in (1, 16)}
        cross = await _feed_latency(root / "cross", writes, other_process=True)
        local = await _feed_latency(root / "local", writes, other_process=False)

    print(f"{'local store':<44}{'value':>12}")
    print("-" * 56)
    for c, rate in rates.items():
        label = f"create_record/s ({c} concurrent task{'s' if c > 1 else ''})"
        print(f"{label:<44}{rate:12.0f}")
    for name, lat in (("another process", cross), ("same process", local)):
        print(f"{f'feed latency, {name}, median (ms)':<44}{statistics.median(lat) * 1000:12.2f}")
        print(f"{f'feed latency, {name}, p99 (ms)':<44}{_ms(lat, 0.99):>12}")
        print(f"{f'feed latency, {name}, max (ms)':<44}{max(lat) * 1000:12.2f}")
    print(f"({creates} creates per run; {writes} paced writes per feed run)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--creates", type=int, default=3000)
    parser.add_argument("--writes", type=int, default=300)
    args = parser.parse_args()
    anyio.run(_main, args.creates, args.writes)


if __name__ == "__main__":
    main()
