"""The page's event logs (daemon/events.py): resumable by id, bounded, live."""

from __future__ import annotations

import anyio
import pytest

from daemon.events import KEEP, EventLog
from turns.streams import parse_frames

pytestmark = pytest.mark.anyio


def _ids(framed: bytes) -> list[int]:
    return [event.id for event in parse_frames(framed)]


def test_a_log_resumes_after_any_id_it_keeps() -> None:
    log = EventLog()
    assert log.last_id == 0 and log.framed_after(0) == b""
    for id in (101, 102, 105, 109):  # ids are process-wide: a log's have gaps
        log.append(id, "record", f'{{"key":"k{id}","note":"id: 7"}}')
    assert log.last_id == 109
    assert _ids(log.framed_after(0)) == [101, 102, 105, 109]
    assert _ids(log.framed_after(102)) == [105, 109]
    assert _ids(log.framed_after(103)) == [105, 109]
    assert log.framed_after(109) == b""
    assert log.framed_after(500) == b""
    [event] = parse_frames(log.framed_after(105))
    assert (event.event, event.data) == ("record", '{"key":"k109","note":"id: 7"}')


def test_a_log_keeps_its_last_events_only() -> None:
    log = EventLog()
    for id in range(1, KEEP + 51):
        log.append(id, "record", "{}")
    assert _ids(log.framed_after(0)) == list(range(51, KEEP + 51))


async def test_a_follower_gets_the_backlog_then_live_events_then_idle_beats() -> None:
    log = EventLog()
    log.append(1, "record", "{}")
    got: list[bytes] = []

    async def follow() -> None:
        async for framed in log.follow(0, idle=0.2):
            got.append(framed)
            if len(got) == 3:
                return

    async with anyio.create_task_group() as tg:
        tg.start_soon(follow)
        await anyio.sleep(0.05)
        assert log.followers == 1
        log.append(2, "title", '{"title":"t"}')
        log.append(3, "record", "{}")
    assert _ids(got[0]) == [1]
    assert _ids(got[1]) == [2, 3]  # appended in one pass of the loop: one batch
    assert got[2] == b""  # then quiet for `idle`
    assert log.followers == 0
