"""``python -m bench.model_calls``: the model client's CPU per streamed chat call, by pool fill.

turnd's providers' client (``turns.models``) spreads its calls over ``POOLS`` connection
pools, each taking ``fill`` calls at once before the next is used (``turns.model_pool``).
httpcore walks all of a pool's connections at each request and each close, so the fill
sets how many it walks. Here one client per fill makes the same streamed chat calls to
one fake model server (its own process, so only the client's CPU is counted), ``--at-once``
at a time, the fills alternating for ``--rounds`` rounds; it prints each fill's median CPU
a call.

    python -m bench.model_calls --fills 25,4 --rounds 12
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import anyio
import httpx2
import openai

from bench.procs import FakeModelProc
from turns.models import post_chat, providers_http_client

BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}


def _client(base_url: str, fill: int) -> openai.AsyncOpenAI:
    """The providers' client as ``turns.models`` builds it, with ``fill``."""
    return openai.AsyncOpenAI(base_url=base_url, api_key="sk-bench-fake", max_retries=0,
                              http_client=providers_http_client(fill))


async def _calls(client: openai.AsyncOpenAI, n: int, at_once: int) -> None:
    todo = iter(range(n))

    async def worker() -> None:
        for _ in todo:  # as a turn's step reads it (turns.generate)
            response = await post_chat(client, BODY, httpx2.Response, stream=True)
            try:
                async for _line in response.aiter_lines():
                    pass
            finally:
                await response.aclose()

    async with anyio.create_task_group() as tg:
        for _ in range(at_once):
            tg.start_soon(worker)


async def _run(fills: list[int], rounds: int, calls: int, at_once: int) -> dict[int, float]:
    with FakeModelProc(tokens=5, ttft_ms=0) as fake:
        clients = {fill: _client(fake.base_url, fill) for fill in fills}
        for client in clients.values():
            await _calls(client, calls, at_once)  # warm: connections made, code loaded
        cpu: dict[int, list[float]] = {fill: [] for fill in fills}
        for n in range(rounds):
            order = fills if n % 2 == 0 else fills[::-1]
            for fill in order:
                t0 = time.process_time()
                await _calls(clients[fill], calls, at_once)
                cpu[fill].append((time.process_time() - t0) / calls * 1e6)
        for client in clients.values():
            await client.close()
    return {fill: statistics.median(values) for fill, values in cpu.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.model_calls", description=__doc__)
    parser.add_argument("--fills", default="25,4", help="comma-separated fills (default 25,4)")
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--calls", type=int, default=300, help="calls a round and fill")
    parser.add_argument("--at-once", type=int, default=20)
    args = parser.parse_args(argv)
    fills = list(dict.fromkeys(int(f) for f in args.fills.split(",")))
    medians = anyio.run(_run, fills, args.rounds, args.calls, args.at_once)
    for fill, us in medians.items():
        print(f"fill {fill:>3}: {us:7.1f} µs of the client's CPU a call "
              f"({args.at_once} at a time, median of {args.rounds} rounds)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
