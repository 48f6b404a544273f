"""The branch from the root to the user message -> instructions + chat messages."""

from __future__ import annotations

import base64
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from recordstore import RecordStore, StoreError
from turns.parts import FILE, IMAGE, REASONING, TEXT, TOOL_CALL, TOOL_RESULT
from turns.settings import DEFAULT_SYSTEM_PROMPT, TurnSettings

PLAIN = "network.sharedcomputer.chat.defs#plainContent"


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
    zone = user_zone(preferences)
    local = (now or datetime.now(UTC)).astimezone(zone)
    base = DEFAULT_SYSTEM_PROMPT if settings.system_prompt is None else settings.system_prompt
    for name, value in (
        ("appName", settings.app_name),
        ("date", local.strftime("%A, %d %B %Y")),
        ("time", local.strftime("%H:%M")),
        ("timezone", zone.key),
    ):
        base = base.replace("{{" + name + "}}", value)
    pieces = [base, (preferences or {}).get("customInstructions"), (info or {}).get("systemPrompt")]
    return "\n\n".join(p for p in pieces if isinstance(p, str) and p.strip())


async def chat_messages(
    store: RecordStore, did: str, chain: list[dict[str, Any]], system: str
) -> list[dict[str, Any]]:
    """OpenAI Chat Completions messages for the branch. Reasoning is not replayed."""
    out: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
    for value in chain:
        parts = _plain_parts(value)
        if parts is None:
            continue
        role = value.get("role")
        if role == "user":
            content = await _user_content(store, did, parts)
            if content:
                out.append({"role": "user", "content": content})
        elif role == "assistant" and value.get("status") in ("complete", "cancelled"):
            out.extend(_assistant_messages(parts))
    return out


def _plain_parts(value: Mapping[str, Any]) -> list[dict[str, Any]] | None:
    content = value.get("content")
    if not isinstance(content, dict) or content.get("$type") != PLAIN:
        return None  # encrypted or unknown content: turnd cannot read it
    parts = content.get("parts")
    return [p for p in parts if isinstance(p, dict)] if isinstance(parts, list) else []


async def _user_content(store: RecordStore, did: str, parts: list[dict[str, Any]]) -> Any:
    content: list[dict[str, Any]] = []
    for part in parts:
        kind = part.get("$type")
        if kind == TEXT and isinstance(part.get("text"), str):
            content.append({"type": "text", "text": part["text"]})
        elif kind == IMAGE:
            blob = part.get("image") or {}
            data = await _blob(store, did, blob)
            if data is None:
                content.append({"type": "text", "text": "[an image that could not be loaded]"})
            else:
                url = f"data:{blob.get('mimeType', 'image/png')};base64,{base64.b64encode(data).decode()}"
                content.append({"type": "image_url", "image_url": {"url": url}})
        elif kind == FILE:
            content.append({"type": "text", "text": await _file_text(store, did, part)})
    if len(content) == 1 and content[0]["type"] == "text":
        return content[0]["text"]
    return content


async def _file_text(store: RecordStore, did: str, part: Mapping[str, Any]) -> str:
    name = part.get("name") if isinstance(part.get("name"), str) else "attachment"
    extracted = part.get("extracted")
    text = None
    if isinstance(extracted, dict) and isinstance(extracted.get("text"), dict):
        data = await _blob(store, did, extracted["text"])
        text = data.decode("utf-8", "replace") if data is not None else None
    if text is None:
        return f"File: {name}\n\n(no text could be extracted from this file)"
    return f"File: {name}\n\n{text}"


async def _blob(store: RecordStore, did: str, ref: Mapping[str, Any]) -> bytes | None:
    link = ref.get("ref")
    cid = link.get("$link") if isinstance(link, dict) else None
    if not isinstance(cid, str):
        return None
    try:
        return await store.get_blob(did, cid)
    except StoreError:
        return None


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
