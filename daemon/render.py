"""``POST /api/render`` off the event loop, with a time limit (SPEC §12).

markdown-it is pure Python and some inputs take it seconds (500,000 ``[`` took
13 s): run on the event loop, that froze every other request. A thread would not
freeze the loop, but it cannot be stopped, so a few such requests would keep the
CPUs busy long after their callers gave up. The render therefore runs in worker
processes (``python -m daemon.render_worker``, started with ``anyio.open_process``):
the loop only sends the texts, and a render over the limit is ended by killing its
worker, which frees the CPU at once. At most :data:`WORKERS` renders run at a time;
the others wait, without their clock running, for a free worker. The workers import
only markdown-it (anyio's own ``to_process`` would re-run the ``turnd`` script in
each, importing the whole server: seconds of start-up and 50 MB each).
"""

from __future__ import annotations

import json
import sys

import anyio
from anyio.abc import Process
from anyio.streams.buffered import BufferedByteReceiveStream

from daemon.render_worker import READY

__all__ = ["MAX_RENDER_BYTES", "RENDER_SECONDS", "RenderPool", "RenderTooComplex"]

MAX_RENDER_BYTES = 1_048_576  # text of one request, all texts together (UTF-8)
RENDER_SECONDS = 2.0
START_SECONDS = 60.0  # a worker's imports, on a machine as loaded as a CI run's
WORKERS = 2  # the workers' CPU is bounded by this many at once


class RenderTooComplex(Exception):
    """The render did not finish within :data:`RENDER_SECONDS`."""


class _Worker:
    def __init__(self, process: Process) -> None:
        self.process = process
        assert process.stdout is not None and process.stdin is not None
        self._out = BufferedByteReceiveStream(process.stdout)

    async def ready(self) -> None:
        """Wait for the worker's imports (its first byte), outside any render's clock."""
        with anyio.fail_after(START_SECONDS):
            if await self._out.receive_exactly(1) != READY:
                raise RuntimeError("the render worker started with unexpected output")

    async def render(self, texts: list[str]) -> list[str]:
        assert self.process.stdin is not None
        body = json.dumps(texts).encode()
        await self.process.stdin.send(len(body).to_bytes(8, "big") + body)
        size = int.from_bytes(await self._out.receive_exactly(8), "big")
        return list(json.loads(await self._out.receive_exactly(size)))

    async def kill(self) -> None:
        with anyio.CancelScope(shield=True):
            try:
                self.process.kill()
            except ProcessLookupError:
                pass  # it had ended already (a signal to the whole process group)
            await self.process.aclose()


class RenderPool:
    """Up to :data:`WORKERS` render processes, started on first use, kept while idle."""

    def __init__(self) -> None:
        self._limiter = anyio.CapacityLimiter(WORKERS)
        self._idle: list[_Worker] = []

    async def render(self, texts: list[str]) -> list[str]:
        """HTML for each text, within the time limit, or RenderTooComplex."""
        if not texts:
            return []
        async with self._limiter:
            # A worker that has to start first does so outside the clock.
            worker = self._idle.pop() if self._idle else await self._start()
            try:
                with anyio.move_on_after(RENDER_SECONDS) as scope:
                    html = await worker.render(texts)
            except BaseException:
                await worker.kill()
                raise
            if scope.cancelled_caught:
                await worker.kill()  # the only way to stop a render: its process
                raise RenderTooComplex(f"rendering took longer than {RENDER_SECONDS:g} s")
            self._idle.append(worker)
            return html

    async def _start(self) -> _Worker:
        process = await anyio.open_process(
            [sys.executable, "-m", "daemon.render_worker"], stderr=None
        )
        worker = _Worker(process)
        try:
            await worker.ready()
        except BaseException:
            await worker.kill()
            raise
        return worker

    async def aclose(self) -> None:
        while self._idle:
            await self._idle.pop().kill()
