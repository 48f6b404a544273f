"""The plugin API: tools, tool sources and hooks, and their loader."""

from plugins.api import Plugin, Tool, ToolContext, ToolResult, ToolSource
from plugins.context import AFTER_MODEL, BEFORE_MODEL, HOOKS, TURN_AFTER, TurnContext
from plugins.hooks import HookError, PluginSet
from plugins.loader import load_plugins

__all__ = [
    "AFTER_MODEL",
    "BEFORE_MODEL",
    "HOOKS",
    "TURN_AFTER",
    "HookError",
    "Plugin",
    "PluginSet",
    "Tool",
    "ToolContext",
    "ToolResult",
    "ToolSource",
    "TurnContext",
    "load_plugins",
]
