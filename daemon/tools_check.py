"""``turnd check`` for the tool sources: each one started (stdio) or reached (HTTP),
its tools listed, as ``turnd serve`` would, then stopped again."""

from __future__ import annotations

import anyio

from daemon.config import Config

CHECK_SECONDS = 25.0  # longer than a source's own connect timeout (20 s)


async def check_tools(config: Config) -> list[tuple[bool | str, str, str]]:
    """One line per ``[tools.NAME]``: ok with its tool count, or ``degraded`` with why."""
    if not config.tools:
        return []
    from plugins.sources import ToolCatalog

    lines: list[tuple[bool | str, str, str]] = []
    async with ToolCatalog(None, config.tools) as catalog:
        with anyio.move_on_after(CHECK_SECONDS):
            await catalog.offer(list(catalog.sources))  # waits for each first attempt
        for name, source in catalog.sources.items():
            health = source.health()
            where = f"{name}: {health['kind']} over {health['transport']}"
            if health["state"] == "connected":
                count = health["tools"]
                lines.append((True, "tools", f"{where}, {count} tool{'' if count == 1 else 's'}"))
            else:
                why = health.get("error") or f"not connected within {CHECK_SECONDS:g} s"
                lines.append(("degraded", "tools", f"{where}: {why}"))
    return lines
