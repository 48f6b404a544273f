"""``POST /api/render`` off the event loop, with a time limit (SPEC §12).

markdown-it is pure Python and some inputs take it seconds (500,000 ``[`` took
13 s): run on the event loop, that froze every other request. A thread would not
freeze the loop, but it cannot be stopped, so a few such requests would keep the
CPUs busy long after their callers gave up. The render therefore runs in worker
processes (``anyio.to_process``): the loop only pickles the texts, and a render
over the limit is ended by killing its worker (``cancellable=True``), which frees
the CPU at once. At most :data:`WORKERS` renders run at a time; the others wait
(without a clock running) for a free worker.
"""

from __future__ import annotations

import anyio
from anyio import to_process

from daemon.markdown import render_many

__all__ = ["MAX_RENDER_BYTES", "RENDER_SECONDS", "RenderTooComplex", "render_off_loop"]

MAX_RENDER_BYTES = 1_048_576  # text of one request, all texts together (UTF-8)
RENDER_SECONDS = 2.0
WORKERS = 2  # the worker processes' CPU is bounded by this many at once

_turns = anyio.CapacityLimiter(WORKERS)
# to_process's own limiter: never the one that makes a render wait, ours does that.
_spawn = anyio.CapacityLimiter(WORKERS + 1)


class RenderTooComplex(Exception):
    """The render did not finish within :data:`RENDER_SECONDS`."""


def _ready() -> bool:
    return True


async def render_off_loop(texts: list[str]) -> list[str]:
    """HTML for each text, rendered in a worker process within the time limit."""
    if not texts:
        return []
    async with _turns:
        # A worker that has to start first does so outside the clock: on a busy
        # machine starting Python may itself take a second.
        await to_process.run_sync(_ready, limiter=_spawn)
        with anyio.move_on_after(RENDER_SECONDS) as scope:
            return await to_process.run_sync(
                render_many, texts, cancellable=True, limiter=_spawn
            )
    assert scope.cancelled_caught
    raise RenderTooComplex(f"rendering took longer than {RENDER_SECONDS:g} s")
