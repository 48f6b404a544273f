"""A real MCP server over stdio, built with the official SDK, for the tool tests that
need a server to misbehave on cue: a long call (that notes whether it was cancelled),
a call that kills the server, its process id (to see a restart), and a call that adds
a tool and announces ``tools/list_changed``.

Every event is appended as one line to the file named by ``$MCP_TEST_LOG``:
``start <id>``, ``done <id>``, ``cancelled <id>``, ``crash``.

    python testbed/mcp_test_server.py      # speaks MCP on stdin/stdout
"""

from __future__ import annotations

import os

import anyio
from mcp.server.mcpserver import Context, MCPServer

server = MCPServer("turnd-test")


def _note(line: str) -> None:
    path = os.environ.get("MCP_TEST_LOG")
    if path:
        with open(path, "a") as fh:
            fh.write(line + "\n")


@server.tool()
def echo(text: str) -> str:
    """Answers the text it was given."""
    return f"echo: {text}"


@server.tool()
def pid() -> str:
    """The server's process id."""
    return str(os.getpid())


@server.tool()
async def sleep(seconds: float, label: str = "x") -> str:
    """Sleeps, noting its start and its end or cancellation."""
    _note(f"start {label}")
    try:
        await anyio.sleep(seconds)
    except anyio.get_cancelled_exc_class():
        _note(f"cancelled {label}")
        raise
    _note(f"done {label}")
    return f"slept {seconds:g} s"


@server.tool()
async def grow(name: str, ctx: Context) -> str:
    """Adds a tool ``name`` (answering "<name> here") and announces the new list."""

    def added() -> str:
        return f"{name} here"

    server.add_tool(added, name=name, description=f"The {name} tool, added at run time")
    await ctx.notify_tools_changed()
    return f"added {name}"


@server.tool()
def crash() -> str:
    """Kills the server in the middle of the call."""
    _note("crash")
    os._exit(3)


if __name__ == "__main__":
    server.run("stdio")
