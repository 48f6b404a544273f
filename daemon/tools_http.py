"""The tool routes (SPEC §14): ``GET /api/tools`` and the approval decision, plus what
``/healthz`` says about the tool sources."""

# No "from __future__ import annotations": FastAPI reads these annotations at runtime.
from typing import Any

from fastapi import APIRouter, HTTPException
from pydantic import BaseModel, ConfigDict, Field

from daemon.deps import AccountDep, ConversationDep
from daemon.served import Served
from recordstore import keys


class Decision(BaseModel):
    model_config = ConfigDict(extra="forbid")
    approve: bool


class _Tool(BaseModel):
    name: str
    description: str
    source: str | None
    kind: str
    needsApproval: bool  # noqa: N815 - the SPEC's name
    available: bool


class ToolList(BaseModel):
    tools: list[_Tool] = Field(default_factory=list)


def router(service: Served) -> APIRouter:
    api = APIRouter(prefix="/api", tags=["tools"])

    @api.get("/tools")
    async def tools(acct: AccountDep) -> ToolList:
        """Every tool a message may name; listing connects an HTTP MCP source not yet
        connected. ``available`` is false for the tools of a source that is down."""
        listed = await service.tools.listing()
        return ToolList(tools=[_Tool(**t) for t in listed])

    @api.post(
        "/conversations/{skey}/messages/{replyKey}/approvals/{callId}",
        responses={409: {"description": "that call is not waiting for a decision"}},
    )
    async def approve(
        conv: ConversationDep,
        replyKey: str,  # noqa: N803 - the SPEC's names, shown in the OpenAPI document
        callId: str,  # noqa: N803
        body: Decision,
    ) -> dict[str, bool]:
        keys.validate_key(replyKey)
        decided = service.engine.approvals.decide(
            conv.did, conv.skey, replyKey, callId, body.approve
        )
        if not decided:
            raise HTTPException(
                409, f"tool call {callId!r} of {replyKey} is not waiting for a decision"
            )
        return {"decided": True}

    return api


def tool_health(service: Served) -> dict[str, Any]:
    """For ``/healthz``: each tool source's state; a degraded one never makes it 503."""
    catalog = service.tools
    if not catalog.sources:
        return {}
    return {"tools": catalog.health(), "degraded": catalog.degraded()}
