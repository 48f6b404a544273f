"""The reply stream's response: its last frame goes out with the end of the body."""

from __future__ import annotations

from typing import Any

import anyio
import anyio.lowlevel
import pytest

from daemon.sse_response import ReplyEvents
from turns.streams import StreamBuffer

pytestmark = pytest.mark.anyio


async def _sent(response: ReplyEvents) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        messages.append(message)

    await response.stream_response(send)
    return messages


def _bodies(messages: list[dict[str, Any]]) -> list[tuple[bytes, bool]]:
    assert messages[0]["type"] == "http.response.start"
    return [(m["body"], m["more_body"]) for m in messages[1:]]


async def test_a_finished_buffer_ends_with_its_status_in_one_send() -> None:
    buffer = StreamBuffer()
    buffer.publish_delta(0, "hi")
    buffer.publish("status", {"status": "complete"})
    buffer.close()
    bodies = _bodies(await _sent(ReplyEvents(buffer.frames(), ended=lambda: buffer.done)))
    assert len(bodies) == 1
    body, more = bodies[0]
    assert more is False
    assert b"event: delta" in body and body.endswith(b'data: {"status":"complete"}\nid: 2\n\n')


async def test_a_live_buffer_sends_each_chunk_at_once_and_ends_with_the_last() -> None:
    buffer = StreamBuffer()
    response = ReplyEvents(buffer.frames(), ended=lambda: buffer.done)
    messages: list[dict[str, Any]] = []
    first_sent = anyio.Event()

    async def send(message: dict[str, Any]) -> None:
        messages.append(message)
        if message.get("body"):
            first_sent.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(response.stream_response, send)
        await anyio.lowlevel.checkpoint()
        buffer.publish_delta(0, "a")
        with anyio.fail_after(5):
            await first_sent.wait()  # not held back while the turn runs
        assert _bodies(messages) == [(messages[1]["body"], True)]
        buffer.publish("status", {"status": "complete"})
        buffer.close()
    bodies = _bodies(messages)
    assert [more for _, more in bodies] == [True, False]
    assert b'"status":"complete"' in bodies[1][0]


async def test_a_chunk_after_one_thought_last_is_sent_in_order() -> None:
    async def chunks() -> Any:
        yield b"one"
        yield b"two"

    bodies = _bodies(await _sent(ReplyEvents(chunks(), ended=lambda: True)))
    assert bodies == [(b"one", True), (b"two", False)]


async def test_a_stream_with_nothing_after_the_cursor_still_ends() -> None:
    buffer = StreamBuffer()
    buffer.publish("status", {"status": "complete"})
    buffer.close()
    bodies = _bodies(await _sent(ReplyEvents(buffer.frames(after=1), ended=lambda: buffer.done)))
    assert bodies == [(b"", False)]
