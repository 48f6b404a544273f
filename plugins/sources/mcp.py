"""An MCP server as a tool source, through the official ``mcp`` SDK.

One supervisor task per source owns the SDK ``Client`` (its transport, task group and
cancel scopes live in that task): a stdio server is started when the daemon starts and
started again, with backoff, whenever it exits; a streamable-HTTP server is connected the
first time something wants its tools, and again after a call finds the connection gone.
Turns call tools from their own tasks through the connected client; cancelling such a
call (the turn's cancel, a tool timeout) makes the SDK send the MCP cancellation.

A source that cannot start or connect is ``degraded``: logged at most once a minute, its
tools (from the last listing, if any) answer an error result, and nothing else fails.
"""

from __future__ import annotations

import base64
import json
import logging
import math
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
import httpx2
import mcp_types as types
from mcp import Client
from mcp.client.stdio import StdioServerParameters, get_default_environment, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from plugins.api import Tool, ToolContext, ToolResult
from plugins.sources.naming import offered_name
from plugins.sources.specs import McpHttpSpec, McpStdioSpec

log = logging.getLogger("turnd.tools")

CONNECT_TIMEOUT = 20.0  # start (or reach) the server, handshake and first listing
BACKOFF_START = 1.0
BACKOFF_MAX = 60.0
LOG_EVERY = 60.0  # a failing source is logged at most once a minute
LIST_PAGES = 100  # a server whose listing never ends cannot hang the refresh


class McpSource:
    """One ``[tools.NAME]`` of kind ``mcp``; its state is what ``/healthz`` and
    ``turnd check`` show."""

    kind = "mcp"

    def __init__(
        self, spec: McpStdioSpec | McpHttpSpec, taken: set[str], *, on_change: Callable[[], None]
    ) -> None:
        self.spec = spec
        self.name = spec.name
        self.lazy = isinstance(spec, McpHttpSpec)  # HTTP: connect on first use
        self.state = "idle" if self.lazy else "starting"  # connected | degraded
        self.error: str | None = None
        self.tools: dict[str, Tool] = {}  # offered name -> tool, kept from the last listing
        self._remote: dict[str, str] = {}  # offered name -> the server's own name
        self._taken = taken  # names in use daemon-wide, shared by every source
        self._on_change = on_change
        self._client: Client | None = None
        self._wanted = anyio.Event()
        self._lost = anyio.Event()
        self._attempted = anyio.Event()  # set after each connection attempt, good or bad
        self._changed = anyio.Event()  # tools/list_changed arrived
        self._logged_at = -math.inf
        self._up = False  # the current session got connected
        self.stopping = False  # set by the catalog when the daemon stops

    @property
    def transport(self) -> str:
        return "http" if self.lazy else "stdio"

    # -- the supervisor ---------------------------------------------------------------------

    async def run(self) -> None:
        """Keep the server connected (stdio: always; HTTP: while wanted). Runs until cancelled."""
        delay = BACKOFF_START
        while True:
            if self.lazy:
                await self._wanted.wait()
            self._lost = anyio.Event()
            self._up = False
            try:
                await self._session()
            except Exception as exc:  # noqa: BLE001 - any failure of the server is a state
                self._degrade(_reason(exc))
            finally:
                self._client = None
                # Wake whoever waits for this attempt; the next one gets a fresh event.
                self._attempted.set()
                self._attempted = anyio.Event()
            if self._up:  # it worked, then went away: not a failure loop
                delay = BACKOFF_START
                if self.lazy:
                    # Reconnect on the next use.
                    self.state, self._wanted = "idle", anyio.Event()
                    continue
                if self.state == "connected":
                    self._degrade("the server exited")
            await anyio.sleep(delay)
            delay = min(delay * 2, BACKOFF_MAX)

    async def _session(self) -> None:
        lost = self._lost
        # One scope for start, handshake and first listing; lifted once connected. (The
        # client's task group is entered inside it, so it must enclose the whole session.)
        with anyio.CancelScope(deadline=anyio.current_time() + CONNECT_TIMEOUT) as connecting:
            async with Client(
                self._transport(lost), message_handler=self._message, cache=None
            ) as client:
                await self._refresh(client)
                connecting.deadline = math.inf
                self._client = client
                self._up = True
                self.state, self.error = "connected", None
                log.info("tool source %s connected (%d tools)", self.name, len(self.tools))
                self._attempted.set()
                self._attempted = anyio.Event()
                try:
                    async with anyio.create_task_group() as tg:
                        tg.start_soon(self._listen_for_changes, client)
                        tg.start_soon(self._refresh_on_change, client)
                        await lost.wait()
                        tg.cancel_scope.cancel()
                finally:
                    self._client = None
        if connecting.cancelled_caught:
            raise TimeoutError("connect")

    def _transport(self, lost: anyio.Event) -> Any:
        spec = self.spec
        if isinstance(spec, McpStdioSpec):
            params = StdioServerParameters(
                command=spec.command,
                args=list(spec.args),
                env={**get_default_environment(), **spec.env},
                cwd=spec.cwd,
            )
            return _watched(stdio_client(params), lambda: self._lose(lost, "the server exited"))
        http = httpx2.AsyncClient(
            headers=spec.headers, timeout=httpx2.Timeout(30, read=300), follow_redirects=False
        )
        transport = _owning(http, streamable_http_client(spec.url, http_client=http))
        return _watched(transport, lambda: self._lose(lost, "the connection closed"))

    async def _message(self, message: Any) -> None:
        # Handshake-era servers announce changes as notifications on the session.
        if isinstance(message, types.ToolListChangedNotification):
            self._changed.set()
        await anyio.lowlevel.checkpoint()

    async def _listen_for_changes(self, client: Client) -> None:
        """2026-era servers announce changes on a ``subscriptions/listen`` stream instead."""
        try:
            async with client.listen(tools_list_changed=True) as subscription:
                async for _event in subscription:
                    self._changed.set()
        except Exception as exc:  # noqa: BLE001 - not every server offers it; notifications still work
            log.debug("tool source %s: no change subscription: %s", self.name, exc)

    async def _refresh_on_change(self, client: Client) -> None:
        while True:
            await self._changed.wait()
            self._changed = anyio.Event()
            try:
                with anyio.fail_after(CONNECT_TIMEOUT):
                    await self._refresh(client)
                log.info("tool source %s: tool list changed (%d tools)", self.name, len(self.tools))
            except Exception as exc:  # noqa: BLE001 - keep the previous list
                log.warning("tool source %s: could not reread its tools: %s", self.name, exc)

    async def _refresh(self, client: Client) -> None:
        listed: list[types.Tool] = []
        cursor: str | None = None
        for _ in range(LIST_PAGES):
            page = await client.list_tools(cursor=cursor)
            listed.extend(page.tools)
            cursor = page.next_cursor
            if cursor is None:
                break
        for name in self.tools:
            self._taken.discard(name)
        tools: dict[str, Tool] = {}
        remote: dict[str, str] = {}
        for tool in listed:
            offered = offered_name(self.name, tool.name, self._taken)
            self._taken.add(offered)
            remote[offered] = tool.name
            tools[offered] = Tool(
                name=offered,
                description=(tool.description or tool.title or tool.name)[:1024],
                parameters=dict(tool.input_schema or {"type": "object", "properties": {}}),
                handler=self._handler(tool.name),
                source=self.name,
                kind=self.kind,
                needs_approval=self.spec.needs_approval(offered, tool.name),
                timeout_seconds=self.spec.timeout_seconds,
            )
        self.tools, self._remote = tools, remote
        self._on_change()

    def _degrade(self, reason: str) -> None:
        self.state, self.error = "degraded", reason
        now = time.monotonic()
        if now - self._logged_at >= LOG_EVERY:
            self._logged_at = now
            log.error("tool source %s is degraded: %s", self.name, reason)

    # -- use ------------------------------------------------------------------------------------

    async def ensure(self) -> None:
        """Connect a lazy (HTTP) source that is not connected; wait for the first start of a
        stdio one. Returns after that attempt, good or bad (callers bound the wait)."""
        if self._client is not None or (not self.lazy and self.state != "starting"):
            return  # a stdio server being restarted is not waited for: its backoff may be long
        attempted = self._attempted
        self._wanted.set()
        await attempted.wait()

    def _handler(self, remote: str) -> Callable[[dict[str, Any], ToolContext], Any]:
        async def call(args: dict[str, Any], ctx: ToolContext) -> ToolResult:
            return await self.call(remote, args)

        return call

    async def call(self, remote: str, args: dict[str, Any]) -> ToolResult:
        if self._client is None:
            with anyio.move_on_after(CONNECT_TIMEOUT):
                await self.ensure()
        client = self._client
        if client is None:
            return ToolResult(
                f"the tool source {self.name!r} is unavailable: {self.error or 'not connected'}",
                True,
            )
        lost = self._lost
        try:
            result = await client.call_tool(remote, args)
        except MCPError as exc:
            if exc.code == types.CONNECTION_CLOSED:
                self._lose(lost, "the server exited")
                return ToolResult(f"the tool source {self.name!r} went away during the call", True)
            return ToolResult(f"the tool failed: {exc.message}", True)
        except (httpx2.HTTPError, OSError, anyio.BrokenResourceError, anyio.ClosedResourceError) as exc:
            self._lose(lost, _reason(exc))
            return ToolResult(f"the tool source {self.name!r} failed: {_reason(exc)}", True)
        return ToolResult(summarise(result), bool(result.is_error))

    def _lose(self, lost: anyio.Event, reason: str) -> None:
        """A call found the connection gone: say so now (the supervisor reconnects)."""
        if not lost.is_set():
            lost.set()
            if not self.stopping:  # the daemon stopping closes every server: no news
                self._degrade(reason)

    def health(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "kind": self.kind,
            "transport": self.transport,
            "state": self.state,
            "tools": len(self.tools),
        }
        if self.error:
            out["error"] = self.error
        return out


def summarise(result: types.CallToolResult) -> str:
    """Text content as it is; images, audio and resources as one line each (type, size,
    URI); structured content when nothing else came."""
    out: list[str] = []
    for block in result.content:
        if isinstance(block, types.TextContent):
            out.append(block.text)
        elif isinstance(block, types.ImageContent | types.AudioContent):
            out.append(f"[{block.type} {block.mime_type}, {_b64_size(block.data)} bytes]")
        elif isinstance(block, types.EmbeddedResource):
            res = block.resource
            mime = f" {res.mime_type}" if res.mime_type else ""
            if isinstance(res, types.TextResourceContents):
                size = len(res.text.encode())
            else:
                size = _b64_size(res.blob)
            out.append(f"[resource {res.uri}{mime}, {size} bytes]")
        elif isinstance(block, types.ResourceLink):
            mime = f" {block.mime_type}" if block.mime_type else ""
            size = f", {block.size} bytes" if block.size is not None else ""
            out.append(f"[resource link {block.uri}{mime}{size}]")
        else:
            out.append(f"[{block.type}]")  # every content block names its type
    if not out and result.structured_content is not None:
        out.append(json.dumps(result.structured_content, ensure_ascii=False))
    return "\n".join(out)


def _b64_size(data: str) -> int:
    try:
        return len(base64.b64decode(data, validate=False))
    except ValueError:
        return len(data) * 3 // 4


def _reason(exc: BaseException) -> str:
    """One short line for a failure, from the innermost exception of a group."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    if isinstance(exc, TimeoutError):
        return f"no answer within {CONNECT_TIMEOUT:g} s"
    if isinstance(exc, FileNotFoundError):
        return f"command not found: {exc.filename or exc}"
    if isinstance(exc, MCPError):
        return exc.message
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return text[:300]


@asynccontextmanager
async def _owning(http: httpx2.AsyncClient, transport: Any) -> AsyncIterator[Any]:
    """The HTTP transport, closing the httpx client it was given when it ends."""
    async with http, transport as streams:
        yield streams


@asynccontextmanager
async def _watched(transport: Any, lost: Callable[[], None]) -> AsyncIterator[Any]:
    """The transport's streams, calling ``lost`` when the server's side ends (a stdio
    server that exits closes its stdout): the supervisor then starts it again."""
    async with transport as (read, write):
        yield _WatchedRead(read, lost), write
    lost()


class _WatchedRead:
    def __init__(self, inner: Any, lost: Callable[[], None]) -> None:
        self._inner = inner
        self._lost = lost

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)  # e.g. last_context, read by the dispatcher

    async def receive(self) -> Any:
        try:
            return await self._inner.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            self._lost()
            raise

    def __aiter__(self) -> _WatchedRead:
        return self

    async def __anext__(self) -> Any:
        try:
            return await self.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def __aenter__(self) -> _WatchedRead:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
