"""The one reader of reply streams (``text/event-stream``), on ``httpx-sse``.

Every event comes back as ``{"id": int, "event": str, "data": <decoded JSON>}``, the
shape the daemon's stream promises (numbered ids, JSON data). Comment lines (the
``: ping`` keep-alives) are not events; a test about them reads the raw lines.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
from httpx_sse import EventSource, ServerSentEvent


def event(sse: ServerSentEvent) -> dict[str, Any]:
    return {"id": int(sse.id) if sse.id else None, "event": sse.event, "data": json.loads(sse.data)}


async def read_events(response: httpx.Response, *, limit: int | None = None) -> list[dict[str, Any]]:
    """The events of a streamed response, until it ends or ``limit`` events came."""
    events: list[dict[str, Any]] = []
    if limit == 0:
        return events
    async for sse in EventSource(response).aiter_sse():
        if _keepalive(sse):
            continue
        events.append(event(sse))
        if limit is not None and len(events) >= limit:
            break
    return events


def parse_events(raw: str) -> list[dict[str, Any]]:
    """The events in a stream already read whole (a test that also checks the raw text)."""
    response = httpx.Response(200, headers={"content-type": "text/event-stream"}, text=raw)
    return [event(sse) for sse in EventSource(response).iter_sse() if not _keepalive(sse)]


def _keepalive(sse: ServerSentEvent) -> bool:
    """The blank line after a ``: ping`` comment.

    The SSE spec dispatches nothing for a blank line with no data, but httpx-sse
    yields an empty ``message`` event carrying the last event id: not an event.
    """
    return not sse.data and sse.event == "message"
