"""Every record value turnd writes, built in one place.

Pure functions: they take what a record says and return its value; the callers
write them (create-only for a claim or an error reply, compare-and-swap for a
final record).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from recordstore import CONVERSATION, CONVERSATION_REF, INFO, MESSAGE
from recordstore.times import now_iso
from turns.prompt import PLAIN

MAX_ERROR_TEXT = 3000  # the lexicon's maxLength of a message's `error`


def conversation_uri(did: str, skey: str) -> str:
    return f"at://{did}/space/{CONVERSATION}/{skey}"


def conversation_info(title: str | None, system_prompt: str | None) -> dict[str, Any]:
    info: dict[str, Any] = {"$type": INFO, "createdAt": now_iso()}
    if title:
        info["title"] = title
        info["titleSource"] = "user"
    if system_prompt:
        info["systemPrompt"] = system_prompt
    return info


def conversation_ref(
    did: str, skey: str, existing: Mapping[str, Any] | None, title: str | None
) -> dict[str, Any]:
    """The settings space's pointer to a conversation, touched now (the listing sorts by it)."""
    value: dict[str, Any] = dict(existing) if existing else {
        "$type": CONVERSATION_REF,
        "conversation": conversation_uri(did, skey),
    }
    if title:
        value["title"] = title
    value["updatedAt"] = now_iso()
    return value


def user_message(
    parts: list[dict[str, Any]], parent: str | None, generation: Mapping[str, Any] | None
) -> dict[str, Any]:
    value: dict[str, Any] = {
        "$type": MESSAGE,
        "role": "user",
        "content": {"$type": PLAIN, "parts": parts},
        "createdAt": now_iso(),
    }
    if parent is not None:
        value["parent"] = parent
    if generation is not None:
        value["generation"] = {
            **{k: v for k, v in generation.items() if v is not None},
            "attempt": 0,
        }
    return value


def placeholder(
    user_key: str, model: Mapping[str, str], effort: str | None, claim: str
) -> dict[str, Any]:
    """The claim: a pending reply. ``claim`` makes two runners' placeholders differ."""
    value: dict[str, Any] = {
        "$type": MESSAGE,
        "role": "assistant",
        "parent": user_key,
        "content": {"$type": PLAIN, "parts": []},
        "model": dict(model),
        "status": "pending",
        "claim": claim,
        "createdAt": now_iso(),
    }
    if effort:
        value["effort"] = effort
    return value


def error_reply(user_key: str, message: str) -> dict[str, Any]:
    """A reply that is an error from the start (a request the trigger rules refuse)."""
    return {
        "$type": MESSAGE,
        "role": "assistant",
        "parent": user_key,
        "content": {"$type": PLAIN, "parts": []},
        "status": "error",
        "error": message[:MAX_ERROR_TEXT],
        "createdAt": now_iso(),
    }


def final(
    placeholder: Mapping[str, Any],
    parts: list[dict[str, Any]],
    status: str,
    error: str | None,
    usage: dict[str, int] | None,
) -> dict[str, Any]:
    """The placeholder, finished: its parts, status, error and usage; the claim dropped."""
    record = {**placeholder, "content": {"$type": PLAIN, "parts": parts}}
    del record["claim"]
    record["status"] = status
    if error:
        record["error"] = error
    if usage:
        record["usage"] = usage
    return record


def failed(record: Mapping[str, Any], error: str) -> dict[str, Any]:
    """A final record turned into an error (a hook raised), its content kept."""
    return {**record, "status": "error", "error": error}


def unstorable(record: Mapping[str, Any], reason: object) -> dict[str, Any]:
    """What is written when the final record itself cannot be stored."""
    return {
        **record,
        "content": {"$type": PLAIN, "parts": []},
        "status": "error",
        "error": f"the reply could not be stored: {reason}"[:MAX_ERROR_TEXT],
    }


def interrupted(placeholder: Mapping[str, Any], reason: str = "interrupted") -> dict[str, Any]:
    """A claim whose runner stopped before finishing (found at the next start), or one
    too old for any live turn to own (``reason="abandoned"``).

    A tool call that was waiting for approval (the placeholder rewritten with its parts)
    is marked ``timedout``: its wait is over and no decision can reach it any more, so no
    client may be left offering an Approve button that answers 409.
    """
    value = {k: v for k, v in placeholder.items() if k != "claim"}
    value.update(status="error", error=reason)
    content = value.get("content")
    parts = content.get("parts") if isinstance(content, Mapping) else None
    if isinstance(parts, list) and any(_waiting(p) for p in parts):
        parts = [{**p, "approval": UNDECIDED} if _waiting(p) else p for p in parts]
        value["content"] = {**content, "parts": parts}
    return value


UNDECIDED = "timedout"  # an approval wait that ended with no decision, however it ended


def _waiting(part: object) -> bool:
    return isinstance(part, Mapping) and part.get("approval") == "pending"


def status_event(record: Mapping[str, Any], model: Mapping[str, str]) -> dict[str, Any]:
    """The stream's last event: the final status, as the record says it."""
    event: dict[str, Any] = {"status": record["status"], "model": model}
    for name in ("error", "usage"):
        if name in record:
            event[name] = record[name]
    return event
