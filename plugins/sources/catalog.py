"""Every tool the daemon can offer: the plugins' and the configured sources'.

``offer(names)`` is what a turn gets: each name is a tool, a source (all of its tools) or
a glob (``time_*``). The sources run in the catalog's own task group (``async with``),
for as long as the daemon does.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from contextlib import AsyncExitStack
from fnmatch import fnmatchcase
from typing import Any, Protocol

import anyio

from plugins.api import Tool
from plugins.hooks import PluginSet
from plugins.sources.specs import HttpToolSpec, McpHttpSpec, McpStdioSpec, ToolSourceSpec

log = logging.getLogger("turnd.tools")

OFFER_CONNECT_TIMEOUT = 10.0  # a turn waits at most this long for a lazy source to connect
_GLOB = frozenset("*?[")


class Source(Protocol):
    name: str
    kind: str
    transport: str
    state: str
    error: str | None
    lazy: bool
    stopping: bool
    tools: dict[str, Tool]

    async def run(self) -> None: ...
    async def ensure(self) -> None: ...
    def health(self) -> dict[str, Any]: ...


def build_source(spec: ToolSourceSpec, taken: set[str]) -> Source:
    if isinstance(spec, HttpToolSpec):
        from plugins.sources.http import HttpToolSource

        return HttpToolSource(spec, taken)
    from plugins.sources.mcp import McpSource  # the SDK is imported only when configured

    assert isinstance(spec, McpStdioSpec | McpHttpSpec)
    return McpSource(spec, taken, on_change=lambda: None)


class ToolCatalog:
    def __init__(self, plugins: PluginSet | None = None, specs: Sequence[ToolSourceSpec] = ()) -> None:
        self._plugins = plugins or PluginSet()
        taken = set(self._plugins.tool_names)
        self.sources: dict[str, Source] = {}
        for spec in specs:
            self.sources[spec.name] = build_source(spec, taken)
        self._stack: AsyncExitStack | None = None

    async def __aenter__(self) -> ToolCatalog:
        async with AsyncExitStack() as stack:
            tg = await stack.enter_async_context(anyio.create_task_group())
            stack.callback(self._stop, tg)  # the supervisors run until the daemon stops
            for source in self.sources.values():
                tg.start_soon(source.run, name=f"tool source {source.name}")
            self._stack = stack.pop_all()
        return self

    def _stop(self, tg: anyio.abc.TaskGroup) -> None:
        for source in self.sources.values():
            source.stopping = True
        tg.cancel_scope.cancel()

    async def __aexit__(self, *exc: object) -> None:
        if self._stack is not None:
            await self._stack.__aexit__(*exc)
            self._stack = None

    # -- what a turn offers -----------------------------------------------------------------

    def _all(self) -> dict[str, Tool]:
        tools = {t.name: t for t in self._plugins.tools(self._plugins.tool_names)}
        for source in self.sources.values():
            tools.update(source.tools)
        return tools

    def _matching_sources(self, names: Sequence[str]) -> list[Source]:
        out = []
        for source in self.sources.values():
            for n in names:
                if (
                    n == source.name
                    or n.startswith(f"{source.name}_")
                    or (_GLOB & set(n) and fnmatchcase(f"{source.name}_x", n))
                ):
                    out.append(source)
                    break
        return out

    async def offer(self, names: Sequence[str]) -> list[Tool]:
        """The tools named (tools, source names or globs), in the order named, each once.

        A lazy (HTTP MCP) source that a name points at is connected first, for at most
        ``OFFER_CONNECT_TIMEOUT`` seconds all together; if it does not make it, its tools
        are not offered.
        """
        lazy = [
            s
            for s in self._matching_sources(names)
            if (s.lazy and s.state != "connected") or s.state == "starting"
        ]
        if lazy:
            with anyio.move_on_after(OFFER_CONNECT_TIMEOUT):
                async with anyio.create_task_group() as tg:
                    for source in lazy:
                        tg.start_soon(source.ensure)
        return self.select(names)

    def select(self, names: Sequence[str]) -> list[Tool]:
        tools = self._all()
        chosen: dict[str, Tool] = {}
        for n in names:
            if n in tools:
                chosen.setdefault(n, tools[n])
            elif n in self.sources:
                for tool in self.sources[n].tools.values():
                    chosen.setdefault(tool.name, tool)
            elif _GLOB & set(n):
                for name, tool in tools.items():
                    if fnmatchcase(name, n):
                        chosen.setdefault(name, tool)
        return list(chosen.values())

    @property
    def tool_names(self) -> list[str]:
        return list(self._all())

    def tools(self, names: Sequence[str]) -> list[Tool]:
        """PluginSet's interface, for callers that only need what is known now."""
        return self.select(names)

    # -- what the daemon shows ---------------------------------------------------------------

    async def listing(self) -> list[dict[str, Any]]:
        """``GET /api/tools``: every tool; lazy sources not yet connected are connected first."""
        await self.offer(list(self.sources))
        out = []
        for tool in self._all().values():
            source = self.sources.get(tool.source or "")
            out.append(
                {
                    "name": tool.name,
                    "description": tool.description,
                    "source": tool.source,
                    "kind": tool.kind,
                    "needsApproval": tool.needs_approval,
                    "available": source is None or source.state == "connected",
                }
            )
        return out

    def health(self) -> dict[str, dict[str, Any]]:
        return {name: source.health() for name, source in self.sources.items()}

    def degraded(self) -> list[str]:
        return [name for name, s in self.sources.items() if s.state == "degraded"]
