"""Summaries of a branch's left-out prefix (SPEC §15), kept as records in the conversation.

A summary is a ``network.sharedcomputer.chat.summary`` record at the key of the last
message it covers, so any later turn on a branch through that message finds it
(and a sibling branch, which does not pass through it, does not). turnd keeps no
content of its own: the summary lives in the store next to the messages.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from typing import Any

import openai

from recordstore import SUMMARY, RecordStore, StoreError
from recordstore.times import now_iso
from turns.context import summary_room
from turns.provider_errors import failure_text, name_provider, without_keys

log = logging.getLogger("turnd.turns")

MAX_SUMMARY_TOKENS = 512
MAX_SUMMARY_CHARS = 100_000  # the lexicon's limit
_INSTRUCTIONS = (
    "You summarise the earlier part of a conversation between a user and an assistant so "
    "that the assistant can go on without it. Keep every fact, decision, name, number and "
    "open question that may matter later; leave out pleasantries. Write at most a few "
    "short paragraphs, in the conversation's language."
)



def transcript(messages: Sequence[dict[str, Any]], limit: int) -> str:
    """Chat messages as plain text for the summary model; the newest ``limit`` chars."""
    lines: list[str] = []
    for message in messages:
        role = message.get("role", "?")
        content = message.get("content")
        if isinstance(content, list):
            pieces = []
            for part in content:
                if isinstance(part, dict) and isinstance(part.get("text"), str):
                    pieces.append(part["text"])
                elif isinstance(part, dict) and part.get("type") == "image_url":
                    pieces.append("[an image]")
            content = "\n".join(pieces)
        if content:
            lines.append(f"{role}: {content}")
        for call in message.get("tool_calls") or ():
            function = call.get("function") or {}
            lines.append(f"{role} called {function.get('name')}({function.get('arguments', '')})")
    text = "\n\n".join(lines)
    return text[-limit:] if len(text) > limit else text


class BranchSummaries:
    """``turns.context.Summaries`` for one turn: the branch's records and a summary model."""

    def __init__(
        self,
        store: RecordStore,
        did: str,
        skey: str,
        branch_keys: Sequence[str],
        client: openai.AsyncOpenAI,
        model: dict[str, str],
    ) -> None:
        self._store = store
        self._did = did
        self._skey = skey
        self._branch = set(branch_keys)
        self._client = client
        self._model = model
        self.usage: list[dict[str, Any]] = []  # the summary calls' reported usage

    @property
    def model(self) -> dict[str, str]:
        return dict(self._model)

    async def existing(self) -> dict[str, str]:
        """Summaries whose covered message is on this branch (read once, when needed)."""
        found: dict[str, str] = {}
        cursor: str | None = None
        try:
            while True:
                page, cursor = await self._store.list_records(
                    self._did, self._skey, SUMMARY, cursor=cursor, limit=100
                )
                for record in page:
                    value = record.value
                    if (
                        record.key in self._branch
                        and value.get("covers") == record.key
                        and isinstance(value.get("text"), str)
                    ):
                        found[record.key] = value["text"]
                if cursor is None or not page:
                    return found
        except StoreError as exc:
            log.warning("could not read the summaries of %s: %s", self._skey, exc)
            return found

    async def summarize(
        self, prior: str | None, messages: Sequence[dict[str, Any]], covers: str, budget: int
    ) -> str | None:
        # What the summary model reads is bounded by the turn's own budget.
        room = min(MAX_SUMMARY_TOKENS, summary_room(budget))
        limit = max(4000, (budget - room) * 3)
        body = transcript(messages, limit)
        if prior:
            body = f"Summary of what came before:\n{prior}\n\nThen:\n\n{body}"
        try:
            response = await self._client.chat.completions.create(
                model=self._model["id"],
                messages=[
                    {"role": "system", "content": _INSTRUCTIONS},
                    {"role": "user", "content": body},
                ],
                max_tokens=room,
                stream=False,
            )
            text = (response.choices[0].message.content or "").strip() if response.choices else ""
            if response.usage is not None:
                self.usage.append(json.loads(response.usage.model_dump_json()))
        except openai.OpenAIError as exc:
            reason = without_keys(
                name_provider(failure_text(exc), self._model["provider"], self._client.base_url),
                [self._client.api_key],
            )
            log.warning("summary of %s/%s failed: %s", self._skey, covers, reason)
            return None
        if not text:
            return None
        text = text[:MAX_SUMMARY_CHARS]
        record = {
            "$type": SUMMARY,
            "covers": covers,
            "text": text,
            "model": dict(self._model),
            "createdAt": now_iso(),
        }
        try:
            await self._store.put_record(self._did, self._skey, SUMMARY, covers, record)
        except StoreError as exc:
            log.warning("could not keep the summary of %s/%s: %s", self._skey, covers, exc)
        return text
