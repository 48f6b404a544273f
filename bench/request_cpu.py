"""``python -m bench.request_cpu``: turnd's CPU per small HTTP request, two builds side by side.

The HTTP stack's own cost (uvicorn's protocol, the middleware, FastAPI's routing, the
error handlers) is paid twice a turn (the POST and the SSE request) and is hard to see
in a turn's CPU, which is ten times larger and noisier. Here both daemons are up at
once and each route is asked ``--requests`` times over ten kept-alive connections,
alternating between the builds for ``--rounds`` rounds (who goes first alternates);
it prints the median CPU per request of each and B over A.

    python -m bench.request_cpu --a "turnd" --b "env PYTHONPATH=/path/to/tree python -m daemon.cli"

``/nope`` is a 404 (the stack alone: every route tried); ``/healthz`` reads the store.
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import sys

import anyio
import httpx

from bench.procs import FakeModelProc, TurndProc, cpu_seconds
from turns.tls import tls_context

PATHS = ("/nope", "/healthz", "/api/conversations?limit=1")
CONNECTIONS = 10


async def _cpu_per_request(turnd: TurndProc, http: httpx.AsyncClient, path: str,
                           requests: int) -> float:
    async def worker(n: int) -> None:
        for _ in range(n):
            await http.get(path)

    before = cpu_seconds(turnd.pid)
    async with anyio.create_task_group() as tg:
        for _ in range(CONNECTIONS):
            tg.start_soon(worker, requests // CONNECTIONS)
    return (cpu_seconds(turnd.pid) - before) / requests * 1e6


async def _run(a: list[str], b: list[str], paths: list[str], rounds: int,
               requests: int) -> None:
    with (
        FakeModelProc(tokens=5, ttft_ms=0) as fake,
        TurndProc({"fake": fake.base_url}, command=a) as turnd_a,
        TurndProc({"fake": fake.base_url}, command=b) as turnd_b,
    ):
        sides = (turnd_a, turnd_b)
        clients = [httpx.AsyncClient(base_url=t.base_url,
                                     headers={"Authorization": f"Bearer {t.token}"}, verify=tls_context())
                   for t in sides]
        try:
            for path in paths:
                for side, http in zip(sides, clients, strict=True):
                    await _cpu_per_request(side, http, path, 100)  # warm-up
                got: tuple[list[float], list[float]] = ([], [])
                for n in range(rounds):
                    for i in ((0, 1) if n % 2 == 0 else (1, 0)):
                        got[i].append(await _cpu_per_request(sides[i], clients[i], path,
                                                             requests))
                med_a, med_b = statistics.median(got[0]), statistics.median(got[1])
                print(f"{path:30} A {med_a:6.0f} us   B {med_b:6.0f} us   B/A {med_b / med_a:.2f}",
                      flush=True)
        finally:
            for http in clients:
                await http.aclose()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.request_cpu",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--a", required=True, help="the command that runs build A's turnd")
    p.add_argument("--b", required=True, help="the command that runs build B's turnd")
    p.add_argument("--paths", default=",".join(PATHS), help="comma-separated GET paths")
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--requests", type=int, default=600, help="requests a round and side")
    args = p.parse_args(argv)
    anyio.run(_run, shlex.split(args.a), shlex.split(args.b), args.paths.split(","),
              args.rounds, args.requests)
    return 0


if __name__ == "__main__":
    sys.exit(main())
