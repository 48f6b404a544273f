"""The plugin API: tools, tool sources and hooks, and their loader."""

from plugins.api import Plugin, Tool, ToolContext, ToolSource
from plugins.hooks import AFTER_MODEL, BEFORE_MODEL, HOOKS, TURN_AFTER, HookError, PluginSet
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
    "ToolSource",
    "load_plugins",
]
