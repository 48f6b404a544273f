"""A response's head and its first body bytes go out in one ``send``.

uvicorn writes a response's head and its body separately, so a small JSON answer is two
``send`` calls, and each can wake the client: on loopback the woken reader is run on
the writer's core and the daemon's thread is preempted mid-turn (a probe counted 141
involuntary context switches in 349 writes, 0.3-1 ms each; README, "Benchmarks"). A
head (a write that starts with the status line) is held until the next write, which
takes it along, or until the end of the pass of the event loop it was written in (an
SSE response whose first event is not there yet). Every other write goes out at once,
as before: an SSE frame is never held back.
"""

from __future__ import annotations

import asyncio
from typing import Any

__all__ = ["HeadWithBody"]

_HEAD = b"HTTP/1."  # how uvicorn's every response head starts (its status line)


class HeadWithBody(asyncio.Transport):
    """``transport``, with a response's head sent along with what follows it."""

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__()
        self._inner = transport
        self._loop = loop
        self._pending: list[bytes] = []

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not data:
            return
        if self._pending:
            self._pending.append(bytes(data))
            self._flush()
        elif data[: len(_HEAD)] == _HEAD:
            self._loop.call_soon(self._flush)
            self._pending.append(bytes(data))  # the writer may reuse a bytearray
        else:
            self._inner.write(data)

    def writelines(self, list_of_data: Any) -> None:
        for data in list_of_data:
            self.write(data)

    def _flush(self) -> None:
        if not self._pending:
            return
        data = self._pending[0] if len(self._pending) == 1 else b"".join(self._pending)
        self._pending.clear()
        self._inner.write(data)

    def write_eof(self) -> None:
        self._flush()
        self._inner.write_eof()

    def close(self) -> None:
        self._flush()  # what was written before the close is still sent, as asyncio does
        self._inner.close()

    def abort(self) -> None:
        self._pending.clear()
        self._inner.abort()

    def can_write_eof(self) -> bool:
        return self._inner.can_write_eof()

    def is_closing(self) -> bool:
        return self._inner.is_closing()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._inner.get_extra_info(name, default)

    def get_write_buffer_size(self) -> int:
        return self._inner.get_write_buffer_size() + sum(map(len, self._pending))

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return self._inner.get_write_buffer_limits()

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self._inner.set_write_buffer_limits(high, low)

    def is_reading(self) -> bool:
        return self._inner.is_reading()

    def pause_reading(self) -> None:
        self._inner.pause_reading()

    def resume_reading(self) -> None:
        self._inner.resume_reading()

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self._inner.set_protocol(protocol)

    def get_protocol(self) -> asyncio.BaseProtocol:
        return self._inner.get_protocol()
