"""``python -m bench.idle_gaps``: one XRPC write's round trip after idle gaps of each length.

The claim-latency figure (``bench.measure.claims``) sleeps 10 ms before each direct
write, so each write finds the daemon, and the machine, idle. On a virtual machine a
core that went idle can take a millisecond or more to run again, and that lands in the
figure whatever the daemon does. Here the same small ``createRecord`` (a conversation's
``info`` record) is sent ``--writes`` times after each gap (0 ms: back to back), the
gaps taking turns for ``--rounds`` rounds; it prints each gap's median round trip, as
the writing client sees it.

    python -m bench.idle_gaps --gaps 0,1,10,50
"""

from __future__ import annotations

import argparse
import statistics
import sys

import anyio

from bench import client as c
from bench.measure import DID, HANDLE
from bench.procs import FakeModelProc, TurndProc
from recordstore.keys import new_tid
from recordstore.times import now_iso


async def _run(gaps_ms: list[float], rounds: int, writes: int) -> dict[float, float]:
    times: dict[float, list[float]] = {gap: [] for gap in gaps_ms}
    with FakeModelProc(tokens=5, ttft_ms=0) as fake, TurndProc({"fake": fake.base_url}) as turnd:
        async with c.api_client(turnd.base_url, turnd.token) as http:
            jwt = await c.xrpc_session(http, HANDLE, turnd.password)

            async def write() -> float:
                record = {"$type": c.INFO, "createdAt": now_iso()}
                t0 = c.now()
                await c.xrpc_create(http, jwt, DID, c.INFO, f"{new_tid()}:self", record)
                return c.now() - t0

            for _ in range(5):
                await write()  # warm: the session, the connection, the code
            for n in range(rounds):
                for gap in gaps_ms if n % 2 == 0 else gaps_ms[::-1]:
                    for _ in range(writes):
                        if gap:
                            await anyio.sleep(gap / 1000)
                        times[gap].append(await write())
    return {gap: statistics.median(values) * 1000 for gap, values in times.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.idle_gaps", description=__doc__)
    parser.add_argument("--gaps", default="0,1,10,50", help="idle gaps in ms (default 0,1,10,50)")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--writes", type=int, default=40, help="writes a round and gap")
    args = parser.parse_args(argv)
    gaps = list(dict.fromkeys(float(g) for g in args.gaps.split(",")))
    medians = anyio.run(_run, gaps, args.rounds, args.writes)
    for gap, ms in medians.items():
        print(f"gap {gap:5g} ms: createRecord round trip p50 {ms:.2f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
