"""The step loop: stream a step, run its tool calls, repeat.

Chunks are read as raw SSE lines through the ``openai`` client (its base URL,
auth, retries with ``Retry-After`` and error types stay) and parsed with
``jiter``: building the SDK's pydantic objects per token would cost more than the
rest of the relay together.
"""

from __future__ import annotations

import re
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import anyio
import httpx2
import jiter
import openai

from plugins.api import Tool, ToolContext
from turns.context import ContextWindow, PromptTooLong, too_long
from turns.models import post_chat
from turns.outcomes import ModelFailed, TurnFailed, Usage
from turns.parts import PartsBuilder
from turns.provider_errors import error_text, failure_text
from turns.settings import TurnSettings
from turns.steps import StepCaller, single
from turns.toolcalls import ToolRun, call_tool

_KNOWN_DELTA_KEYS = frozenset(
    {"role", "content", "reasoning_content", "reasoning", "tool_calls", "refusal",
     "function_call", "annotations", "audio"}
)
_SECRETISH = re.compile(r"(sk-[A-Za-z0-9_\-]{6,}|Bearer\s+\S+)")
MAX_ERROR = 500
DRAIN_SECONDS = 0.1  # after [DONE], for the body's end (turns.generate._drain)
# A burst of chunks already read (a provider or a proxy that sends them together) is
# parsed without the loop running anything else: 200 chunks held the first delta back
# from its subscribers ~3 ms, and every other turn waited as long. When a data line follows
# the one before within RELAY_GAP, it was read without a wait, so the subscribers of what
# was published since have not run: the step lets the loop run first, at most once per
# RELAY_SLICE (0.5 ms: a [cluster] mirror's pipelined XADD needs a few turns of the loop;
# with 2 ms the stream read on another instance was 1–2 ms later, README "Benchmarks").
# Lines that were waited for let the loop run anyway: no pass of the loop is added for them.
RELAY_GAP = 0.0002
RELAY_SLICE = 0.0005


class _TooLong(TurnFailed, PromptTooLong):
    """A refusal the context window retries once (and a failure like any other)."""


@dataclass
class _Call:
    id: str = ""
    name: str = ""
    arguments: list[str] = field(default_factory=list)
    provider_data: dict[str, Any] | None = None


def scrub(message: str, secrets: Sequence[str]) -> str:
    """A short error message with every secret we know of, and anything key-shaped, removed."""
    for secret in secrets:
        if secret:
            message = message.replace(secret, "[redacted]")
    message = _SECRETISH.sub("[redacted]", message)
    return message if len(message) <= MAX_ERROR else message[: MAX_ERROR - 1] + "…"


async def run_steps(
    client: openai.AsyncOpenAI,
    *,
    model: str,
    messages: list[dict[str, Any]],
    tools: Sequence[Tool],
    effort: str | None,
    settings: TurnSettings,
    parts: PartsBuilder,
    tool_context: ToolContext,
    usage: Usage,
    window: ContextWindow | None = None,
    tool_run: ToolRun | None = None,
    caller: StepCaller | None = None,
) -> None:
    """Run steps until one makes no tool call or ``max_steps`` is reached.

    Raises TurnFailed (with an unscrubbed message: the caller scrubs) on a model
    or loop-guard failure; cancellation comes from the caller's cancel scope.
    ``caller`` makes each step's model call (events, retries, fallbacks, usage rows);
    without one, ``client`` and ``model`` answer every step.
    """
    if caller is None:
        caller = StepCaller(single(client, model), None)
    by_name = {t.name: t for t in tools}
    base: dict[str, Any] = {
        "model": model,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if tools:
        base["tools"] = [t.spec() for t in tools]
    if effort:
        base["reasoning_effort"] = effort
    previous: list[tuple[str, str]] | None = None

    def stream(client: openai.AsyncOpenAI, body: dict[str, Any], step_usage: Usage) -> Any:
        return _stream_step(client, body, parts, step_usage)

    for step in range(settings.max_steps):
        first_part = len(parts.parts)
        call = partial(_call_step, caller, step, base, stream, usage)
        if window is None:
            calls = await call(messages)
        else:  # the prompt fitted to the model's context (turns.context)
            calls = await window.step(call, messages, lambda: usage.input)
        parts.end_run()
        if not calls:
            return
        signature = [(c.name, "".join(c.arguments)) for c in calls]
        if signature == previous:
            raise TurnFailed(
                f"stopped a loop: the model called {signature[0][0]!r} with the same input "
                "as in the step before"
            )
        previous = signature
        step_text = "".join(
            p["text"] for p in parts.parts[first_part:] if p["$type"].endswith("#textPart")
        )
        call_parts = []
        for call, (name, arguments) in zip(calls, signature, strict=True):
            part = parts.tool_call(call.id, name, arguments, call.provider_data)
            call_parts.append((len(parts.parts) - 1, part))
        tool_run = tool_run or ToolRun()
        await tool_run.request(call_parts, by_name)  # the calls that wait for approval
        messages = [
            *messages,
            {
                "role": "assistant",
                "content": step_text or None,
                "tool_calls": [
                    {"id": c.id, "type": "function", "function": {"name": n, "arguments": a}}
                    for c, (n, a) in zip(calls, signature, strict=True)
                ],
            },
        ]
        results = await _run_tools(
            calls, signature, by_name, tool_context, settings, tool_run, caller
        )
        for call, (output, is_error) in zip(calls, results, strict=True):
            part = parts.tool_result(call.id, output, is_error)
            messages.append({"role": "tool", "tool_call_id": call.id, "content": part["output"]})


async def _call_step(
    caller: StepCaller, step: int, base: dict[str, Any], stream: Any, usage: Usage,
    messages: list[dict[str, Any]],
) -> list[_Call]:
    return await caller.call(step, {**base, "messages": messages}, stream, usage)


@asynccontextmanager
async def _chat_stream(client: openai.AsyncOpenAI, body: dict[str, Any]) -> AsyncIterator[httpx2.Response]:
    """POST the chat body through the client (its base URL, auth, retries, error types),
    the raw streamed response back, as ``client.post`` would (``post_chat``);
    ``chat.completions.create`` would first run every field of the body, each message of
    the prompt, through the SDK's TypedDict transform, which gives chat params (no
    aliases, no formats) back unchanged, at ~0.3 ms a call (docs/performance-history.md, fourth
    round)."""
    response = await post_chat(client, body, httpx2.Response, stream=True)
    try:
        yield response
    finally:
        await response.aclose()


async def _stream_step(
    client: openai.AsyncOpenAI, body: dict[str, Any], parts: PartsBuilder, usage: Usage
) -> list[_Call]:
    calls: dict[int, _Call] = {}
    first_part = len(parts.parts)
    try:
        async with _chat_stream(client, body) as response:
            lines = _lines(response)
            relayed = parts.streamed  # deltas published before the loop last ran
            line_at = relay_at = 0.0
            async for line in lines:
                if not line.startswith(b"data:"):
                    continue
                now = time.monotonic()
                if parts.streamed != relayed:
                    if now - line_at > RELAY_GAP:
                        relayed = parts.streamed  # this line was waited for: the loop ran
                    elif now >= relay_at:
                        relayed, relay_at = parts.streamed, now + RELAY_SLICE
                        await anyio.lowlevel.checkpoint()  # a burst: the subscribers first
                line_at = now
                data = line[5:].strip()
                if data == b"[DONE]":
                    await _drain(lines)
                    break
                try:
                    chunk = _chunk(data)
                except ValueError:
                    raise TurnFailed("the model sent a malformed chunk") from None
                if not isinstance(chunk, dict):
                    raise TurnFailed("the model sent a malformed chunk")
                if chunk.get("error"):
                    raise TurnFailed(f"the model failed: {error_text(chunk['error'])}")
                if chunk.get("usage"):
                    usage.add(chunk["usage"], chunk.get("model"))
                for choice in chunk.get("choices") or ():
                    delta = choice.get("delta")
                    if delta:
                        _apply_delta(delta, parts, calls)
    except (ModelFailed, _TooLong):
        raise
    except (TurnFailed, openai.APIError, httpx2.HTTPError) as exc:
        if isinstance(exc, openai.APIStatusError) and too_long(exc.status_code, exc.body):
            # Not a fallback's case: the context window retries it with half the budget.
            raise _TooLong(failure_text(exc)) from None
        # Nothing of this call reached the parts yet: a fallback model may take over.
        started = bool(calls) or len(parts.parts) > first_part
        raise ModelFailed(failure_text(exc), started=started) from None
    return [calls[i] for i in sorted(calls)]


def _chunk(data: bytes) -> Any:
    # Keys only: jiter's default also caches values, and a turn's ids, models and texts
    # then stay alive in its 16k-entry cache (~1.5 MB of RSS).
    try:
        return jiter.from_json(data, cache_mode="keys")
    except ValueError:
        # Bytes that are not UTF-8 become U+FFFD, as httpx's text decoding made them.
        text = data.decode(errors="replace")
        if text.encode() == data:
            raise
        return jiter.from_json(text.encode(), cache_mode="keys")


async def _lines(response: httpx2.Response) -> AsyncIterator[bytes]:
    """The body's lines, as bytes without their ends (``\\n``, ``\\r\\n`` or ``\\r``, as
    SSE has them). SSE is UTF-8 whatever the headers say, and a data line goes to
    ``jiter`` as bytes: httpx's ``aiter_lines`` read the charset from the
    ``Content-Type`` through the ``email`` package, decoded each chunk to text and split
    it in two more generators, and the text was encoded again for the parser."""
    rest = b""
    async for chunk in response.aiter_bytes():
        lines = (rest + chunk if rest else chunk).splitlines(keepends=True)
        rest = lines.pop() if not lines[-1].endswith((b"\n", b"\r")) else b""
        for line in lines:
            yield line.rstrip(b"\r\n")
    if rest:
        yield rest


async def _drain(lines: AsyncIterator[bytes]) -> None:
    """Read what follows ``[DONE]`` (the body's end, at once from any real server): a
    response read to its end keeps its connection in the pool, one left unread is
    closed, and the next model call would connect again. A server that keeps the
    stream open past ``[DONE]`` gets ``DRAIN_SECONDS``, then its connection is dropped."""
    with anyio.move_on_after(DRAIN_SECONDS):
        async for _ in lines:
            pass



def _apply_delta(delta: dict[str, Any], parts: PartsBuilder, calls: dict[int, _Call]) -> None:
    reasoning = delta.get("reasoning_content") or delta.get("reasoning")
    if reasoning and isinstance(reasoning, str):
        parts.reasoning(reasoning)
    text = delta.get("content") or delta.get("refusal")
    if text and isinstance(text, str):
        parts.text(text)
    if len(delta) > 1 and not _KNOWN_DELTA_KEYS.issuperset(delta):
        parts.provider_data({k: v for k, v in delta.items() if k not in _KNOWN_DELTA_KEYS})
    tool_calls = delta.get("tool_calls")
    if tool_calls:
        for fragment in tool_calls:
            call = calls.setdefault(fragment.get("index", 0), _Call())
            if fragment.get("id"):
                call.id = fragment["id"]
            function = fragment.get("function") or {}
            if function.get("name"):
                call.name += function["name"]
            if function.get("arguments"):
                call.arguments.append(function["arguments"])
            extra = {k: v for k, v in fragment.items() if k not in ("index", "id", "type", "function")}
            if extra:
                call.provider_data = {**(call.provider_data or {}), **extra}
    for annotation in delta.get("annotations") or ():
        citation = annotation.get("url_citation") if isinstance(annotation, dict) else None
        if isinstance(citation, dict) and isinstance(citation.get("url"), str):
            parts.source(citation["url"], citation.get("title"))





async def _run_tools(
    calls: list[_Call],
    signature: list[tuple[str, str]],
    by_name: Mapping[str, Tool],
    context: ToolContext,
    settings: TurnSettings,
    tool_run: ToolRun,
    caller: StepCaller | None = None,
) -> list[tuple[Any, bool]]:
    """Run a step's tool calls in parallel, at most ``max_parallel_tools`` at a time."""
    results: list[tuple[Any, bool]] = [("", True)] * len(calls)
    limit = anyio.Semaphore(settings.max_parallel_tools)

    async def run(i: int, name: str, arguments: str) -> None:
        tool = by_name.get(name)
        # An approval wait holds no slot: the calls that may run meanwhile do.
        if (refusal := await tool_run.refused(i, tool)) is not None:
            results[i] = (refusal, True)
            return
        async with limit:
            span = caller.tool_span(name, calls[i].id, arguments) if caller else None
            try:
                output, is_error, outcome = await call_tool(
                    tool, name, arguments, context, settings, calls[i].id
                )
                tool_run.observe(tool, outcome)
                results[i] = (output, is_error)
            finally:
                if span is not None:
                    span.end(*results[i])

    async with anyio.create_task_group() as tg:
        for i, (name, arguments) in enumerate(signature):
            tg.start_soon(run, i, name, arguments)
    return results
