"""Accounting and traces (SPEC §16), measured: run from the repository root::

    python -m bench.accounting [--json] [--runs 5] [--samples 40]

The added time to first token (POST -> first delta at an SSE subscriber, minus the
bare ``openai`` client's own first token from the same fake model) of three
``turnd serve`` processes side by side, their samples interleaved one for one:

- ``off``: no prices, no quota, no traces (the step event and the usage row are
  always there: a row is written after a step's stream, never before its first token);
- ``accounting``: prices for the model and a quota on the account, so each turn also
  reads its account's usage (one state-file query) between the claim and the model call;
- ``otel``: the same, plus ``[otel] endpoint`` exporting every span to a real OTLP/HTTP
  receiver (``testbed.otlp``) in this process;
- ``otel_dead``: the same, with the endpoint a port nothing listens on (every export
  fails and is retried by the exporter's thread: a turn must not notice).

Medians of each run's p50; the table gives the median over runs with min and max.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from typing import Any

import anyio

from bench import client as c
from bench.procs import FakeModelProc, TurndProc
from testbed.otlp import OtlpReceiver
from testbed.ports import free_port

PRICES = '[providers.fake.model."fake-model"]\ninputPrice = 2.5\noutputPrice = 10.0\n'
QUOTA = "[accounts.bench.quota]\ntokensPerDay = 1000000000000\ncostPerMonth = 1000000.0\n"


def _otel(endpoint: str) -> str:
    return f'[otel]\nendpoint = "{endpoint}"\nbatch_delay_ms = 500\n'


async def measure(runs: int, samples: int, log: Any) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {"off": [], "accounting": [], "otel": [], "otel_dead": []}
    dead = f"http://127.0.0.1:{free_port()}"
    with (
        FakeModelProc(tokens=50, ttft_ms=20) as fake,
        OtlpReceiver() as receiver,
        TurndProc({"fake": fake.base_url}) as off,
        TurndProc({"fake": fake.base_url}, extra=PRICES + QUOTA) as acct,
        TurndProc({"fake": fake.base_url}, extra=PRICES + QUOTA + _otel(receiver.url)) as otel,
        TurndProc({"fake": fake.base_url}, extra=PRICES + QUOTA + _otel(dead)) as otel_dead,
    ):
        procs = {"off": off, "accounting": acct, "otel": otel, "otel_dead": otel_dead}
        clients = {k: c.api_client(p.base_url, p.token) for k, p in procs.items()}
        async with c.bare_client(fake.base_url) as bare:
            try:
                for http in clients.values():
                    for _ in range(5):  # warm-up
                        await c.turnd_turn(http, await c.new_conversation(http))
                for run in range(runs):
                    firsts: dict[str, list[float]] = {k: [] for k in procs}
                    model: list[float] = []
                    for _ in range(samples):
                        model.append((await c.bare_stream(bare)).ttft)
                        for name, http in clients.items():
                            skey = await c.new_conversation(http)
                            firsts[name].append((await c.turnd_turn(http, skey)).ttft)
                    base = statistics.median(model)
                    for name, values in firsts.items():
                        out[name].append((statistics.median(values) - base) * 1000)
                    log(f"  run {run + 1}/{runs}: " + ", ".join(
                        f"{k} {v[-1]:.2f} ms" for k, v in out.items()) + f" (model {base * 1000:.1f} ms)")
            finally:
                for http in clients.values():
                    await http.aclose()
        spans = len(receiver.spans)
    log(f"  the OTLP receiver got {spans} spans")
    out["spans_received"] = [float(spans)]
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.accounting", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--samples", type=int, default=40)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)

    def log(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    log(f"added time to first token, {args.runs} runs x {args.samples} turns each:")
    figures = anyio.run(measure, args.runs, args.samples, log)
    med = {k: statistics.median(v) for k, v in figures.items() if k != "spans_received"}
    rows = [("ttft_overhead_ms_p50", "median", "min", "max", "vs off")]
    for name in ("off", "accounting", "otel", "otel_dead"):
        v = figures[name]
        rows.append((name, f"{med[name]:.2f}", f"{min(v):.2f}", f"{max(v):.2f}",
                     "" if name == "off" else f"{med[name] - med['off']:+.2f}"))
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    for r in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip())
    if args.json:
        print(json.dumps({"ttft_overhead_ms_p50": med, "runs": figures}, separators=(",", ":")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
