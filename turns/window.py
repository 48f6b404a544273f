"""One turn's prompt and its context window: the branch as chat messages, each tagged
with the record it came from, attachments prepared, summaries wired (SPEC §15)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from recordstore import RecordStore
from turns.attachments import Attachments
from turns.context import ContextWindow
from turns.models import Clients, parse_model
from turns.prompt import branch_keys, chat_groups
from turns.settings import Provider, TurnSettings
from turns.summaries import BranchSummaries


@dataclass
class TurnPrompt:
    messages: list[dict[str, Any]]
    window: ContextWindow
    attachments: Attachments
    summaries: BranchSummaries | None = None  # their calls' usage is recorded (SPEC §16)


async def turn_prompt(
    store: RecordStore,
    clients: Clients,
    *,
    did: str,
    skey: str,
    chain: list[dict[str, Any]],
    user_key: str,
    system: str,
    settings: TurnSettings,
    model: dict[str, str],
    provider: Provider,
    publish: Callable[[str, dict[str, Any]], None],
    cache_dir: Path | None,
) -> TurnPrompt:
    attachments = Attachments(
        store,
        did,
        max_pixels=settings.image_max_pixels,
        file_text_max=settings.file_text_max_bytes,
        budget=settings.max_attachment_bytes,
        cache_dir=cache_dir,
    )
    head, groups = await chat_groups(store, did, chain, system, attachments)
    keys = branch_keys(chain, user_key)
    key_of = {id(m): keys[i] for i, messages in groups for m in messages}
    summaries = None
    if settings.summarize:
        ref = parse_model(settings.summary_model) if settings.summary_model else model
        client = clients.client(clients.provider(ref), settings.retries)
        summaries = BranchSummaries(store, did, skey, keys, client, ref)
    window = ContextWindow(
        context=provider.context_of(model["id"]),
        reserve=settings.reply_reserve_tokens,
        keys=key_of,
        summaries=summaries,
        publish=publish,
    )
    messages = [*head, *(m for _, group in groups for m in group)]
    return TurnPrompt(messages, window, attachments, summaries)
