"""What a plugin can add: tools, tool sources and hooks."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
import httpx

from plugins.context import HOOKS


@dataclass(frozen=True, slots=True)
class ToolContext:
    """Handed to a tool's handler. ``cancelled`` is set when the turn is cancelled."""

    user: str  # the user's DID
    conversation: str  # at://<did>/network.sharedcomputer.chat.conversation/<skey>
    cancelled: anyio.Event
    http: httpx.AsyncClient
    call_id: str = ""  # the model's id of the call being run


ToolHandler = Callable[[dict[str, Any], ToolContext], Awaitable[Any]]


@dataclass(frozen=True, slots=True)
class ToolResult:
    """What a handler returns to say exactly what the model reads, error or not
    (an MCP ``isError`` result); any other return value is a success."""

    output: str
    is_error: bool = False


@dataclass(frozen=True, slots=True)
class Tool:
    name: str
    description: str
    parameters: dict[str, Any]  # JSON schema of the arguments object
    handler: ToolHandler
    # Set for the tools of a configured source ([tools.NAME]); plugin tools keep the defaults.
    source: str | None = None
    kind: str = "plugin"  # "plugin", "mcp" or "http"
    needs_approval: bool = False
    timeout_seconds: float | None = None  # the source's timeoutSeconds: wins over the turn's

    def spec(self) -> dict[str, Any]:
        """The Chat Completions `tools` entry."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.parameters,
            },
        }


@dataclass(frozen=True, slots=True)
class ToolSource:
    """A named set of tools, offered as ``<source>_<tool>`` (providers accept only [A-Za-z0-9_-])."""

    id: str
    tools: tuple[Tool, ...]

    def named_tools(self) -> list[Tool]:
        return [
            Tool(f"{self.id}_{t.name}", t.description, t.parameters, t.handler, source=self.id)
            for t in self.tools
        ]


@dataclass
class Plugin:
    """A plugin registers through the entry-point group ``turnd.plugins`` or the config."""

    name: str
    tools: list[Tool] = field(default_factory=list)
    sources: list[ToolSource] = field(default_factory=list)
    # hook name -> callables, see plugins.hooks
    hooks: dict[str, list[Callable[..., Any]]] = field(default_factory=dict)

    def on(self, hook: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        if hook not in HOOKS:
            raise ValueError(f"unknown hook {hook!r}; hooks are {', '.join(HOOKS)}")

        def register(fn: Callable[..., Any]) -> Callable[..., Any]:
            self.hooks.setdefault(hook, []).append(fn)
            return fn

        return register
