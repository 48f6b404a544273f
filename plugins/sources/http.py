"""An HTTP endpoint as one tool (seed 000's ``handler_type: http``).

The tool gets ``POST {call_id, name, arguments, conversation, user}`` and answers
``{status: "success" | "error", result}``. Anything else — another shape, a non-2xx, a
timeout (the turn's tool timeout, or the source's ``timeoutSeconds``) — is an error result
with a short message the model can read.
"""

from __future__ import annotations

import json
from typing import Any

import httpx

from plugins.api import Tool, ToolContext, ToolResult
from plugins.sources.naming import offered_name
from plugins.sources.specs import HttpToolSpec

MAX_ANSWER = 1_000_000  # bytes of answer read; a tool result is at most 500 KB in a record


class HttpToolSource:
    kind = "http"
    transport = "http"
    state = "connected"  # nothing to connect: each call is one request
    error: str | None = None
    lazy = False
    stopping = False

    def __init__(self, spec: HttpToolSpec, taken: set[str]) -> None:
        self.spec = spec
        self.name = spec.name
        offered = offered_name(spec.name, None, taken)
        taken.add(offered)
        self.tools = {
            offered: Tool(
                name=offered,
                description=spec.description,
                parameters=spec.parameters,
                handler=self.call,
                source=spec.name,
                kind=self.kind,
                needs_approval=spec.needs_approval(offered, spec.name),
                timeout_seconds=spec.timeout_seconds,
            )
        }
        self._offered = offered

    async def run(self) -> None:
        """Nothing to supervise."""

    async def ensure(self) -> None:
        """Always ready."""

    async def call(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        body = {
            "call_id": ctx.call_id,
            "name": self._offered,
            "arguments": args,
            "conversation": ctx.conversation,
            "user": ctx.user,
        }
        try:
            async with ctx.http.stream(
                "POST", self.spec.url, json=body, headers=self.spec.headers, timeout=None
            ) as response:
                raw = bytearray()
                async for chunk in response.aiter_bytes():
                    raw += chunk
                    if len(raw) > MAX_ANSWER:
                        return ToolResult(f"the tool's answer is over {MAX_ANSWER} bytes", True)
        except httpx.HTTPError as exc:
            return ToolResult(f"could not reach the tool: {type(exc).__name__}", True)
        if not 200 <= response.status_code < 300:
            return ToolResult(f"the tool answered HTTP {response.status_code}", True)
        try:
            answer = json.loads(raw)
        except ValueError:
            return ToolResult("the tool's answer is not JSON", True)
        if not isinstance(answer, dict) or answer.get("status") not in ("success", "error"):
            return ToolResult('the tool\'s answer is not {"status": "success"|"error", "result"}', True)
        result = answer.get("result")
        output = result if isinstance(result, str) else json.dumps(result, ensure_ascii=False)
        return ToolResult(output, answer["status"] == "error")

    def health(self) -> dict[str, Any]:
        return {"kind": self.kind, "transport": self.transport, "state": self.state, "tools": 1}
