"""What one turn costs, counted (never timed): connections to the model, store reads.

SPEC §10: nothing per turn makes a round trip it does not need. Counts are exact, so
they are asserted; the time each one takes is the bench's (``bench/``).
"""

from __future__ import annotations

import inspect
import sqlite3
from typing import Any

import anyio
import pytest

from testbed.fakemodel import FakeModel, Reply
from tests.support.records import text_part
from tests.support.turnkit import DID, turn_kit
from turns.state import StateDB

pytestmark = pytest.mark.anyio


@pytest.fixture
def fake():
    with FakeModel() as server:
        yield server


async def test_consecutive_turns_reuse_one_connection_to_the_model(tmp_path, fake):
    async with turn_kit(tmp_path, fake) as kit:
        skey = await kit.conversation(title="t")
        for text in ("one", "two", "three"):
            fake.push(Reply.text([text, "!"]))
            posted = await kit.engine.post_message(
                DID, skey, parent=None, parts=[text_part("hi")], generation={}
            )
            final = await kit.reply(skey, posted.reply_key)
            assert final["status"] == "complete"
        # Each stream was read to its end, so its connection went back to the pool.
        assert fake.request_count == 3
        assert fake.connections == 1


async def test_a_state_write_that_meets_another_writer_waits_for_it_and_is_kept(tmp_path):
    """A state write that finds the file's write lock taken waits for it on the worker
    thread, and nothing is lost."""
    path = tmp_path / "state.sqlite3"
    state = await StateDB.open(path)
    try:
        await state.add_claim(DID, "3kskey", "3kkey.r0")  # uncontended
        other = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        other.execute("BEGIN IMMEDIATE")  # holds the file's write lock
        try:
            async with anyio.create_task_group() as tg:

                async def release() -> None:
                    await anyio.sleep(0.3)
                    other.execute("COMMIT")

                tg.start_soon(release)
                await state.add_claim(DID, "3kskey", "3kother.r0")
                await state.drop_claim(DID, "3kskey", "3kkey.r0")
        finally:
            other.close()
        assert [c.reply_key for c in await state.claims()] == ["3kother.r0"]
    finally:
        await state.aclose()


async def test_a_state_write_does_not_queue_behind_one_on_the_worker_thread(tmp_path):
    """While one statement runs on the worker thread (it holds the state's lock), a
    write SQLite can take at once still runs on the loop's thread. It used to queue
    behind the lock, and under many turns every write after the first slow one went
    through the thread (a hop each)."""
    state = await StateDB.open(tmp_path / "state.sqlite3")
    try:
        await state.add_claim(DID, "3kskey", "3kkey.r0")
        async with state._lock:  # as a statement on the worker thread does
            with anyio.fail_after(2):
                await state.add_claim(DID, "3kskey", "3kother.r0")
                await state.drop_claim(DID, "3kskey", "3kkey.r0")
        assert [c.reply_key for c in await state.claims()] == ["3kother.r0"]
    finally:
        await state.aclose()


@pytest.mark.parametrize("busy", [False, True], ids=["on the loop", "waiting for the file"])
async def test_a_turns_end_is_written_to_the_state_file_at_once(tmp_path, busy):
    """The turn's usage rows, its timing and its claim row's removal are written
    together, in one transaction on the loop's thread (tests/test_sqlite_quick.py: all
    or none) where there were three. When the file is busy they wait on the worker
    thread, each on its own (a transaction held across hops would make the loop's
    writes busy meanwhile), and all of them are kept."""
    from turns.state import ReplyTiming, UsageRow

    path = tmp_path / "state.sqlite3"
    state = await StateDB.open(path)
    row = UsageRow(DID, "3kskey", "3kkey.r0", "turn", 0, "p", "m", 3, 5, 0, 0, None, 1.0, 2.0, "ok")
    timing = ReplyTiming(DID, "3kskey", "3kkey.r0", 12.5, 3.0)
    other = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    try:
        await state.add_claim(DID, "3kskey", "3kkey.r0")
        await state.add_claim(DID, "3kskey", "3kother.r0")
        async with anyio.create_task_group() as tg:
            if busy:
                other.execute("BEGIN IMMEDIATE")

                async def release() -> None:
                    await anyio.sleep(0.3)
                    other.execute("COMMIT")

                tg.start_soon(release)
            with anyio.fail_after(5):
                await state.add_usage([row], timing, release=(DID, "3kskey", "3kkey.r0"))
        assert [c.reply_key for c in await state.claims()] == ["3kother.r0"]
        assert await state.usage_rows(DID) == [row]
        [usage] = await state.reply_usage(DID, "3kskey")
        assert (usage.reply_key, usage.latency_ms, usage.ttft_ms) == ("3kkey.r0", 12.5, 3.0)
    finally:
        other.close()
        await state.aclose()


def test_the_api_routes_and_their_dependencies_run_on_the_event_loop():
    """FastAPI runs a plain ``def`` endpoint or dependency in a worker thread: a thread
    hop per request, and a turn is two requests (the POST and the stream)."""
    from daemon.conversations import router as conversations_api
    from daemon.http import api

    def calls(dependant: Any) -> list[Any]:
        out = []
        for sub in dependant.dependencies:
            out += [sub.call, *calls(sub)]
        return out

    threaded = [
        (route.path, getattr(call, "__name__", repr(call)))
        for route in [*api.routes, *conversations_api.routes]
        for call in [route.endpoint, *calls(route.dependant)]
        if not (inspect.iscoroutinefunction(call) or inspect.isasyncgenfunction(call))
    ]
    assert threaded == []


def test_serve_runs_the_collector_again_on_a_servers_schedule():
    # `turnd serve` starts with the collector off and turns it on once it serves; its
    # youngest generation then waits for YOUNG_GENERATION_THRESHOLD objects, not 700.
    import gc

    from daemon import cli

    before = gc.get_threshold()
    gc.disable()
    try:
        cli._collect_again()
        assert gc.isenabled()
        assert gc.get_threshold() == (cli.YOUNG_GENERATION_THRESHOLD, *before[1:])
        assert gc.get_freeze_count() > 0  # what start-up built is out of every collection
        assert cli.YOUNG_GENERATION_THRESHOLD > before[0]
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
        gc.enable()
