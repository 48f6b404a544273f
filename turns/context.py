"""The context window (SPEC §15): fit each step's prompt into the model's context.

Before each step the prompt's tokens are estimated — the previous step's reported
``prompt_tokens`` adjusted by the bytes added or left out since (÷ 3), else the
UTF-8 bytes ÷ 3 — and when that exceeds ``context − replyReserveTokens`` the
oldest messages of the branch are left out until it fits. The instructions (the
leading system messages) and everything from the newest user message on (this
turn's own tool loop included) always stay; an assistant message with tool calls
and the tool results after it are left out together. With ``summarize`` the
left-out prefix is replaced by a summary (``turns.summaries``). A provider that
refuses a prompt as too long gets the step once more with half the budget.
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

T = TypeVar("T")

BYTES_PER_TOKEN = 3
# An image part costs the model a bounded number of tokens whatever its data URL's
# length (OpenAI: 85 + 170 a 512-px tile; a 2048-px image is about 1100).
IMAGE_TOKENS = 1100
# Room kept for the summary message itself when the prefix is summarised (at most an
# eighth of the budget, so a small context keeps room for messages).
SUMMARY_TOKENS = 600
SUMMARY_HEADER = (
    "A summary of the earlier part of this conversation (those messages are left out "
    "here):\n\n"
)

# The refusals providers give a prompt longer than their context, as their sources
# write them:
#   OpenAI      400 {"error": {"code": "context_length_exceeded", "message":
#               "This model's maximum context length is 128000 tokens. However, ..."}}
#   vLLM        400 {"object": "error", "type": "BadRequestError", "message": "This model's
#               maximum context length is 4096 tokens. However, you requested 5000 tokens
#               in the messages, ..."} (newer: the same inside {"error": {...}}), and
#               "The prompt (total length N) is too long to fit into the model (context
#               length M)"
#   llama.cpp   400 {"error": {"type": "exceed_context_size_error", "message": "request
#               (4476 tokens) exceeds the available context size (4096 tokens), try
#               increasing it", "n_prompt_tokens": ..., "n_ctx": ...}} (older: "the request
#               exceeds the available context size, try increasing it")
#   Ollama      400 {"error": {"type": "invalid_request_error", "message": "the input
#               length exceeds the context length"}}
#   OpenRouter  400 {"error": {"code": 400, "message": "This endpoint's maximum context
#               length is 16384 tokens. However, you requested about 26265 tokens ..."}}
_TOO_LONG_CODES = frozenset({"context_length_exceeded", "exceed_context_size_error"})
_TOO_LONG_TEXT = re.compile(
    r"maximum context length|context length exceeded|exceeds? the (available )?context"
    r"|input length exceeds the context length|too long to fit into the model"
    r"|prompt is too long|context[ _]window",
    re.IGNORECASE,
)


class PromptTooLong(Exception):  # noqa: N818 - the provider's refusal, not turnd's error
    """The provider refused the prompt as longer than its context."""


def too_long(status: int | None, body: Any) -> bool:
    """Whether an error answer says the prompt exceeds the model's context."""
    if status not in (400, 413):
        return False
    if isinstance(body, str):
        return bool(_TOO_LONG_TEXT.search(body))
    if not isinstance(body, dict):
        return False
    inner = body.get("error", body)
    if isinstance(inner, str):
        return bool(_TOO_LONG_TEXT.search(inner))
    if not isinstance(inner, dict):
        return False
    for name in ("code", "type"):
        if inner.get(name) in _TOO_LONG_CODES:
            return True
    message = inner.get("message")
    return isinstance(message, str) and bool(_TOO_LONG_TEXT.search(message))


def message_bytes(message: dict[str, Any]) -> int:
    """UTF-8 bytes a chat message puts in the prompt (an image counts as its tokens)."""
    size = 8  # role and framing
    content = message.get("content")
    if isinstance(content, str):
        size += len(content.encode())
    elif isinstance(content, list):
        for part in content:
            if not isinstance(part, dict):
                continue
            if part.get("type") == "image_url":
                size += IMAGE_TOKENS * BYTES_PER_TOKEN
            elif isinstance(part.get("text"), str):
                size += len(part["text"].encode())
    for call in message.get("tool_calls") or ():
        size += len(json.dumps(call, ensure_ascii=False).encode())
    return size


class Summaries(Protocol):
    """Where summaries of a branch's prefix come from (``turns.summaries``)."""

    async def existing(self) -> dict[str, str]:
        """Summaries on this branch: covered message key -> text."""
        ...

    async def summarize(
        self, prior: str | None, messages: Sequence[dict[str, Any]], covers: str, budget: int
    ) -> str | None:
        """Summarise ``prior`` + ``messages``, keep it at ``covers``; None on failure."""
        ...


@dataclass(frozen=True, slots=True)
class Fitted:
    messages: list[dict[str, Any]]
    dropped: int
    summarized: bool


class ContextWindow:
    """One turn's context window, asked before every step."""

    def __init__(
        self,
        *,
        context: int | None,
        reserve: int,
        keys: dict[int, str] | None = None,
        summaries: Summaries | None = None,
        publish: Callable[[str, dict[str, Any]], None] | None = None,
    ) -> None:
        # A reserve larger than half the context (4096 of a 4000-token model) would leave
        # nothing for the prompt: the reply then gets half.
        self.budget = context - min(reserve, context // 2) if context else None
        self._keys = keys or {}  # id(chat message) -> key of the record it came from
        self._summaries = summaries
        self._publish = publish
        self._existing: dict[str, str] | None = None
        self._last_sent: list[dict[str, Any]] | None = None
        self._last_bytes = 0
        self._last_tokens = 0
        self._reported: tuple[int, bool] | None = None

    # -- the step ----------------------------------------------------------------------

    async def step(
        self,
        run: Callable[[list[dict[str, Any]]], Awaitable[T]],
        messages: list[dict[str, Any]],
        prompt_tokens: Callable[[], int],
    ) -> T:
        """Run one step on the fitted prompt; once more with half the budget when refused.

        ``prompt_tokens`` reads the turn's running total of reported prompt tokens, so
        the difference across the step is what the provider counted for it.
        """
        fitted = await self.fit(messages, self.budget)
        before = prompt_tokens()
        try:
            result = await run(fitted.messages)
        except PromptTooLong:
            # Half of what was refused (never more than half the configured budget), and
            # kept for the rest of the turn: the provider knows its context better.
            sent = self.estimate(fitted.messages)
            self.budget = max(1, min(self.budget or sent, sent) // 2)
            fitted = await self.fit(messages, self.budget, force=True)
            before = prompt_tokens()
            result = await run(fitted.messages)  # a second refusal fails the turn
        self._remember(fitted.messages, prompt_tokens() - before)
        return result

    def _remember(self, sent: list[dict[str, Any]], tokens: int) -> None:
        self._last_sent = sent
        self._last_bytes = sum(message_bytes(m) for m in sent)
        self._last_tokens = tokens if tokens > 0 else 0

    # -- estimating --------------------------------------------------------------------

    def estimate(self, messages: Sequence[dict[str, Any]]) -> int:
        size = sum(message_bytes(m) for m in messages)
        if self._last_tokens:
            return max(0, self._last_tokens + (size - self._last_bytes) // BYTES_PER_TOKEN)
        return size // BYTES_PER_TOKEN

    # -- fitting -----------------------------------------------------------------------

    async def fit(
        self, messages: list[dict[str, Any]], budget: int | None, *, force: bool = False
    ) -> Fitted:
        """The prompt to send: ``messages`` with the oldest left out until it fits."""
        if budget is None or (not force and self.estimate(messages) <= budget):
            return self._report(Fitted(messages, 0, False))
        head, units, tail = _split(messages)
        room = summary_room(budget)
        reserve = [_summary_message("x" * room * BYTES_PER_TOKEN)] if self._summaries else []

        def fits(i: int, within: int) -> bool:
            kept = [*head, *reserve, *(m for u in units[i:] for m in u), *tail]
            return self.estimate(kept) <= within

        needed = next((i for i in range(len(units) + 1) if fits(i, budget)), len(units))
        if needed == 0 and not force:
            return self._report(Fitted(messages, 0, False))
        summary: str | None = None
        cut = needed
        if self._summaries is not None and needed > 0:
            cut, summary = await self._summary(units, needed, budget, fits)
        kept_units = [m for u in units[cut:] for m in u]
        dropped = sum(len(u) for u in units[:cut])
        out = [*head, *([_summary_message(summary)] if summary else []), *kept_units, *tail]
        return self._report(Fitted(out, dropped, summary is not None))

    async def _summary(
        self,
        units: list[list[dict[str, Any]]],
        needed: int,
        budget: int,
        fits: Callable[[int, int], bool],
    ) -> tuple[int, str | None]:
        """(units to leave out, summary text): an existing summary, or a new one."""
        assert self._summaries is not None
        if self._existing is None:
            self._existing = await self._summaries.existing()
        unit_keys = [self._unit_key(u) for u in units]
        # Reuse the summary that covers the least beyond what must go.
        for j in range(needed - 1, len(units)):
            key = unit_keys[j]
            if key is not None and key in self._existing:
                return j + 1, self._existing[key]
        # A new one cuts deeper (to 3/4 of the budget), so the next turns reuse it.
        deeper = next(
            (i for i in range(needed, len(units) + 1) if fits(i, budget * 3 // 4)), len(units)
        )
        cut = deeper
        while cut > 0 and unit_keys[cut - 1] is None:
            cut -= 1
        if cut < needed:
            return needed, None
        prior_at = max(
            (j for j in range(cut - 1) if unit_keys[j] in self._existing), default=-1
        )
        prior = self._existing.get(unit_keys[prior_at] or "") if prior_at >= 0 else None
        covered = [m for u in units[prior_at + 1 : cut] for m in u]
        covers = unit_keys[cut - 1]
        assert covers is not None
        text = await self._summaries.summarize(prior, covered, covers, budget)
        if text is None:
            return needed, None
        self._existing[covers] = text
        return cut, text

    def _unit_key(self, unit: list[dict[str, Any]]) -> str | None:
        for message in reversed(unit):
            key = self._keys.get(id(message))
            if key is not None:
                return key
        return None

    def _report(self, fitted: Fitted) -> Fitted:
        # The stream hears of it when what is left out changes, not at every step.
        state = (fitted.dropped, fitted.summarized)
        if fitted.dropped and state != self._reported and self._publish is not None:
            self._publish("context", {"dropped": fitted.dropped, "summarized": fitted.summarized})
        if fitted.dropped:
            self._reported = state
        return fitted


def summary_room(budget: int) -> int:
    """Tokens a summary may take of a prompt's ``budget``."""
    return max(64, min(SUMMARY_TOKENS, budget // 8))


def _summary_message(text: str) -> dict[str, Any]:
    return {"role": "system", "content": SUMMARY_HEADER + text}


def _split(
    messages: list[dict[str, Any]],
) -> tuple[list[dict[str, Any]], list[list[dict[str, Any]]], list[dict[str, Any]]]:
    """(instructions, droppable units oldest first, what always stays)."""
    start = 0
    while start < len(messages) and messages[start].get("role") == "system":
        start += 1
    newest_user = next(
        (i for i in range(len(messages) - 1, start - 1, -1) if messages[i].get("role") == "user"),
        len(messages),
    )
    units: list[list[dict[str, Any]]] = []
    for message in messages[start:newest_user]:
        # A tool result belongs to the assistant message whose call it answers.
        if message.get("role") == "tool" and units:
            units[-1].append(message)
        else:
            units.append([message])
    return messages[:start], units, messages[newest_user:]
