"""The branch from the root to the user message -> instructions + chat messages."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from functools import lru_cache
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from recordstore import RecordStore
from recordstore.vocabulary import FILE_PART as FILE
from recordstore.vocabulary import IMAGE_PART as IMAGE
from recordstore.vocabulary import PLAIN_CONTENT as PLAIN
from turns.attachments import Attachments
from turns.parts import REASONING, TEXT, TOOL_CALL, TOOL_RESULT
from turns.settings import DEFAULT_SYSTEM_PROMPT, TurnSettings


def branch(messages: Mapping[str, dict[str, Any]], user_key: str) -> list[dict[str, Any]]:
    """Message values from the root down to ``user_key`` (siblings and other branches left out)."""
    chain: list[dict[str, Any]] = []
    seen: set[str] = set()
    key: str | None = user_key
    while key is not None and key in messages and key not in seen:
        seen.add(key)
        value = messages[key]
        chain.append(value)
        parent = value.get("parent")
        key = parent if isinstance(parent, str) else None
    chain.reverse()
    return chain


def user_zone(preferences: Mapping[str, Any] | None) -> ZoneInfo:
    name = (preferences or {}).get("timezone")
    if isinstance(name, str) and name:
        try:
            return ZoneInfo(name)
        except (ZoneInfoNotFoundError, ValueError):
            pass
    return ZoneInfo("UTC")


def instructions(
    settings: TurnSettings,
    preferences: Mapping[str, Any] | None,
    info: Mapping[str, Any] | None,
    now: datetime | None = None,
) -> str:
    """Base prompt (placeholders filled in the user's zone), custom instructions, system prompt."""
    template = DEFAULT_SYSTEM_PROMPT if settings.system_prompt is None else settings.system_prompt
    minute = int((now or datetime.now(UTC)).timestamp() // 60)
    base = _filled(template, settings.app_name, user_zone(preferences), minute)
    pieces = [base, (preferences or {}).get("customInstructions"), (info or {}).get("systemPrompt")]
    return "\n\n".join(p for p in pieces if isinstance(p, str) and p.strip())


@lru_cache(maxsize=64)
def _filled(template: str, app_name: str, zone: ZoneInfo, minute: int) -> str:
    """``template`` with its placeholders filled in for one minute (since the epoch) in
    ``zone``: every turn of that minute and zone shares it, where each one converted the
    time and formatted it twice (~8 µs a turn)."""
    local = datetime.fromtimestamp(minute * 60, zone)
    for name, value in (
        ("appName", app_name),
        ("date", local.strftime("%A, %d %B %Y")),
        ("time", local.strftime("%H:%M")),
        ("timezone", zone.key),
    ):
        template = template.replace("{{" + name + "}}", value)
    return template


async def chat_messages(
    store: RecordStore,
    did: str,
    chain: list[dict[str, Any]],
    system: str,
    attachments: Attachments | None = None,
) -> list[dict[str, Any]]:
    """OpenAI Chat Completions messages for the branch. Reasoning is not replayed."""
    head, groups = await chat_groups(store, did, chain, system, attachments)
    return [*head, *(m for _, messages in groups for m in messages)]


async def chat_groups(
    store: RecordStore,
    did: str,
    chain: list[dict[str, Any]],
    system: str,
    attachments: Attachments | None = None,
) -> tuple[list[dict[str, Any]], list[tuple[int, list[dict[str, Any]]]]]:
    """(instructions, [(index in ``chain``, the chat messages that record became)])."""
    head: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
    readable = [(i, value, _plain_parts(value)) for i, value in enumerate(chain)]
    if attachments is None:
        attachments = Attachments(store, did)
    await attachments.prepare(
        [
            part
            for _, value, parts in readable
            if parts is not None and value.get("role") == "user"
            for part in parts
            if part.get("$type") in (IMAGE, FILE)
        ]
    )
    groups: list[tuple[int, list[dict[str, Any]]]] = []
    for i, value, parts in readable:
        if parts is None:
            continue
        role = value.get("role")
        if role == "user":
            content = _user_content(parts, attachments)
            if content:
                groups.append((i, [{"role": "user", "content": content}]))
        elif role == "assistant" and value.get("status") in ("complete", "cancelled"):
            messages = _assistant_messages(parts)
            if messages:
                groups.append((i, messages))
    return head, groups


def branch_keys(chain: list[dict[str, Any]], user_key: str) -> list[str]:
    """The key of each message of ``chain`` (each names its parent; the last is ours)."""
    keys = [str(value.get("parent")) for value in chain[1:]]
    return [*keys, user_key]


def _plain_parts(value: Mapping[str, Any]) -> list[dict[str, Any]] | None:
    content = value.get("content")
    if not isinstance(content, dict) or content.get("$type") != PLAIN:
        return None  # encrypted or unknown content: turnd cannot read it
    parts = content.get("parts")
    return [p for p in parts if isinstance(p, dict)] if isinstance(parts, list) else []


def _user_content(parts: list[dict[str, Any]], attachments: Attachments) -> Any:
    content: list[dict[str, Any]] = []
    for part in parts:
        kind = part.get("$type")
        if kind == TEXT and isinstance(part.get("text"), str):
            content.append({"type": "text", "text": part["text"]})
        elif kind in (IMAGE, FILE):
            prepared = attachments.get(part)
            if prepared is not None:
                content.append(prepared)
    if len(content) == 1 and content[0]["type"] == "text":
        return content[0]["text"]
    return content


def _assistant_messages(parts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Text, tool calls and their results, in order; calls without a result are dropped."""
    results = {p.get("callId"): p for p in parts if p.get("$type") == TOOL_RESULT}
    out: list[dict[str, Any]] = []
    current: dict[str, Any] = {"role": "assistant", "content": ""}
    pending: list[dict[str, Any]] = []

    def flush() -> None:
        nonlocal current, pending
        if current["content"] or current.get("tool_calls"):
            current["content"] = current["content"] or None
            out.append(current)
            out.extend(pending)
        current, pending = {"role": "assistant", "content": ""}, []

    for part in parts:
        kind = part.get("$type")
        if kind == TEXT and isinstance(part.get("text"), str):
            if pending:
                flush()
            current["content"] += part["text"]
        elif kind == TOOL_CALL and part.get("callId") in results:
            if pending:
                flush()
            current.setdefault("tool_calls", []).append(
                {
                    "id": part["callId"],
                    "type": "function",
                    "function": {"name": part.get("tool", ""), "arguments": part.get("input", "")},
                }
            )
            result = results[part["callId"]]
            pending.append(
                {"role": "tool", "tool_call_id": part["callId"], "content": result.get("output", "")}
            )
        elif kind == REASONING:
            continue  # earlier reasoning is not replayed to an OpenAI-compatible model
    flush()
    return out
