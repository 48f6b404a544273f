"""``python -m bench.ab``: two turnd builds side by side, their runs interleaved.

On a shared machine the load changes from one minute to the next, so two bench runs
one after the other do not compare. Here both daemons are up at once, each with its
own fake model server, and the same phase alternates between them (A, B, A, B …), so
whatever load there is falls on both alike. What it prints: per build, the median over
the rounds of CPU per turn (short turns, 5 tokens, 20 at a time, the relay not
subtracted), of turns per second of CPU, of the first-token overhead and of a direct
XRPC write's time to its claim, and B's figure over A's.

With ``--paired`` the two daemons are asked at the same moments instead: each of 20
workers makes a short turn on one and then on the other, and only CPU a turn is read,
both daemons' over the same window. The machine's speed, which moved a single build's
figure by a third within minutes here, then falls on both alike: a round's B/A spread
±3 % where alternating phases spread ±30 %. The rounds run once as given and once with
the builds swapped, and B/A is the geometric mean of the two medians.

    python -m bench.ab --a "turnd" --b "env PYTHONPATH=/path/to/tree python -m daemon.cli"
    python -m bench.ab --paired --rounds 8 --a "…" --b "…"
    python -m bench.ab --a "env TURND_X=0 turnd" --b "env TURND_X=1 turnd" --rounds 6

A command is what runs ``turnd`` (``serve --config …`` is appended), as for
``$TURND_BENCH_TURND``.
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import statistics
import sys
from typing import Any

import anyio

from bench import client as c
from bench import measure
from bench.procs import FakeModelProc, TurndProc, cpu_seconds


def _log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


async def _rounds(a: list[str], b: list[str], rounds: int, turns: int,
                  samples: int) -> dict[str, dict[str, list[float]]]:
    got: dict[str, dict[str, list[float]]] = {"A": {}, "B": {}}
    with (
        FakeModelProc(tokens=5, ttft_ms=0) as tiny_a, FakeModelProc(tokens=5, ttft_ms=0) as tiny_b,
        FakeModelProc(tokens=200, ttft_ms=20) as fake_a,
        FakeModelProc(tokens=200, ttft_ms=20) as fake_b,
        TurndProc({"fake": fake_a.base_url, "tiny": tiny_a.base_url}, command=a) as turnd_a,
        TurndProc({"fake": fake_b.base_url, "tiny": tiny_b.base_url}, command=b) as turnd_b,
    ):
        sides = {"A": (turnd_a, fake_a), "B": (turnd_b, fake_b)}
        for n in range(rounds):
            # Which side goes first alternates too: a phase can warm the machine for the next.
            order = ("A", "B") if n % 2 == 0 else ("B", "A")
            for side in order:
                turnd, fake = sides[side]
                figures: dict[str, float] = {}
                for fig in await measure.short_turns(turnd, 1, turns, 20, 5, _quiet,
                                                     provider="tiny"):
                    figures |= fig
                for fig in await measure.ttft(turnd, fake, 1, samples, _quiet):
                    figures |= fig
                for fig in await measure.claims(turnd, 1, samples, _quiet):
                    figures |= fig
                for key, value in figures.items():
                    got[side].setdefault(key, []).append(value)
                _log(f"round {n + 1}/{rounds} {side}: CPU {figures['turnd_cpu_ms_per_turn']:.2f} "
                     f"ms a turn, first-token overhead {figures['ttft_overhead_ms_p50']:.2f} ms, "
                     f"claimed {figures['claim_latency_ms_p50']:.2f} ms")
    return got


PAIRED_WORKERS = 20


def _quiet(_text: str) -> None:
    pass


async def _paired(a: list[str], b: list[str], rounds: int, turns: int) -> list[float]:
    """Both builds at once: each of 20 workers makes a short turn on A, then one on B
    (half of them B first), so the two daemons meet the same machine at the same
    moments; the CPU of each over the same window, and B's over A's, per round."""
    ratios: list[float] = []
    with (
        FakeModelProc(tokens=5, ttft_ms=0) as tiny_a, FakeModelProc(tokens=5, ttft_ms=0) as tiny_b,
        TurndProc({"tiny": tiny_a.base_url}, command=a) as turnd_a,
        TurndProc({"tiny": tiny_b.base_url}, command=b) as turnd_b,
    ):
        async with (
            c.api_client(turnd_a.base_url, turnd_a.token, PAIRED_WORKERS + 8) as http_a,
            c.api_client(turnd_b.base_url, turnd_b.token, PAIRED_WORKERS + 8) as http_b,
        ):
            async def batch(n: int) -> tuple[float, float]:
                pairs = [(await c.new_conversation(http_a), await c.new_conversation(http_b))
                         for _ in range(PAIRED_WORKERS)]
                todo = iter(range(n))

                async def worker(i: int, skeys: tuple[str, str]) -> None:
                    sides = [(http_a, skeys[0]), (http_b, skeys[1])]
                    for _ in todo:
                        for http, skey in sides[i % 2:] + sides[:i % 2]:
                            s = await c.turnd_turn(http, skey)
                            if s.status is None or '"complete"' not in s.status:
                                raise RuntimeError(f"a turn did not complete: {s.status}")

                cpu_a, cpu_b = cpu_seconds(turnd_a.pid), cpu_seconds(turnd_b.pid)
                async with anyio.create_task_group() as tg:
                    for i, skeys in enumerate(pairs):
                        tg.start_soon(worker, i, skeys)
                return cpu_seconds(turnd_a.pid) - cpu_a, cpu_seconds(turnd_b.pid) - cpu_b

            await batch(min(turns, 50))  # warm-up
            for n in range(rounds):
                used_a, used_b = await batch(turns)
                ratios.append(used_b / used_a)
                _log(f"round {n + 1}/{rounds}: CPU a turn A {used_a / turns * 1000:.2f} ms, "
                     f"B {used_b / turns * 1000:.2f} ms, B/A {used_b / used_a:.3f}")
    return ratios


KEYS = ("turnd_cpu_ms_per_turn", "turns_per_s", "ttft_overhead_ms_p50", "claim_latency_ms_p50")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.ab", description=__doc__.split("\n\n")[0])
    p.add_argument("--a", required=True, help="the command that runs build A's turnd")
    p.add_argument("--b", required=True, help="the command that runs build B's turnd")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--turns", type=int, default=300, help="short turns a round")
    p.add_argument("--samples", type=int, default=20, help="first-token samples a round")
    p.add_argument("--json", action="store_true", help="end with one JSON line")
    p.add_argument("--paired", action="store_true",
                   help="both builds at once, turn for turn, then swapped: CPU a turn only")
    args = p.parse_args(argv)
    if args.paired:
        # Each build in either place: the daemon started second, its fake model and its
        # client read a few per cent cheaper in some runs (A against A: 0.98), so the
        # rounds are run once as given and once swapped, and the two medians combined.
        a, b = shlex.split(args.a), shlex.split(args.b)
        as_given = anyio.run(_paired, a, b, args.rounds, args.turns)
        swapped = anyio.run(_paired, b, a, args.rounds, args.turns)
        given, other = statistics.median(as_given), statistics.median(swapped)
        print(f"turnd_cpu_ms_per_turn B/A {math.sqrt(given / other):.3f} (B second: median "
              f"{given:.3f} over {len(as_given)} rounds; B first: A/B median {other:.3f})")
        if args.json:
            print(json.dumps({"paired": {"B/A": math.sqrt(given / other), "as_given": as_given,
                                         "swapped": swapped}}, separators=(",", ":")))
        return 0
    got = anyio.run(_rounds, shlex.split(args.a), shlex.split(args.b), args.rounds,
                    args.turns, args.samples)
    out: dict[str, Any] = {}
    for key in KEYS:
        med_a = statistics.median(got["A"][key])
        med_b = statistics.median(got["B"][key])
        out[key] = {"A": round(med_a, 3), "B": round(med_b, 3),
                    "B/A": round(med_b / med_a, 3) if med_a else None}
        print(f"{key:24} A {med_a:8.2f}   B {med_b:8.2f}   B/A {out[key]['B/A']}")
    if args.json:
        print(json.dumps({"medians": out, "runs": got}, separators=(",", ":")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
