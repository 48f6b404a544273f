"""One tool call, run: arguments parsed, the timeout applied, the outcome counted.

``generate`` runs a step's calls in parallel; each goes through :func:`call_tool`. A turn
hands ``generate`` a :class:`ToolRun` with its approval gate and the tool-call metric.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Sequence
from typing import Any

import anyio
from prometheus_client import CollectorRegistry, Counter

from plugins.api import Tool, ToolContext, ToolResult
from turns.approval import ApprovalGate
from turns.settings import TurnSettings

Observe = Callable[[str, str], None]  # (source, outcome)


class ToolCallMetrics:
    """``turnd_tool_calls_total{source, outcome}``: ok, error, timeout, unknown (a tool not
    offered), denied, approval_timeout. ``source`` is the tool source, ``plugin`` for a
    plugin's own tools, ``unknown`` for a name no tool has."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._calls = Counter(
            "turnd_tool_calls", "Tool calls by source and outcome", ["source", "outcome"],
            registry=registry,
        )

    def observe(self, source: str, outcome: str) -> None:
        self._calls.labels(source, outcome).inc()


class ToolRun:
    """A turn's side of its tool calls: approval, and the ``turnd_tool_calls`` metric."""

    def __init__(self, gate: ApprovalGate | None = None, observe: Observe | None = None) -> None:
        self.gate = gate
        self._observe = observe

    async def request(
        self, calls: Sequence[tuple[int, dict[str, Any]]], by_name: dict[str, Tool]
    ) -> None:
        """A step's call parts, ``(part index, part)`` in call order: announce those that
        need approval (their event, then one rewrite of the record)."""
        if self.gate is None:
            return
        pending = [
            (position, index, part)
            for position, (index, part) in enumerate(calls)
            if (tool := by_name.get(part["tool"])) is not None and tool.needs_approval
        ]
        await self.gate.request(pending)

    async def refused(self, position: int, tool: Tool | None) -> str | None:
        """Wait for the decision on the call at ``position`` if it needs one: the error
        result when it may not run, else None."""
        if self.gate is None or not self.gate.needs(position):
            return None
        refusal = await self.gate.wait(position)
        if refusal is not None:
            outcome = "denied" if refusal == "not approved by the user" else "approval_timeout"
            self.observe(tool, outcome)
        return refusal

    def observe(self, tool: Tool | None, outcome: str) -> None:
        if self._observe is not None:
            source = "unknown" if tool is None else (tool.source or "plugin")
            self._observe(source, outcome)


async def call_tool(
    tool: Tool | None,
    name: str,
    arguments: str,
    context: ToolContext,
    settings: TurnSettings,
    call_id: str = "",
) -> tuple[Any, bool, str]:
    """(output, is_error, outcome); outcome is ok, error, timeout or unknown."""
    if tool is None:
        return f"unknown tool {name!r}", True, "unknown"
    try:
        args = json.loads(arguments) if arguments.strip() else {}
    except ValueError as exc:
        return f"the arguments are not valid JSON: {exc}", True, "error"
    if not isinstance(args, dict):
        return "the arguments must be a JSON object", True, "error"
    timeout = tool.timeout_seconds or settings.tool_timeout_seconds  # the source's wins
    if call_id:
        context = dataclasses.replace(context, call_id=call_id)
    with anyio.move_on_after(timeout) as scope:
        try:
            value = await tool.handler(args, context)
        except Exception as exc:  # a tool's failure is a result the model sees
            return f"{type(exc).__name__}: {exc}", True, "error"
        if isinstance(value, ToolResult):
            return value.output, value.is_error, "error" if value.is_error else "ok"
        return value, False, "ok"
    if scope.cancelled_caught:
        return f"the tool timed out after {timeout:g} s", True, "timeout"
    return "the tool was stopped", True, "error"
