"""The serving thread's event loop, named for the libraries that ask which one runs.

anyio finds its backend on every ``Event``, ``CancelScope``, lock and checkpoint through
``sniffio.current_async_library()``. Unnamed, that sniffs: a thread-local, a context
variable, a ``sys.modules`` lookup, an import statement and ``asyncio.current_task()``
(whose ``get_running_loop`` makes a ``getpid`` system call on Python 3.11): ~0.9 µs a
lookup here, and a short turn makes about fifty. Named, it is one attribute read
(~0.08 µs). ``sniffio.thread_local.name`` is sniffio's own way for whoever runs the
loop on a thread to say which library it is; ``turnd serve``'s main thread runs only
asyncio (through anyio) while it is set, and worker threads have their own (unset).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import sniffio

__all__ = ["asyncio_named"]


@contextmanager
def asyncio_named() -> Iterator[None]:
    """While the block runs an asyncio loop on this thread: say so to sniffio."""
    previous = sniffio.thread_local.name
    sniffio.thread_local.name = "asyncio"
    try:
        yield
    finally:
        sniffio.thread_local.name = previous
