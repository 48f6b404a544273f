"""The hooks, declared in one place, and the set of loaded plugins that runs them."""

from __future__ import annotations

import inspect
from typing import Any

from plugins.api import Plugin, Tool
from plugins.context import AFTER_MODEL, BEFORE_MODEL, HOOKS, TURN_AFTER, TurnContext

__all__ = ["AFTER_MODEL", "BEFORE_MODEL", "HOOKS", "TURN_AFTER", "HookError", "PluginSet"]


class HookError(Exception):
    """A filter raised: the turn fails with this message."""


class PluginSet:
    """Plugins in registration order; hooks run in that order."""

    def __init__(self, plugins: list[Plugin] | None = None) -> None:
        self.plugins: list[Plugin] = list(plugins or [])
        self._tools: dict[str, Tool] = {}
        for plugin in self.plugins:
            for tool in plugin.tools:
                self._tools[tool.name] = tool
            for source in plugin.sources:
                for tool in source.named_tools():
                    self._tools[tool.name] = tool

    @property
    def tool_names(self) -> list[str]:
        return list(self._tools)

    def tools(self, names: list[str]) -> list[Tool]:
        """The tools offered for a turn: those named that exist, in the order named."""
        return [self._tools[n] for n in dict.fromkeys(names) if n in self._tools]

    async def filter(self, hook: str, value: Any, ctx: TurnContext) -> Any:
        for fn in self._hooks(hook):
            try:
                result = fn(value, ctx)
                if inspect.isawaitable(result):
                    result = await result
            except Exception as exc:
                raise HookError(f"{hook} hook failed: {exc}") from exc
            value = result
        return value

    async def action(self, hook: str, ctx: TurnContext) -> None:
        for fn in self._hooks(hook):
            result = fn(ctx)
            if inspect.isawaitable(result):
                await result

    def _hooks(self, hook: str) -> list[Any]:
        return [fn for p in self.plugins for fn in p.hooks.get(hook, ())]
