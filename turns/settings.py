"""What a turn reads when it starts: the `[turns]` settings and the providers."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

DEFAULT_SYSTEM_PROMPT = (
    "You are {{appName}}, a helpful assistant. Today is {{date}} ({{timezone}}). "
    "Your replies are rendered as Markdown; raw HTML is not rendered, "
    "and images are only loaded when the reader clicks them."
)

# camelCase key in turnd.toml -> field name
_TOML_KEYS = {
    "ratePerMinute": "rate_per_minute",
    "maxSteps": "max_steps",
    "timeoutSeconds": "timeout_seconds",
    "backfillMinutes": "backfill_minutes",
    "maxParallelTools": "max_parallel_tools",
    "toolTimeoutSeconds": "tool_timeout_seconds",
    "retries": "retries",
    "systemPrompt": "system_prompt",
    "appName": "app_name",
    # SPEC §15 (conversations that last) and §12's attachment bound.
    "replyReserveTokens": "reply_reserve_tokens",
    "summarize": "summarize",
    "summaryModel": "summary_model",
    "titleModel": "title_model",
    "imageMaxPixels": "image_max_pixels",
    "fileTextMaxBytes": "file_text_max_bytes",
    "maxAttachmentBytes": "max_attachment_bytes",
    # SPEC §12: the queue bound and abandoned claims; §14's approval wait bounds the latter.
    "maxQueued": "max_queued",
    "abandonAfterMinutes": "abandon_after_minutes",
    "approvalTimeoutSeconds": "approval_timeout_seconds",
}


@dataclass(frozen=True, slots=True)
class TurnSettings:
    rate_per_minute: int = 10
    max_steps: int = 8
    timeout_seconds: float = 600
    backfill_minutes: float = 60
    max_parallel_tools: int = 5
    tool_timeout_seconds: float = 30
    retries: int = 2
    # None: the built-in base prompt; "": no base prompt at all.
    system_prompt: str | None = None
    app_name: str = "turnd"
    reply_reserve_tokens: int = 4096
    summarize: bool = False
    summary_model: str | None = None  # "provider:id"; None: the turn's model
    title_model: str | None = None  # "provider:id"; None: the turn's model; "": no titles
    image_max_pixels: int = 2048
    file_text_max_bytes: int = 200_000
    max_attachment_bytes: int = 64 * 1024 * 1024
    max_queued: int = 1000  # per account, waiting for the rate limit
    abandon_after_minutes: float = 60
    approval_timeout_seconds: float = 300  # a tool call waiting for the user's yes (SPEC §14)

    @property
    def abandon_after_seconds(self) -> float:
        """How old a pending reply must be before no live turn can own it (SPEC §12).

        Never less than the longest a live turn can take: its timeout, an approval
        wait on every step, and five minutes of slack.
        """
        longest = self.timeout_seconds + self.max_steps * self.approval_timeout_seconds + 300
        return max(self.abandon_after_minutes * 60, longest)

    @classmethod
    def from_toml(cls, table: dict[str, Any]) -> TurnSettings:
        """Build from the `[turns]` table; ``ValueError("turns.<key>: ...")`` on bad input."""
        kwargs: dict[str, Any] = {}
        types = {f.name: f.type for f in fields(cls)}
        for key, value in table.items():
            name = _TOML_KEYS.get(key)
            if name is None:
                raise ValueError(f"turns.{key}: unknown setting")
            kind = types[name]
            if kind == "bool":
                if not isinstance(value, bool):
                    raise ValueError(f"turns.{key}: must be true or false")
            elif "str" in kind:
                if not isinstance(value, str):
                    raise ValueError(f"turns.{key}: must be a string")
            else:
                if isinstance(value, bool) or not isinstance(value, int | float):
                    raise ValueError(f"turns.{key}: must be a number")
                if kind == "int" and value != int(value):
                    raise ValueError(f"turns.{key}: must be a whole number")
                minimum = 0 if name in ("retries", "reply_reserve_tokens") else 1
                if value < minimum:
                    raise ValueError(f"turns.{key}: must be >= {minimum}")
                value = int(value) if kind == "int" else value
            kwargs[name] = value
        return cls(**kwargs)


@dataclass(frozen=True, slots=True)
class Provider:
    """An OpenAI-compatible endpoint. ``api_key`` is the secret itself: never log it."""

    name: str
    base_url: str
    api_key: str | None = field(default=None, repr=False)
    models: tuple[str, ...] = ()
    label: str | None = None
    # Context sizes in tokens (SPEC §15): per model id, else provider-wide, else unknown.
    context: int | None = None
    model_context: Mapping[str, int] = field(default_factory=dict)

    def context_of(self, model_id: str) -> int | None:
        return self.model_context.get(model_id, self.context)
