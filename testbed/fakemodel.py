"""A fake OpenAI-compatible model server for tests and benchmarks.

It is a real HTTP/1.1 server on loopback (asyncio streams + ``h11`` for the
HTTP framing) that speaks ``POST /v1/chat/completions`` (streaming and not),
and ``GET /v1/models``. Each chat request is answered by a :class:`Reply`:
first from the FIFO queue (:meth:`FakeModel.push`), then from the optional
``responder`` callable, then from ``FakeModel.default``.

Streaming replies are sent as OpenAI does: a role chunk, the reasoning /
content / tool-call deltas, a chunk carrying ``finish_reason``, a usage chunk
with ``choices: []`` when ``stream_options.include_usage`` is set, then
``data: [DONE]``. Fault positions (``cut``, ``stall``, ``malformed``,
``stream_error``) count those ``data:`` lines from 0, so the first content
delta is line 1 (line 0 is the role chunk).

The per-chunk cost is kept tiny because the benchmarks push thousands of
chunks/s through it: a reply's choice JSON is encoded once and cached, each
request only glues a pre-encoded prefix/suffix around it, and chunks that are
already due are written together in one socket write.

Usage::

    with FakeModel() as fake:
        fake.push(Reply.text(["Hel", "lo"]))
        client = openai.AsyncOpenAI(base_url=fake.base_url, api_key="sk-test")

or the ``fake_model`` pytest fixture (``tests/support/fixtures.py``), or as a process for benchmarks::

    python -m testbed.fakemodel --port 0 --tokens 50 --chunk-delay-ms 0 --ttft-ms 20
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import inspect
import itertools
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import traceback
from collections import deque
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import h11

__all__ = [
    "FakeModel",
    "RecordedRequest",
    "Reply",
    "Responder",
    "ToolCall",
    "Usage",
    "main",
    "measure_throughput",
]

ReasoningField = Literal["reasoning_content", "reasoning"]


def _dumps(obj: Any) -> bytes:
    # Compact separators, like the OpenAI API itself.
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()


# --------------------------------------------------------------------------- replies


@dataclass(frozen=True)
class ToolCall:
    """One tool call in a reply, streamed as OpenAI does it.

    ``arguments`` may be a dict (JSON-encoded), a string, or a list of
    string fragments sent as-is. Strings/dicts are cut into fragments of
    ``fragment_size`` characters.
    """

    name: str
    arguments: Mapping[str, Any] | str | Sequence[str] = "{}"
    id: str | None = None
    fragment_size: int = 8

    def fragments(self) -> list[str]:
        args = self.arguments
        if isinstance(args, Mapping):
            args = json.dumps(args)
        if isinstance(args, str):
            size = max(1, self.fragment_size)
            return [args[i : i + size] for i in range(0, len(args), size)] or [""]
        return list(args)

    def arguments_json(self) -> str:
        return "".join(self.fragments())


@dataclass(frozen=True)
class Usage:
    """Usage numbers reported in the final chunk (or the non-stream body)."""

    prompt_tokens: int
    completion_tokens: int
    reasoning_tokens: int = 0
    cached_tokens: int = 0
    cost: float | None = None  # the provider's own charge (OpenRouter's usage.cost)

    def as_json(self) -> dict[str, Any]:
        extra: dict[str, Any] = {} if self.cost is None else {"cost": self.cost}
        return {
            **extra,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": self.cached_tokens, "audio_tokens": 0},
            "completion_tokens_details": {
                "reasoning_tokens": self.reasoning_tokens,
                "audio_tokens": 0,
                "accepted_prediction_tokens": 0,
                "rejected_prediction_tokens": 0,
            },
        }


def _deltas(items: str | Sequence[str]) -> tuple[str, ...]:
    """One delta per item; a str is one delta."""
    return (items,) if isinstance(items, str) else tuple(items)


@dataclass(frozen=True)
class Reply:
    """What the fake model answers to one chat request.

    Build one with the constructors (:meth:`text`, :meth:`reasoning`,
    :meth:`tool_calls`, :meth:`tokens`, :meth:`error`) and refine it with the
    modifiers, each returning a new Reply (:meth:`delayed`, :meth:`cut`,
    :meth:`stall`, :meth:`malformed`, :meth:`stream_error`,
    :meth:`with_usage`, :meth:`with_extra`, :meth:`with_headers`).
    """

    text_deltas: tuple[str, ...] = ()
    reasoning_deltas: tuple[str, ...] = ()
    reasoning_field: ReasoningField = "reasoning_content"
    calls: tuple[ToolCall, ...] = ()
    # Round-robin the calls' fragments instead of one call after another, so a
    # client that does not assemble by ``index`` gets caught.
    interleave_calls: bool = False
    finish_reason: str | None = None  # None: "tool_calls" if calls else "stop"
    usage: Usage | None = None  # None: estimated from the request and the deltas
    ttft: float = 0.0  # seconds before the first data line (after the headers)
    chunk_delay: float = 0.0  # seconds between data lines
    # An HTTP error instead of a completion.
    status: int = 200
    error_body: Any = None
    headers: tuple[tuple[str, str], ...] = ()
    # Faults in the stream; positions count data lines from 0 (0 = role chunk).
    cut_after: int | None = None
    cut_rst: bool = False
    stall_after: int | None = None
    stall_seconds: float | None = None  # None: stall until the client goes away
    malformed_at: int | None = None
    malformed_line: str = '{"id": "chatcmpl-broken", "choices": [{"delta": {"content": "x"'
    stream_error_at: int | None = None
    stream_error_body: Any = None
    # Provider-specific extras merged into every delta / every chunk.
    delta_extra: Mapping[str, Any] | None = None
    chunk_extra: Mapping[str, Any] | None = None
    model: str | None = None  # None: echo the request's model
    _cache: dict[str, Any] = field(
        default_factory=dict, init=False, repr=False, compare=False, hash=False
    )

    # ---- constructors

    @classmethod
    def text(cls, deltas: str | Sequence[str] = ("Hello", "!"), **options: Any) -> Reply:
        """Plain text, one content delta per item (a str is one delta)."""
        return cls(text_deltas=_deltas(deltas), **options)

    @classmethod
    def tokens(cls, n: int, word: str = "tok", **options: Any) -> Reply:
        """``n`` content deltas ``"tok0 "``, ``"tok1 "``, ... (benchmarks)."""
        return cls(text_deltas=tuple(f"{word}{i} " for i in range(n)), **options)

    @classmethod
    def reasoning(
        cls,
        reasoning: str | Sequence[str],
        text: str | Sequence[str] = (),
        *,
        field: ReasoningField = "reasoning_content",
        **options: Any,
    ) -> Reply:
        """Reasoning deltas (in ``field``) followed by text deltas."""
        return cls(
            reasoning_deltas=_deltas(reasoning), text_deltas=_deltas(text), reasoning_field=field, **options
        )

    @classmethod
    def tool_calls(
        cls,
        calls: ToolCall | Sequence[ToolCall],
        *,
        text: str | Sequence[str] = (),
        interleave: bool = False,
        **options: Any,
    ) -> Reply:
        """Tool calls (after optional text), ``finish_reason`` ``"tool_calls"``."""
        cs = (calls,) if isinstance(calls, ToolCall) else tuple(calls)
        return cls(calls=cs, text_deltas=_deltas(text), interleave_calls=interleave, **options)

    @classmethod
    def error(
        cls,
        status: int = 500,
        message: str = "The server had an error while processing your request.",
        type: str = "server_error",
        *,
        code: str | None = None,
        headers: Mapping[str, str] | None = None,
        body: Any = None,
        **options: Any,
    ) -> Reply:
        """An HTTP error with an OpenAI-style JSON body (or ``body`` verbatim)."""
        if body is None:
            body = {"error": {"message": message, "type": type, "param": None, "code": code}}
        hdrs = tuple((headers or {}).items())
        return cls(status=status, error_body=body, headers=hdrs, **options)

    # ---- modifiers

    def delayed(self, ttft: float | None = None, chunk_delay: float | None = None) -> Reply:
        """Seconds before the first data line and between data lines."""
        return dataclasses.replace(
            self,
            ttft=self.ttft if ttft is None else ttft,
            chunk_delay=self.chunk_delay if chunk_delay is None else chunk_delay,
        )

    def cut(self, after: int, *, rst: bool = False) -> Reply:
        """Close the TCP connection after ``after`` data lines, without ``[DONE]``
        and without the end of the chunked body. ``rst`` aborts with a RST."""
        return dataclasses.replace(self, cut_after=after, cut_rst=rst)

    def stall(self, after: int, seconds: float | None = None) -> Reply:
        """Stop sending after ``after`` data lines for ``seconds`` (None: until the
        client disconnects or the server stops), keeping the connection open."""
        return dataclasses.replace(self, stall_after=after, stall_seconds=seconds)

    def malformed(self, at: int, line: str | None = None) -> Reply:
        """Insert a ``data:`` line with invalid JSON before data line ``at``."""
        return dataclasses.replace(
            self, malformed_at=at, malformed_line=self.malformed_line if line is None else line
        )

    def stream_error(
        self,
        at: int,
        message: str = "The server had an error while processing your request.",
        type: str = "server_error",
        *,
        code: str | None = None,
        body: Any = None,
    ) -> Reply:
        """Replace data line ``at`` and the rest by ``data: {"error": {...}}``
        and end the HTTP response."""
        if body is None:
            body = {"error": {"message": message, "type": type, "param": None, "code": code}}
        return dataclasses.replace(self, stream_error_at=at, stream_error_body=body)

    def with_usage(
        self, prompt_tokens: int, completion_tokens: int, reasoning_tokens: int = 0,
        cached_tokens: int = 0, cost: float | None = None,
    ) -> Reply:
        return dataclasses.replace(
            self,
            usage=Usage(prompt_tokens, completion_tokens, reasoning_tokens, cached_tokens, cost),
        )

    def with_extra(
        self, delta: Mapping[str, Any] | None = None, chunk: Mapping[str, Any] | None = None
    ) -> Reply:
        """Provider metadata: ``delta`` merged into every delta, ``chunk`` into
        every chunk object (e.g. OpenRouter's ``provider``)."""
        return dataclasses.replace(self, delta_extra=delta, chunk_extra=chunk)

    def with_headers(self, headers: Mapping[str, str]) -> Reply:
        return dataclasses.replace(self, headers=self.headers + tuple(headers.items()))

    # ---- encoding

    @property
    def effective_finish_reason(self) -> str:
        if self.finish_reason is not None:
            return self.finish_reason
        return "tool_calls" if self.calls else "stop"

    def _call_id(self, i: int, call: ToolCall) -> str:
        return call.id or f"call_fake{i}"

    def _deltas(self) -> list[dict[str, Any]]:
        """The deltas after the role chunk and before the finish chunk."""
        extra = dict(self.delta_extra or {})
        out: list[dict[str, Any]] = [
            {self.reasoning_field: r, **extra} for r in self.reasoning_deltas
        ]
        out += [{"content": t, **extra} for t in self.text_deltas]
        per_call: list[list[dict[str, Any]]] = []
        for i, call in enumerate(self.calls):
            frags = call.fragments()
            seq = [
                {
                    "tool_calls": [
                        {
                            "index": i,
                            "id": self._call_id(i, call),
                            "type": "function",
                            "function": {"name": call.name, "arguments": ""},
                        }
                    ]
                }
            ]
            seq += [{"tool_calls": [{"index": i, "function": {"arguments": f}}]} for f in frags]
            per_call.append(seq)
        if self.interleave_calls:
            for group in itertools.zip_longest(*per_call):
                out += [d for d in group if d is not None]
        else:
            for seq in per_call:
                out += seq
        return out

    def _encoded_choices(self) -> list[bytes]:
        """Choice JSON of each stream line: role, deltas, finish. Cached."""
        cached = self._cache.get("choices")
        if cached is None:
            role: dict[str, Any] = {"role": "assistant", "content": "", "refusal": None}
            if self.calls and not self.text_deltas:
                role["content"] = None
            choices = [{"index": 0, "delta": role, "logprobs": None, "finish_reason": None}]
            choices += [
                {"index": 0, "delta": d, "logprobs": None, "finish_reason": None}
                for d in self._deltas()
            ]
            choices.append(
                {"index": 0, "delta": {}, "logprobs": None,
                 "finish_reason": self.effective_finish_reason}
            )
            cached = self._cache["choices"] = [_dumps(c) for c in choices]
        return cached

    def completion_tokens(self) -> int:
        return len(self.text_deltas) + len(self.reasoning_deltas) + sum(
            len(c.fragments()) for c in self.calls
        )

    def usage_for(self, request_body: bytes) -> Usage:
        if self.usage is not None:
            return self.usage
        # A rough, deterministic estimate: ~4 bytes of request per prompt token.
        return Usage(
            prompt_tokens=max(1, len(request_body) // 4),
            completion_tokens=self.completion_tokens(),
            reasoning_tokens=len(self.reasoning_deltas),
        )

    def message_json(self) -> dict[str, Any]:
        """The assistant message of a non-stream completion."""
        msg: dict[str, Any] = {
            "role": "assistant",
            "content": "".join(self.text_deltas) if (self.text_deltas or not self.calls) else None,
            "refusal": None,
        }
        if self.reasoning_deltas:
            msg[self.reasoning_field] = "".join(self.reasoning_deltas)
        if self.calls:
            msg["tool_calls"] = [
                {
                    "id": self._call_id(i, c),
                    "type": "function",
                    "function": {"name": c.name, "arguments": c.arguments_json()},
                }
                for i, c in enumerate(self.calls)
            ]
        if self.delta_extra:
            msg.update(self.delta_extra)
        return msg


# --------------------------------------------------------------------------- recording


@dataclass
class RecordedRequest:
    """One request as the server saw it."""

    method: str
    path: str
    headers: dict[str, str]  # lower-cased names; the last value wins
    raw_headers: list[tuple[str, str]]
    body: bytes
    json: Any  # parsed body, or None
    time: float = field(default_factory=time.monotonic)
    reply: Reply | None = None
    finished: bool = False  # the whole response was written
    disconnected: bool = False  # the client went away before the end

    @property
    def api_key(self) -> str | None:
        auth = self.headers.get("authorization", "")
        return auth[7:] if auth.lower().startswith("bearer ") else None


Responder = Callable[[Any], "Reply | str | None | Awaitable[Reply | str | None]"]


class _ClientGone(Exception):
    pass


# --------------------------------------------------------------------------- server


class FakeModel:
    """The fake server. Use as a context manager (background thread with its
    own event loop), or ``await fake.serve()`` on a loop you own (the CLI)."""

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        default: Reply | None = None,
        responder: Responder | None = None,
        models: Sequence[str] = ("fake-model",),
        api_key: str | None = None,
        record: bool = True,
    ) -> None:
        self.host = host
        self.port = port
        self.default: Reply = default if default is not None else Reply.text(["Hello", "!"])
        self.responder: Responder | None = responder
        self.models = list(models)
        # When set, requests without ``Authorization: Bearer <api_key>`` get a 401.
        self.api_key = api_key
        self.record = record
        self.requests: list[RecordedRequest] = []
        self.errors: list[BaseException] = []  # exceptions raised by a responder
        self.connections = 0  # TCP connections accepted (keep-alive checks)
        self._queue: deque[Reply] = deque()
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._served = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop_event: asyncio.Event | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._startup_error: BaseException | None = None
        self._conn_tasks: set[asyncio.Task[None]] = set()

    # ---- scripting

    def push(self, *replies: Reply | str) -> FakeModel:
        """Queue replies, consumed one per chat request (FIFO)."""
        for r in replies:
            self._queue.append(Reply.text([r]) if isinstance(r, str) else r)
        return self

    @property
    def pending(self) -> int:
        """Replies still queued."""
        return len(self._queue)

    def reset(self) -> None:
        """Forget requests, queued replies and responder errors."""
        with self._lock:
            self._queue.clear()
            self.requests.clear()
            self.errors.clear()
            self._served = 0

    @property
    def request_count(self) -> int:
        """Chat completion requests served (counted even with ``record=False``)."""
        return self._served

    @property
    def chat_requests(self) -> list[RecordedRequest]:
        return [r for r in self.requests if r.path.endswith("/chat/completions")]

    @property
    def last_request(self) -> RecordedRequest:
        return self.requests[-1]

    def wait_for_requests(self, n: int, timeout: float = 5.0) -> None:
        """Block until ``n`` chat requests have arrived."""
        deadline = time.monotonic() + timeout
        while self._served < n:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self._served} of {n} requests after {timeout}s")
            time.sleep(0.005)

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    # ---- lifecycle

    def start(self) -> FakeModel:
        """Serve in a daemon thread with its own event loop; returns when bound."""
        if self._thread is not None:
            return self
        self._ready.clear()
        self._thread = threading.Thread(target=self._thread_main, name="fakemodel", daemon=True)
        self._thread.start()
        self._ready.wait(10)
        if self._startup_error is not None:
            raise RuntimeError("fake model failed to start") from self._startup_error
        return self

    def stop(self) -> None:
        """Stop serving, dropping open connections (stalled streams included)."""
        loop, ev = self._loop, self._stop_event
        if loop is not None and ev is not None and not loop.is_closed():
            try:
                running = asyncio.get_running_loop()
            except RuntimeError:
                running = None
            if running is loop:
                ev.set()
            else:
                with contextlib.suppress(RuntimeError):
                    loop.call_soon_threadsafe(ev.set)
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(10)
            self._thread = None

    def __enter__(self) -> FakeModel:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    async def __aenter__(self) -> FakeModel:
        # Still its own thread and loop, so it never competes with the test's loop.
        return self.start()

    async def __aexit__(self, *exc: object) -> None:
        self.stop()

    def _thread_main(self) -> None:
        try:
            asyncio.run(self.serve())
        except BaseException as e:  # surfaced by start()
            self._startup_error = e
            self._ready.set()

    async def serve(self, ready: Callable[[FakeModel], None] | None = None) -> None:
        """Bind, call ``ready``, and serve until :meth:`stop`."""
        self._loop = asyncio.get_running_loop()
        self._stop_event = asyncio.Event()
        server = await asyncio.start_server(
            self._on_connection, self.host, self.port, backlog=1024, limit=1 << 20
        )
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        if ready is not None:
            ready(self)
        try:
            await self._stop_event.wait()
        finally:
            server.close()
            for task in list(self._conn_tasks):
                task.cancel()
            if self._conn_tasks:
                await asyncio.gather(*self._conn_tasks, return_exceptions=True)
            await server.wait_closed()
            self._loop = None

    # ---- connection handling

    async def _on_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._conn_tasks.add(task)
        self.connections += 1
        sock = writer.get_extra_info("socket")
        if sock is not None:
            # Small SSE writes must leave at once, not wait for Nagle.
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=1 << 20)
        abort = False
        try:
            while True:
                got = await self._read_request(conn, reader)
                if got is None:
                    return
                keep = await self._dispatch(conn, reader, writer, *got)
                if not keep:
                    abort = True
                    return
                if conn.our_state is h11.MUST_CLOSE or conn.their_state is not h11.DONE:
                    return
                conn.start_next_cycle()
        except h11.RemoteProtocolError as e:
            with contextlib.suppress(Exception):
                if conn.our_state in (h11.IDLE, h11.SEND_RESPONSE):
                    await self._send_json(conn, writer, e.error_status_hint,
                                          {"error": {"message": str(e), "type": "invalid_request_error"}})
        except (ConnectionError, _ClientGone, asyncio.CancelledError):
            pass
        finally:
            self._conn_tasks.discard(task)
            if not abort:
                with contextlib.suppress(Exception):
                    writer.close()

    async def _read_request(
        self, conn: h11.Connection, reader: asyncio.StreamReader
    ) -> tuple[h11.Request, bytes] | None:
        request: h11.Request | None = None
        body: list[bytes] = []
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                conn.receive_data(await reader.read(65536))
            elif isinstance(event, h11.Request):
                request = event
            elif isinstance(event, h11.Data):
                body.append(bytes(event.data))
            elif isinstance(event, h11.EndOfMessage):
                assert request is not None
                return request, b"".join(body)
            else:  # ConnectionClosed, or PAUSED which cannot happen mid-request
                return None

    async def _dispatch(
        self,
        conn: h11.Connection,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        request: h11.Request,
        body: bytes,
    ) -> bool:
        """Answer one request. Returns False if the connection was cut/aborted."""
        method = request.method.decode()
        path = request.target.decode().split("?", 1)[0]
        raw = [(k.decode(), v.decode("latin-1")) for k, v in request.headers]
        headers = {k.lower(): v for k, v in raw}
        parsed: Any = None
        bad_json = False
        if body:
            try:
                parsed = json.loads(body)
            except ValueError:
                bad_json = True
        is_chat = method == "POST" and path.endswith("/chat/completions")
        rec = RecordedRequest(method, path, headers, raw, body, parsed)
        if self.record:
            with self._lock:
                self.requests.append(rec)
        if is_chat:
            self._served += 1

        if self.api_key is not None and headers.get("authorization") != f"Bearer {self.api_key}":
            await self._send_json(conn, writer, 401, {"error": {
                "message": "Incorrect API key provided.", "type": "invalid_request_error",
                "param": None, "code": "invalid_api_key"}})
            return True
        if method == "GET" and path.endswith("/models"):
            await self._send_json(conn, writer, 200, {"object": "list", "data": [
                {"id": m, "object": "model", "created": 0, "owned_by": "fakemodel"}
                for m in self.models]})
            return True
        if not is_chat:
            await self._send_json(conn, writer, 404, {"error": {
                "message": f"Unknown path {method} {path}", "type": "invalid_request_error",
                "param": None, "code": "unknown_url"}})
            return True
        if bad_json or not isinstance(parsed, dict):
            await self._send_json(conn, writer, 400, {"error": {
                "message": "We could not parse the JSON body of your request.",
                "type": "invalid_request_error", "param": None, "code": None}})
            return True

        try:
            reply = await self._choose(parsed)
        except Exception as e:  # a broken responder must fail the test visibly
            self.errors.append(e)
            await self._send_json(conn, writer, 500, {"error": {
                "message": "fakemodel responder raised: " + "".join(
                    traceback.format_exception_only(type(e), e)).strip(),
                "type": "server_error", "param": None, "code": None}})
            return True
        rec.reply = reply
        try:
            if parsed.get("stream"):
                ok = await self._stream(conn, reader, writer, rec, reply, parsed)
            else:
                ok = await self._complete(conn, reader, writer, rec, reply, parsed)
        except (ConnectionError, _ClientGone):
            rec.disconnected = True
            raise
        rec.finished = ok
        return ok

    async def _choose(self, request_json: dict[str, Any]) -> Reply:
        try:
            return self._queue.popleft()
        except IndexError:
            pass
        if self.responder is not None:
            got = self.responder(request_json)
            if inspect.isawaitable(got):
                got = await got
            if isinstance(got, str):
                return Reply.text([got])
            if got is not None:
                return got
        return self.default

    # ---- responses

    async def _send_json(
        self,
        conn: h11.Connection,
        writer: asyncio.StreamWriter,
        status: int,
        obj: Any,
        extra_headers: Sequence[tuple[str, str]] = (),
        raw_body: bytes | None = None,
    ) -> None:
        data = raw_body if raw_body is not None else _dumps(obj)
        headers = [
            ("content-type", "application/json"),
            ("content-length", str(len(data))),
            ("x-request-id", f"req_fake{next(self._ids)}"),
            *extra_headers,
        ]
        writer.write(conn.send(h11.Response(status_code=status, headers=headers)))
        writer.write(conn.send(h11.Data(data=data)))
        writer.write(conn.send(h11.EndOfMessage()))
        await writer.drain()

    async def _stall(self, reader: asyncio.StreamReader, seconds: float | None) -> None:
        if seconds is not None:
            await asyncio.sleep(seconds)
            return
        # Forever: until the client closes (EOF) or the server stops (cancel).
        while await reader.read(65536):
            pass
        raise _ClientGone

    def _cut(self, writer: asyncio.StreamWriter, rst: bool) -> None:
        if rst:
            sock = writer.get_extra_info("socket")
            if sock is not None:
                # SO_LINGER 0 turns close() into a RST instead of a FIN.
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            writer.transport.abort()
        else:
            writer.close()

    async def _complete(
        self,
        conn: h11.Connection,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        rec: RecordedRequest,
        reply: Reply,
        req: dict[str, Any],
    ) -> bool:
        """A non-stream answer; stream faults map onto the whole response."""
        if reply.ttft > 0:
            await asyncio.sleep(reply.ttft)
        if reply.stall_after is not None:
            await self._stall(reader, reply.stall_seconds)
        if reply.cut_after is not None:
            await writer.drain()
            self._cut(writer, reply.cut_rst)
            return False
        if reply.status >= 400:
            await self._send_json(conn, writer, reply.status, reply.error_body, reply.headers)
            return True
        if reply.stream_error_at is not None:
            await self._send_json(conn, writer, 500, reply.stream_error_body, reply.headers)
            return True
        if reply.malformed_at is not None:
            await self._send_json(conn, writer, 200, None, reply.headers,
                                  raw_body=reply.malformed_line.encode())
            return True
        obj: dict[str, Any] = {
            "id": f"chatcmpl-fake{next(self._ids)}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": reply.model or req.get("model") or "fake-model",
            "choices": [{
                "index": 0,
                "message": reply.message_json(),
                "logprobs": None,
                "finish_reason": reply.effective_finish_reason,
            }],
            "usage": reply.usage_for(rec.body).as_json(),
            "system_fingerprint": "fp_fake",
            **(reply.chunk_extra or {}),
        }
        await self._send_json(conn, writer, 200, obj, reply.headers)
        return True

    async def _stream(
        self,
        conn: h11.Connection,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        rec: RecordedRequest,
        reply: Reply,
        req: dict[str, Any],
    ) -> bool:
        if reply.status >= 400:
            if reply.ttft > 0:
                await asyncio.sleep(reply.ttft)
            await self._send_json(conn, writer, reply.status, reply.error_body, reply.headers)
            return True

        writer.write(conn.send(h11.Response(status_code=200, headers=[
            ("content-type", "text/event-stream; charset=utf-8"),
            ("cache-control", "no-cache"),
            ("x-request-id", f"req_fake{next(self._ids)}"),
            *reply.headers,
        ])))
        await writer.drain()

        lines = self._stream_lines(reply, req, rec.body)
        if reply.malformed_at is not None:
            lines.insert(reply.malformed_at, b"data: " + reply.malformed_line.encode() + b"\n\n")
        if reply.stream_error_at is not None:
            lines = lines[: reply.stream_error_at]
            lines.append(b"data: " + _dumps(reply.stream_error_body) + b"\n\n")

        if reply.ttft > 0:
            await asyncio.sleep(reply.ttft)
        end = len(lines) if reply.cut_after is None else min(reply.cut_after, len(lines))
        start = 0
        if reply.stall_after is not None and reply.stall_after < end:
            await self._emit(conn, writer, lines[: reply.stall_after], reply.chunk_delay)
            await self._stall(reader, reply.stall_seconds)
            start = reply.stall_after
        await self._emit(conn, writer, lines[start:end], reply.chunk_delay)
        if reply.cut_after is not None:
            self._cut(writer, reply.cut_rst)
            return False
        writer.write(conn.send(h11.EndOfMessage()))
        await writer.drain()
        return True

    def _stream_lines(self, reply: Reply, req: dict[str, Any], body: bytes) -> list[bytes]:
        opts = req.get("stream_options")
        include_usage = isinstance(opts, dict) and bool(opts.get("include_usage"))
        model = reply.model or req.get("model") or "fake-model"
        head = (
            b'data: {"id":"chatcmpl-fake%d","object":"chat.completion.chunk","created":%d,"model":'
            % (next(self._ids), int(time.time()))
            + _dumps(model)
            + b',"system_fingerprint":"fp_fake"'
        )
        extra = b""
        for k, v in (reply.chunk_extra or {}).items():
            extra += b"," + _dumps(k) + b":" + _dumps(v)
        # With include_usage OpenAI puts "usage": null on every regular chunk.
        prefix = head + b',"choices":['
        suffix = (b'],"usage":null' if include_usage else b"]") + extra + b"}\n\n"
        lines = [prefix + c + suffix for c in reply._encoded_choices()]
        if include_usage:
            lines.append(
                head + b',"choices":[],"usage":' + _dumps(reply.usage_for(body).as_json())
                + extra + b"}\n\n"
            )
        lines.append(b"data: [DONE]\n\n")
        return lines

    async def _emit(
        self, conn: h11.Connection, writer: asyncio.StreamWriter, lines: list[bytes], delay: float
    ) -> None:
        """Write lines ``delay`` apart; lines already due go out in one write,
        so a loaded loop catches up instead of drifting."""
        if not lines:
            return
        if delay <= 0:
            writer.write(conn.send(h11.Data(data=b"".join(lines))))
            await writer.drain()
            return
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        pending = [lines[0]]
        for k in range(1, len(lines)):
            wait = t0 + k * delay - loop.time()
            if wait > 0:
                writer.write(conn.send(h11.Data(data=b"".join(pending))))
                await writer.drain()
                pending = []
                await asyncio.sleep(wait)
            pending.append(lines[k])
        writer.write(conn.send(h11.Data(data=b"".join(pending))))
        await writer.drain()


# --------------------------------------------------------------------------- throughput


def _proc_cpu_seconds(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


def measure_throughput(
    streams: int = 200, tokens: int = 200, rounds: int = 3, ttft_ms: float = 0.0,
    chunk_delay_ms: float = 0.0,
) -> dict[str, Any]:
    """Chunks/s read from a fake model running in its own process, with
    ``streams`` concurrent streams, by (a) a raw httpx line reader and (b) the
    ``openai`` client. Also reports the server's CPU time per chunk."""
    import httpx
    import openai

    from turns.tls import tls_context

    proc = subprocess.Popen(
        [sys.executable, "-m", "testbed.fakemodel", "--port", "0", "--tokens", str(tokens),
         "--ttft-ms", str(ttft_ms), "--chunk-delay-ms", str(chunk_delay_ms), "--no-record"],
        stdout=subprocess.PIPE, text=True,
        cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
    )
    try:
        assert proc.stdout is not None
        base_url = json.loads(proc.stdout.readline())["base_url"]
        body = {"model": "fake-model", "stream": True,
                "messages": [{"role": "user", "content": "hi"}]}

        async def raw_one(client: httpx.AsyncClient) -> int:
            n = 0
            async with client.stream("POST", base_url + "/chat/completions", json=body) as r:
                async for line in r.aiter_lines():
                    if line.startswith("data: ") and line != "data: [DONE]":
                        n += 1
            return n

        async def sdk_one(client: openai.AsyncOpenAI) -> int:
            n = 0
            stream = await client.chat.completions.create(
                model="fake-model", messages=[{"role": "user", "content": "hi"}], stream=True)
            async for _chunk in stream:
                n += 1
            return n

        async def run(kind: str) -> dict[str, float]:
            if kind == "raw":
                client: Any = httpx.AsyncClient(
                    limits=httpx.Limits(max_connections=streams * 2, max_keepalive_connections=streams * 2),
                    timeout=60, verify=tls_context())
                one: Any = raw_one
            else:
                client = openai.AsyncOpenAI(base_url=base_url, api_key="sk-fake", max_retries=0)
                one = sdk_one
            async with client:
                await asyncio.gather(*(one(client) for _ in range(streams)))  # warm-up
                cpu0, srv0, t0 = time.process_time(), _proc_cpu_seconds(proc.pid), time.perf_counter()
                chunks = 0
                for _ in range(rounds):
                    chunks += sum(await asyncio.gather(*(one(client) for _ in range(streams))))
                wall = time.perf_counter() - t0
                cpu = time.process_time() - cpu0
                srv1 = _proc_cpu_seconds(proc.pid)
            out = {"chunks": chunks, "seconds": round(wall, 3),
                   "chunks_per_s": round(chunks / wall),
                   "client_cpu_us_per_chunk": round(cpu / chunks * 1e6, 2)}
            if srv0 is not None and srv1 is not None:
                out["server_cpu_us_per_chunk"] = round((srv1 - srv0) / chunks * 1e6, 2)
            return out

        result = {"streams": streams, "tokens": tokens, "rounds": rounds,
                  "raw_httpx": asyncio.run(run("raw")), "openai": asyncio.run(run("sdk"))}
        result["openai_over_raw"] = round(
            result["openai"]["chunks_per_s"] / result["raw_httpx"]["chunks_per_s"], 3)
        return result
    finally:
        proc.terminate()
        proc.wait(10)


# --------------------------------------------------------------------------- CLI


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m testbed.fakemodel",
        description="A fake OpenAI-compatible model server (prints one JSON ready line).")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--tokens", type=int, default=50, help="content deltas per reply")
    p.add_argument("--chunk-delay-ms", type=float, default=0.0)
    p.add_argument("--ttft-ms", type=float, default=0.0)
    p.add_argument("--model", action="append", dest="models", help="model id(s) for /v1/models")
    p.add_argument("--api-key", default=None, help="require this bearer key")
    p.add_argument("--no-record", dest="record", action="store_false",
                   help="do not keep requests in memory (long benchmarks)")
    p.add_argument("--measure", action="store_true",
                   help="run measure_throughput() and print its JSON instead of serving")
    p.add_argument("--streams", type=int, default=200, help="with --measure")
    p.add_argument("--rounds", type=int, default=3, help="with --measure")
    args = p.parse_args(argv)

    if args.measure:
        print(json.dumps(measure_throughput(args.streams, args.tokens, args.rounds,
                                            args.ttft_ms, args.chunk_delay_ms), indent=2))
        return 0

    fake = FakeModel(
        host=args.host, port=args.port, models=args.models or ["fake-model"],
        api_key=args.api_key, record=args.record,
        default=Reply.tokens(args.tokens).delayed(args.ttft_ms / 1000, args.chunk_delay_ms / 1000),
    )

    def ready(f: FakeModel) -> None:
        print(json.dumps({"base_url": f.base_url, "port": f.port, "pid": os.getpid()}), flush=True)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, f.stop)

    asyncio.run(fake.serve(ready))
    return 0


if __name__ == "__main__":
    sys.exit(main())
