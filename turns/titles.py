"""Generated titles (SPEC §15).

After a conversation's first complete reply, when the user's preferences do not
say ``generateTitles: false`` and the conversation has no title, ``[turns]
titleModel`` (default: the turn's model) is asked for a title of at most 60
characters. It is written to ``info`` with a compare-and-swap, so a title the user
sets meanwhile wins, and to the ``conversationRef``. It runs after the reply's
``status`` is out, in the engine's task group; a title model that fails leaves no
title and writes nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import anyio
import openai

from recordstore import INFO, MESSAGE, InvalidSwap, Record, RecordExists, RecordStore, StoreError
from recordstore.times import now_iso
from turns.models import Clients, ModelResolutionError, parse_model, post_chat
from turns.parts import TEXT
from turns.provider_errors import failure_text, name_provider, without_keys
from turns.settings import TurnSettings

log = logging.getLogger("turnd.turns")

MAX_TITLE = 60
TITLE_TIMEOUT = 60.0  # seconds; a title is never worth holding a shutdown for longer
_INPUT_CHARS = 4000
_INSTRUCTIONS = (
    "Write a short title (at most 60 characters) for the conversation below, in its "
    "language. Answer with the title alone: no quotes, no final period."
)
_USER, _ASSISTANT = "User: ", "\n\nAssistant: "


def wanted(
    settings: TurnSettings, info: Mapping[str, Any] | None, preferences: Mapping[str, Any] | None
) -> bool:
    if settings.title_model == "":
        return False  # titles are off for the whole daemon
    if (preferences or {}).get("generateTitles") is False:
        return False
    title = (info or {}).get("title")
    return not (isinstance(title, str) and title)


def title_request(user_text: str, reply_text: str) -> list[dict[str, str]]:
    """The messages that ask a model for a title of this first exchange."""
    return [
        {"role": "system", "content": _INSTRUCTIONS},
        {"role": "user", "content": f"{_USER}{user_text}{_ASSISTANT}{reply_text}"},
    ]


def asked_title(messages: Sequence[Mapping[str, Any]]) -> str | None:
    """The user's words when ``messages`` is a :func:`title_request`, else None.

    For a provider that answers without a model (the built-in echo provider): echoing
    the request back would make every title "User: ..."."""
    if len(messages) != 2 or messages[0].get("content") != _INSTRUCTIONS:
        return None
    text = messages[1].get("content")
    if messages[1].get("role") != "user" or not isinstance(text, str) or not text.startswith(_USER):
        return None
    return text[len(_USER) :].split(_ASSISTANT, 1)[0]


def clean(text: str) -> str:
    """The model's answer as a title: one line, no quotes, at most 60 characters."""
    line = next((t.strip() for t in text.strip().splitlines() if t.strip()), "")
    line = line.removeprefix("Title:").strip().strip("\"'“”‘’«»*#").strip()
    if len(line) > MAX_TITLE:
        cut = line[:MAX_TITLE]
        line = cut.rsplit(" ", 1)[0] if " " in cut[MAX_TITLE // 2 :] else cut
    return line.rstrip(" .")


def _text(value: Mapping[str, Any]) -> str:
    content = value.get("content")
    parts = content.get("parts") if isinstance(content, Mapping) else None
    texts = [
        p["text"]
        for p in parts or ()
        if isinstance(p, Mapping) and p.get("$type") == TEXT and isinstance(p.get("text"), str)
    ]
    return "\n".join(texts)[:_INPUT_CHARS]


def _answer(response: Any) -> tuple[dict[str, Any] | None, Any]:
    """A chat completion's usage and first message's content, as ``create()`` read them;
    a body of another shape (the SDK hands back a non-JSON body as text) is a failure,
    as the attribute errors on ``create()``'s answer were."""
    if not isinstance(response, dict):
        raise TypeError(f"the title model answered {type(response).__name__}, not JSON")
    usage = response.get("usage")
    choices = response.get("choices")
    if not choices:
        return (usage if isinstance(usage, dict) else None), None
    message = choices[0]["message"]
    return (usage if isinstance(usage, dict) else None), message.get("content")


def _titled(info: Record) -> bool:
    title = info.value.get("title")
    return isinstance(title, str) and bool(title)


class NoTitle(Exception):  # noqa: N818 - an outcome, carrying its reason
    """The title model gave no title: the reason, with the provider named (never its key)."""


@dataclass(frozen=True, slots=True)
class TitleAsk:
    """A title wanted for the conversation ``skey`` after its first complete reply."""

    did: str
    skey: str
    settings: TurnSettings
    model: dict[str, str]  # the reply's, unless [turns] titleModel names another
    user_message: Mapping[str, Any]
    reply: Mapping[str, Any]


class Titles:
    """Title tasks of one engine; ``cancel_all`` at shutdown, ``cancel`` on delete."""

    def __init__(
        self,
        store: RecordStore,
        clients: Clients,
        touch_ref: Callable[[str, str, str | None], Awaitable[None]],
        record_usage: Callable[[str, str, str, dict, dict], Awaitable[None]] | None = None,
    ) -> None:
        self._store = store
        self._clients = clients
        self._touch_ref = touch_ref
        # (did, skey, kind, model, usage) -> the usage ledger (SPEC §16: titles count)
        self._record_usage = record_usage
        self._scopes: dict[tuple[str, str], anyio.CancelScope] = {}
        self._tg: anyio.abc.TaskGroup | None = None
        self.usage: list[dict[str, Any]] = []
        # (did, skey, reason): a title that will not come, so a client waiting for one
        # (`turnd send`) stops waiting; the daemon sets it (a `title-failed` event).
        self.on_no_title: Callable[[str, str, str], None] | None = None

    def attach(self, task_group: anyio.abc.TaskGroup) -> None:
        """The engine's task group: title tasks end before the engine does."""
        self._tg = task_group

    def start(self, ask: TitleAsk) -> None:
        if self._tg is not None and (ask.did, ask.skey) not in self._scopes:
            self._tg.start_soon(self.generate, ask)

    def cancel(self, did: str, skey: str) -> None:
        scope = self._scopes.get((did, skey))
        if scope is not None:
            scope.cancel()

    def cancel_all(self) -> None:
        for scope in list(self._scopes.values()):
            scope.cancel()

    async def generate(self, ask: TitleAsk) -> None:
        did, skey, reply = ask.did, ask.skey, ask.reply
        address = (did, skey)
        if address in self._scopes:
            return  # one title at a time per conversation
        scope = self._scopes[address] = anyio.CancelScope()
        try:
            with scope, anyio.move_on_after(TITLE_TIMEOUT) as timer:
                info = await self._info(did, skey)
                if info is not None and _titled(info):
                    return  # titled since the turn read its info: the title would not be kept
                seen = len(self.usage)
                try:
                    title = await self._ask(ask)
                    why = "the title model answered no title"
                except NoTitle as reason:
                    title, why = "", str(reason)
                if self._record_usage is not None:
                    calls, self.usage[seen:] = self.usage[seen:], []
                    for call in calls:
                        await self._record_usage(did, skey, "title", call["model"], call["usage"])
                if title:
                    await self._write(did, skey, title, reply.get("parent"), info)
                else:
                    self._no_title(did, skey, why)
            if timer.cancelled_caught:
                self._no_title(did, skey, f"no title within {TITLE_TIMEOUT:g} s")
        except Exception:
            log.exception("title generation failed for %s", skey)
            self._no_title(did, skey, "title generation failed")
        finally:
            self._scopes.pop(address, None)

    async def _info(self, did: str, skey: str) -> Record | None:
        """The conversation's info now. A turn asks for a title when the info it read at
        its start had none; the turns right after a conversation's first reply read it
        before that reply's title was written, and each asked a model for a title that
        ``_write`` then dropped (a point read here costs a hundredth of that call). The
        record read here is the first one ``_write`` swaps on."""
        try:
            return await self._store.get_record(did, skey, INFO, "self")
        except StoreError:
            return None  # asked as before; the write reads again and decides

    def _no_title(self, did: str, skey: str, reason: str) -> None:
        if self.on_no_title is not None:
            self.on_no_title(did, skey, reason)

    async def _ask(self, ask: TitleAsk) -> str:
        """The title (``""`` when the model answered none); raises NoTitle when it failed."""
        settings, model = ask.settings, ask.model
        try:
            ref = parse_model(settings.title_model) if settings.title_model else model
            client = self._clients.client(self._clients.provider(ref), settings.retries)
        except (ValueError, ModelResolutionError) as exc:
            log.warning("no title: %s", exc)
            raise NoTitle(f"no title model: {exc}") from None
        body = {
            "messages": title_request(_text(ask.user_message), _text(ask.reply)),
            "model": ref["id"],
            "max_tokens": 32,
            "stream": False,
        }
        try:
            # The client's base URL, auth, retries and errors, as create() would use; the
            # answer as JSON, not a ChatCompletion: create() ran the body through the SDK's
            # TypedDict transform and built pydantic objects of the answer, most of a
            # title's CPU (docs/performance-history.md, fifth round).
            response = await post_chat(client, body, dict)
        except openai.OpenAIError as exc:
            # The reason goes into a `title-failed` event: named, and without the key.
            reason = without_keys(
                name_provider(failure_text(exc), ref["provider"], client.base_url), [client.api_key]
            )
            log.warning("the title model %s:%s failed: %s", ref["provider"], ref["id"], reason)
            raise NoTitle(f"the title model {ref['provider']}:{ref['id']} failed: {reason}") from None
        usage, text = _answer(response)
        if usage is not None:
            self.usage.append({"model": ref, "usage": usage})
        return clean(text) if isinstance(text, str) else ""

    async def _write(
        self, did: str, skey: str, title: str, user_key: Any, info: Record | None = None
    ) -> None:
        for _ in range(3):
            if info is None:
                info = await self._store.get_record(did, skey, INFO, "self")
            if info is None and (
                not isinstance(user_key, str)
                or await self._store.get_record(did, skey, MESSAGE, user_key) is None
            ):
                return  # deleted meanwhile: nothing to title
            if info is not None and _titled(info):
                return  # a title arrived meanwhile (the user's, or another turn's): it wins
            value = dict(info.value) if info else {"$type": INFO, "createdAt": now_iso()}
            value.update(title=title, titleSource="generated")
            try:
                if info is None:
                    await self._store.create_record(did, skey, INFO, "self", value)
                else:
                    await self._store.put_record(did, skey, INFO, "self", value, swap_cid=info.cid)
            except (InvalidSwap, RecordExists):
                info = None
                continue  # changed under us: read again and decide again
            except StoreError as exc:
                log.warning("could not write the title of %s: %s", skey, exc)
                return
            await self._touch_ref(did, skey, title)
            return
