"""Example tool plugin: tells the time in a time zone. Off unless enabled:

    [plugins]
    enabled = ["clock"]
"""

from __future__ import annotations

from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from plugins.api import Plugin, Tool, ToolContext


async def _now(args: dict[str, Any], ctx: ToolContext) -> dict[str, str]:
    zone = args.get("timezone") or "UTC"
    try:
        tz = ZoneInfo(zone)
    except (ZoneInfoNotFoundError, ValueError):
        raise ValueError(f"unknown time zone {zone!r}") from None
    return {"timezone": zone, "now": datetime.now(tz).isoformat(timespec="seconds")}


def plugin() -> Plugin:
    return Plugin(
        name="clock",
        tools=[
            Tool(
                name="clock",
                description="The current date and time in an IANA time zone.",
                parameters={
                    "type": "object",
                    "properties": {"timezone": {"type": "string", "description": "e.g. Europe/Paris"}},
                },
                handler=_now,
            )
        ],
    )
