"""``python -m bench.tools``: the time turnd adds to an MCP tool call (SPEC §14).

One stdio MCP server script (``testbed/mcp_test_server.py``, the SDK's own server; its
``echo`` tool answers at once) runs twice: as a ``[tools.b]`` source of a ``turnd serve``
process, and under the bare ``mcp`` SDK client in this process. Interleaved one for one:

- **direct**: ``client.call_tool("echo", ...)`` → its result, with the SDK;
- **turnd**: a turn whose model (the fake server, in a thread of this process) calls
  ``b_echo``: the time from the model's first request to its second, as the fake server
  sees them arrive. That span is turnd's whole tool step: reading the model's (tiny,
  undelayed) tool-call stream, the approval check, the SDK call to the same kind of
  server, the result part, and sending the next request;
- **plugin**: the same with the built-in ``clock`` plugin tool (no I/O), the part of that
  span that is not the MCP call.

``tool_overhead_ms_p50`` = median(turnd) − median(direct). Figures to read, never asserted.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import httpx
from httpx_sse import aconnect_sse

from bench.figures import print_figures
from bench.procs import TurndProc
from testbed.fakemodel import FakeModel, Reply, ToolCall
from turns.tls import tls_context

ROOT = Path(__file__).resolve().parent.parent
SERVER = ROOT / "testbed" / "mcp_test_server.py"
TEXT = "network.sharedcomputer.chat.defs#textPart"
TOOL_CALL = "network.sharedcomputer.chat.defs#toolCallPart"
TOOL_RESULT = "network.sharedcomputer.chat.defs#toolResultPart"


def _responder(request: dict[str, Any]) -> Reply:
    """A tool call first; once the tool's result is in the prompt, a short answer."""
    if request["messages"][-1]["role"] == "tool":
        return Reply.text(["done"])
    offered = [t["function"]["name"] for t in request.get("tools") or ()]
    if "clock" in offered:
        return Reply.tool_calls([ToolCall("clock", {"timezone": "UTC"}, id=f"k{next(_ids)}")])
    return Reply.tool_calls([ToolCall("b_echo", {"text": "ping"}, id=f"c{next(_ids)}")])


_ids = itertools.count()


async def _direct(client: Any) -> float:
    started = time.perf_counter()
    result = await client.call_tool("echo", {"text": "ping"})
    elapsed = time.perf_counter() - started
    assert result.content[0].text == "echo: ping", result
    return elapsed


async def _through_turnd(http: httpx.AsyncClient, fake: FakeModel, skey: str, tool: str) -> float:
    """One turn calling ``tool``: the model's first request -> its second, at the model."""
    body = {"parts": [{"$type": TEXT, "text": "ping"}], "generation": {"tools": [tool]}}
    before = len(fake.chat_requests)
    r = await http.post(f"/api/conversations/{skey}/messages", json=body)
    r.raise_for_status()
    reply = r.json()["replyKey"]
    url = f"/api/conversations/{skey}/messages/{reply}/stream"
    async with aconnect_sse(http, "GET", url) as source:
        async for sse in source.aiter_sse():
            if sse.event == "status":
                assert json.loads(sse.data)["status"] == "complete", sse.data
                break
    # This turn's two steps (a title request, without tools, may come between).
    steps = [r for r in fake.chat_requests[before:] if r.json.get("tools")]
    first, second = steps[:2]
    tools = [t["function"]["name"] for t in first.json["tools"]]
    assert tool in tools or tools[0].startswith(tool), tools
    assert second.json["messages"][-1]["role"] == "tool", "the tool's result was not sent on"
    return second.time - first.time


async def run(runs: int, warmup: int) -> dict[str, Any]:
    from mcp import Client
    from mcp.client.stdio import StdioServerParameters

    with FakeModel(responder=_responder) as fake:
        extra = (
            f'[tools.b]\nkind = "mcp"\ncommand = "{sys.executable}"\nargs = ["{SERVER}"]\n\n'
            '[plugins]\nenabled = ["clock"]\n'
        )
        with TurndProc({"fake": fake.base_url}, extra=extra) as turnd:
            headers = {"Authorization": f"Bearer {turnd.token}"}
            params = StdioServerParameters(command=sys.executable, args=[str(SERVER)])
            async with (
                httpx.AsyncClient(base_url=turnd.base_url, headers=headers, timeout=60, verify=tls_context()) as http,
                Client(params, cache=None) as client,
            ):
                skey = (await http.post("/api/conversations", json={})).json()["skey"]
                direct: list[float] = []
                through: list[float] = []
                plugin: list[float] = []
                for i in range(warmup + runs):
                    d = await _direct(client)
                    t = await _through_turnd(http, fake, skey, "b")
                    p = await _through_turnd(http, fake, skey, "clock")
                    if i >= warmup:
                        direct.append(d)
                        through.append(t)
                        plugin.append(p)
    ms = 1000.0
    return {
        "runs": runs,
        "direct_call_ms_p50": round(statistics.median(direct) * ms, 3),
        "turnd_call_ms_p50": round(statistics.median(through) * ms, 3),
        "tool_overhead_ms_p50": round((statistics.median(through) - statistics.median(direct)) * ms, 3),
        "plugin_step_ms_p50": round(statistics.median(plugin) * ms, 3),
        "direct_call_ms_min_max": [round(min(direct) * ms, 3), round(max(direct) * ms, 3)],
        "turnd_call_ms_min_max": [round(min(through) * ms, 3), round(max(through) * ms, 3)],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.tools", description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=50, help="measured calls of each kind (50)")
    parser.add_argument("--warmup", type=int, default=5, help="calls of each kind not counted (5)")
    parser.add_argument("--json", action="store_true", help="end with one JSON line")
    args = parser.parse_args(argv)
    figures = anyio.run(run, args.runs, args.warmup)
    print_figures(figures, as_json=args.json, width=26)
    return 0


if __name__ == "__main__":
    sys.exit(main())
