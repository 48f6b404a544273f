"""``turnd serve`` names its loop for sniffio, so anyio finds its backend without sniffing
(daemon/loop_name.py)."""

from __future__ import annotations

import asyncio
import threading

import anyio
import sniffio

from daemon.loop_name import asyncio_named


def test_the_name_is_set_while_the_block_runs_and_restored_after() -> None:
    assert sniffio.thread_local.name is None
    with asyncio_named():
        assert sniffio.thread_local.name == "asyncio"
    assert sniffio.thread_local.name is None
    try:
        with asyncio_named():
            raise KeyError("out")
    except KeyError:
        pass
    assert sniffio.thread_local.name is None


def test_anyio_runs_on_the_named_loop_and_other_threads_still_sniff() -> None:
    seen: dict[str, object] = {}

    def elsewhere() -> None:
        try:
            seen["thread"] = sniffio.current_async_library()
        except sniffio.AsyncLibraryNotFoundError:
            seen["thread"] = None

    async def main() -> None:
        with asyncio_named():
            seen["loop"] = sniffio.current_async_library()
            with anyio.fail_after(5):  # anyio's backend, found by name
                event = anyio.Event()
                asyncio.get_running_loop().call_soon(event.set)
                await event.wait()
            await anyio.to_thread.run_sync(elsewhere)
            worker = threading.Thread(target=elsewhere)
            worker.start()
            worker.join()

    anyio.run(main)
    assert seen == {"loop": "asyncio", "thread": None}
    assert sniffio.thread_local.name is None
