"""turns.streams: numbered buffers, replay then live, resume after an id (Last-Event-ID)."""

from __future__ import annotations

import json

import anyio
import pytest

from turns.streams import StreamBuffer, StreamRegistry

pytestmark = pytest.mark.anyio


async def _all(buffer: StreamBuffer, after: int = 0) -> list[tuple[int, str, dict]]:
    with anyio.fail_after(5):
        return [(e.id, e.event, json.loads(e.data)) async for e in buffer.events(after)]


async def test_events_are_numbered_from_one_and_replayed_whole() -> None:
    buffer = StreamBuffer()
    for i in range(3):
        buffer.publish("delta", {"i": i})
    buffer.publish("status", {"status": "complete"})
    buffer.close()
    events = await _all(buffer)
    assert [e[0] for e in events] == [1, 2, 3, 4]
    assert events[0] == (1, "delta", {"i": 0}) and events[-1][1] == "status"
    assert buffer.last_id == 4 and buffer.done
    assert await _all(buffer) == events  # a second subscriber gets the same


@pytest.mark.parametrize("after", [0, 1, 2, 3, 4, 9])
async def test_resume_sends_exactly_the_events_after_the_last_seen_id(after: int) -> None:
    buffer = StreamBuffer()
    for i in range(4):
        buffer.publish("delta", {"i": i})
    buffer.close()
    assert [e[0] for e in await _all(buffer, after)] == list(range(after + 1, 5))


async def test_a_subscriber_gets_live_events_then_the_end() -> None:
    buffer = StreamBuffer()
    buffer.publish("part-start", {})
    seen: list[int] = []
    async with anyio.create_task_group() as tg:

        async def read() -> None:
            async for event in buffer.events(1):  # resumed after the first
                seen.append(event.id)

        tg.start_soon(read)
        await anyio.wait_all_tasks_blocked()
        buffer.publish("delta", {"text": "a"})
        await anyio.wait_all_tasks_blocked()
        assert seen == [2]
        buffer.publish("status", {"status": "complete"})
        buffer.close()
    assert seen == [2, 3]


async def test_nothing_is_published_after_close() -> None:
    buffer = StreamBuffer()
    buffer.close()
    buffer.publish("delta", {"text": "late"})
    assert buffer.last_id == 0 and await _all(buffer) == []


async def test_the_registry_reopens_a_finished_reply_with_a_fresh_buffer() -> None:
    registry = StreamRegistry()
    first = registry.open("did:plc:a", "s", "k.r0")
    assert registry.open("did:plc:a", "s", "k.r0") is first  # still running: the same
    first.close()
    second = registry.open("did:plc:a", "s", "k.r0")
    assert second is not first and registry.get("did:plc:a", "s", "k.r0") is second
    assert registry.get("did:plc:a", "s", "other") is None


TRICKY = ["tok", 'a "quoted" \\ text', "line\nbreak\r\nand\rcr", "\u2028\u2029\x85", "emoji 🙂", ""]


async def test_frames_are_what_fastapi_sse_frames_and_resume_from_the_packed_buffer() -> None:
    from fastapi.sse import format_sse_event

    buffer = StreamBuffer()
    buffer.publish("part-start", {"index": 0, "type": "text"})
    for text in TRICKY:
        buffer.publish_delta(0, text)
    buffer.publish("status", {"status": "complete"})
    events = buffer.published()
    expected = [
        format_sse_event(event=e.event, data_str=e.data, id=str(e.id)) for e in events
    ]
    assert [json.loads(e.data)["text"] for e in events[1:-1]] == TRICKY
    live = b"".join(expected)
    assert buffer.framed_after(0) == live
    buffer.close()  # packed from here on
    for after in range(len(expected) + 1):
        assert buffer.framed_after(after) == b"".join(expected[after:])
        with anyio.fail_after(5):
            got = b"".join([f async for f in buffer.frames(after)])
        assert got == b"".join(expected[after:])
    assert [e[0] for e in await _all(buffer, 3)] == list(range(4, len(expected) + 1))


async def test_a_subscriber_reading_across_the_close_gets_every_frame_once() -> None:
    buffer = StreamBuffer()
    got: list[bytes] = []
    async with anyio.create_task_group() as tg:

        async def read() -> None:
            async for framed in buffer.frames(0):
                got.append(framed)

        tg.start_soon(read)
        await anyio.wait_all_tasks_blocked()
        buffer.publish_delta(0, "a")
        await anyio.wait_all_tasks_blocked()
        buffer.publish_delta(0, "b")
        buffer.publish("status", {"status": "complete"})
        buffer.close()  # packed before the reader looks again
    assert b"".join(got) == buffer.framed_after(0)
    assert len(got) == 2 and b"id: 1\n" in got[0] and got[1].count(b"\n\n") == 2


async def test_a_quiet_stream_yields_an_empty_frame_for_the_keepalive() -> None:
    buffer = StreamBuffer()
    with anyio.fail_after(5):
        async for framed in buffer.frames(0, idle=0.01):
            assert framed == b""
            break


async def test_the_registry_heartbeat_brings_keepalives_without_a_timer_per_wait() -> None:
    """With the registry's heartbeat running, a subscriber waits on its buffer alone and
    sends its keepalive at the first beat after ``idle`` less a beat of quiet; events in
    between go out at once and start the quiet time again. Once the heartbeat stops, a
    buffer's subscribers fall back to a timeout of their own."""
    registry = StreamRegistry()
    got: list[tuple[float, bytes]] = []
    async with anyio.create_task_group() as tg:
        tg.start_soon(registry.heartbeat, 0.02)
        await anyio.wait_all_tasks_blocked()  # it has started: buffers opened now rely on it
        buffer = registry.open("did:plc:a", "s", "k.r0")
        assert buffer.beat == 0.02
        start = anyio.current_time()

        async def read() -> None:
            async for framed in buffer.frames(0, idle=0.1):
                got.append((anyio.current_time() - start, framed))
                if len(got) == 3:
                    return

        with anyio.fail_after(5):
            async with anyio.create_task_group() as readers:
                readers.start_soon(read)
                await anyio.sleep(0.05)
                buffer.publish("delta", {"i": 0})  # before the first keepalive is due
        registry.stop_heartbeat()
    assert got[0][1].startswith(b"event: delta")
    assert got[1][1] == b"" and got[2][1] == b""
    # Each keepalive at least `idle` less a beat after what the subscriber was sent before it.
    assert got[1][0] - got[0][0] >= 0.08 and got[2][0] - got[1][0] >= 0.08
    assert buffer.beat is None  # stopped: back to a timeout per wait
    with anyio.fail_after(5):
        async for framed in buffer.frames(1, idle=0.01):
            assert framed == b""
            break
