"""``turnd send``: write a user message with the stock atproto client, print the reply as it streams.

It talks to the daemon as any client would: XRPC record writes (the local store's
or the PDS's), then the reply's SSE stream from the side server, falling back to
polling the stored record.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import AsyncIterator
from typing import Any

import anyio
import httpx
from httpx_sse import aconnect_sse

from daemon.accounts import Account
from daemon.config import Config, load_config
from daemon.config_file import ConfigError
from daemon.exits import EXIT_CONFIG, EXIT_FAIL, EXIT_OK, fail, leaf, short
from daemon.sdk_import import postpone_namespace_annotations
from recordstore.times import now_iso
from recordstore.vocabulary import CONVERSATION, PLAIN_CONTENT, TEXT_PART
from turns.tls import tls_context_for

FINAL = ("complete", "error", "cancelled")

# Before anything here imports the SDK: it then costs 0.1 s, not 0.75 s (SPEC §10).
postpone_namespace_annotations()


def cmd_send(args: argparse.Namespace) -> int:
    try:
        config = load_config(args.config)
    except ConfigError as err:
        return fail(f"config error: {err}", EXIT_CONFIG)
    account = _pick_account(config, args.account)
    if isinstance(account, str):
        # A first `turnd send` before any `turnd serve`: say what to start first.
        if config.store_kind == "local" and not anyio.run(_reachable, config.base_url):
            return fail(str(_unreachable(config.base_url)))
        return fail(account, EXIT_CONFIG)
    if not args.text.strip():
        return fail("nothing to send: the message is empty", EXIT_CONFIG)
    model = None
    if args.model:
        provider, sep, model_id = args.model.partition(":")
        if not sep or not provider or not model_id:
            return fail("--model: expected PROVIDER:ID", EXIT_CONFIG)
        if provider not in config.providers:
            known = ", ".join(sorted(config.providers))
            return fail(
                f"--model {args.model}: no provider {provider!r} in the config (known: {known})",
                EXIT_CONFIG,
            )
        model = {"provider": provider, "id": model_id}
    try:
        return anyio.run(_send, config, account, args, model)
    except BaseException as exc:  # noqa: BLE001 - one line, not a traceback
        error = leaf(exc)
        if isinstance(error, KeyboardInterrupt):
            return 130
        if isinstance(error, SendRefused):
            return fail(str(error), error.code)
        if _network_error(error):
            # Gone while the message was being written (the reply's stream says so itself).
            where = "turnd" if config.store_kind == "local" else "the PDS"
            url = config.base_url if config.store_kind == "local" else config.store_service
            hint = " — is `turnd serve` still running?" if config.store_kind == "local" else ""
            return fail(f"lost {where} at {url}{hint}")
        if isinstance(error, Exception):
            return fail(f"send failed: {short(error, config.secrets())}")
        raise


def _network_error(error: BaseException) -> bool:
    from atproto_client.exceptions import NetworkError

    return isinstance(error, NetworkError | httpx.TransportError)


class SendRefused(Exception):
    """A one-line reason to stop, written before (or instead of) any record."""

    def __init__(self, message: str, code: int = EXIT_FAIL) -> None:
        super().__init__(message)
        self.code = code


REACH_SECONDS = 3.0  # the daemon's /healthz must answer within this


async def _reachable(base_url: str) -> bool:
    """Whether a turnd answers at ``base_url`` (any HTTP answer counts)."""
    try:
        tls = tls_context_for(base_url)
        async with httpx.AsyncClient(timeout=REACH_SECONDS, verify=tls) as http:
            await http.get(f"{base_url}/healthz")
    except httpx.HTTPError:
        return False
    return True


def _unreachable(base_url: str) -> SendRefused:
    return SendRefused(f"cannot reach turnd at {base_url} — is `turnd serve` running?")


def _pick_account(config: Config, name: str | None) -> Account | str:
    if not config.accounts:
        return "no account: run `turnd serve` once (it creates one) or `turnd init`"
    if name is None:
        account = config.accounts[0]
    else:
        found = [a for a in config.accounts if name in (a.name, a.handle, a.did)]
        if not found:
            return f"--account: no account {name!r} in the config"
        account = found[0]
    if not account.password:
        return f"accounts.{account.name}.password_env: turnd send logs in with the password"
    return account


async def _send(
    config: Config, account: Account, args: argparse.Namespace, model: dict[str, str] | None
) -> int:
    # The client package alone: the top-level `atproto` also imports the firehose,
    # identity, crypto and server packages (~0.3 s), none of which send uses.
    from atproto_client import AsyncClient
    from atproto_client.request import AsyncRequest

    from recordstore import CONVERSATION_REF, INFO, MESSAGE, SETTINGS_SPACE
    from recordstore.keys import new_tid, repo_rkey

    # Nothing is written when no daemon would answer it.
    if not await _reachable(config.base_url):
        raise _unreachable(config.base_url)
    # The stock SDK, against turnd's own XRPC (local store) or the PDS itself.
    xrpc_url = config.base_url if config.store_kind == "local" else str(config.store_service)
    client = AsyncClient(base_url=xrpc_url, request=AsyncRequest(verify=tls_context_for(xrpc_url)))
    await client.login(account.handle, account.password, fetch_bsky_profile=False)
    did = (await client.com.atproto.server.get_session()).did
    repo = client.com.atproto.repo

    async def create(collection: str, rkey: str, record: dict[str, Any]) -> None:
        await repo.create_record(
            {"repo": did, "collection": collection, "rkey": rkey, "record": record}
        )

    skey = args.conversation
    parent: str | None = None
    if skey is None:
        skey = new_tid()
        now = now_iso()
        await create(INFO, repo_rkey(skey, "self"), {"$type": INFO, "createdAt": now})
        await create(
            CONVERSATION_REF,
            repo_rkey(SETTINGS_SPACE, skey),
            {
                "$type": CONVERSATION_REF,
                "conversation": f"at://{did}/space/{CONVERSATION}/{skey}",
                "updatedAt": now,
            },
        )
        print(f"turnd: conversation {skey}", file=sys.stderr, flush=True)
    else:
        from recordstore.keys import validate_space_key

        try:
            validate_space_key(skey)
        except ValueError as err:
            raise SendRefused(f"--conversation {skey}: {err}", EXIT_CONFIG) from None
        parent = await _branch_tip(repo, did, skey)
        if parent is None and not await _has_info(repo, did, skey):
            raise SendRefused(
                f"--conversation {skey}: no such conversation (see GET /api/conversations)",
                EXIT_CONFIG,
            )

    generation: dict[str, Any] = {"attempt": 0}
    if model:
        generation["model"] = model
    if args.effort:
        generation["effort"] = args.effort
    user_key = new_tid()
    record: dict[str, Any] = {
        "$type": MESSAGE,
        "role": "user",
        "content": {"$type": PLAIN_CONTENT, "parts": [_text_part(args.text)]},
        "generation": generation,
        "createdAt": now_iso(),
    }
    if parent:
        record["parent"] = parent
    await create(MESSAGE, repo_rkey(skey, user_key), record)
    reply = f"{user_key}.r0"

    with anyio.move_on_after(args.timeout) as scope:
        status, error = await _follow_reply(config, account, repo, did, skey, reply)
    if scope.cancelled_caught:
        return fail(f"no final reply at {reply} after {args.timeout:g}s")
    if status != "complete":
        return fail(f"the reply ended in {status}" + (f": {error}" if error else ""))
    if args.conversation is None and config.settings().title_model != "":
        await _print_title(config, account, repo, did, skey)
    return EXIT_OK


TITLE_WAIT = 10.0  # seconds a new conversation's generated title is waited for at most


async def _print_title(
    config: Config, account: Account, repo: Any, did: str, skey: str
) -> None:
    """The title turnd generates after the first reply (SPEC §15), when it arrives."""
    from recordstore import INFO, PREFERENCES, SETTINGS_SPACE
    from recordstore.keys import repo_rkey

    async def read(collection: str, rkey: str) -> dict[str, Any] | None:
        try:
            got = await repo.get_record({"repo": did, "collection": collection, "rkey": rkey})
        except Exception:  # noqa: BLE001 - missing or unreadable: no title to print
            return None
        return _value(got)

    preferences = await read(PREFERENCES, repo_rkey(SETTINGS_SPACE, "self")) or {}
    if preferences.get("generateTitles") is False:
        return
    with anyio.move_on_after(TITLE_WAIT):
        if account.token:
            # The conversation's events from the start of its kept log: the `title`, or
            # `title-failed` when its model failed (then there is nothing to wait for).
            try:
                outcome = await _title_event(config, account, skey)
            except (httpx.HTTPError, ValueError):
                outcome = None  # no event stream (another daemon's conversation?): poll
            if outcome is not None:
                event, text = outcome
                if event == "title":
                    print(f"turnd: title {text!r}", file=sys.stderr, flush=True)
                else:
                    print(f"turnd: no title: {text}", file=sys.stderr, flush=True)
                return
        while True:
            info = await read(INFO, repo_rkey(skey, "self")) or {}
            if isinstance(info.get("title"), str) and info["title"]:
                print(f"turnd: title {info['title']!r}", file=sys.stderr, flush=True)
                return
            await anyio.sleep(0.02)


async def _title_event(config: Config, account: Account, skey: str) -> tuple[str, str] | None:
    """("title", its text) or ("title-failed", the reason), from the conversation's events."""
    url = f"{config.base_url}/api/conversations/{skey}/events"
    headers = {"Authorization": f"Bearer {account.token}", "Last-Event-ID": "0"}
    async with (
        httpx.AsyncClient(
            timeout=httpx.Timeout(10, read=TITLE_WAIT + 5), verify=tls_context_for(config.base_url)
        ) as http,
        aconnect_sse(http, "GET", url, headers=headers) as source,
    ):
        if source.response.status_code != 200:
            raise ValueError(f"events answered {source.response.status_code}")
        async for sse in source.aiter_sse():
            data = json.loads(sse.data)
            if sse.event == "title" and isinstance(data.get("title"), str) and data["title"]:
                return "title", data["title"]
            if sse.event == "title-failed":
                return "title-failed", str(data.get("reason", ""))
    return None


async def _has_info(repo: Any, did: str, skey: str) -> bool:
    from atproto_client.exceptions import BadRequestError

    from recordstore import INFO
    from recordstore.keys import repo_rkey

    try:
        await repo.get_record({"repo": did, "collection": INFO, "rkey": repo_rkey(skey, "self")})
    except BadRequestError:  # RecordNotFound, or a key that cannot be one (InvalidRequest)
        return False
    return True


def _text_part(text: str) -> dict[str, Any]:
    return {"$type": TEXT_PART, "text": text}


def _value(response: Any) -> dict[str, Any]:
    """A record value from the SDK as a plain dict (it may be a model or a DotDict)."""
    from atproto_client.models.dot_dict import DotDict  # the SDK is loaded by now
    from pydantic import BaseModel

    value = response.value
    if isinstance(value, DotDict):
        return value.to_dict()
    if isinstance(value, BaseModel):
        return value.model_dump()
    return dict(value)


async def _list_conversation(repo: Any, did: str, skey: str) -> list[tuple[str, dict[str, Any]]]:
    """One conversation's messages in key order (classic layout: ``<skey>:`` prefix)."""
    from recordstore import MESSAGE

    prefix, cursor, out = f"{skey}:", f"{skey}:", []
    while True:
        page = await repo.list_records(
            {"repo": did, "collection": MESSAGE, "cursor": cursor, "limit": 100, "reverse": True}
        )
        for item in page.records:
            rkey = item.uri.rsplit("/", 1)[-1]
            if not rkey.startswith(prefix):
                return out
            out.append((rkey[len(prefix) :], _value(item)))
        if not page.cursor or not page.records:
            return out
        cursor = page.cursor


async def _branch_tip(repo: Any, did: str, skey: str) -> str | None:
    """The parent for a new message: the newest user message's current reply, else it."""
    from recordstore.keys import parse_reply_key

    messages = dict(await _list_conversation(repo, did, skey))
    users = sorted(k for k, v in messages.items() if v.get("role") == "user")
    if not users:
        return None
    last = users[-1]
    attempt = (messages[last].get("generation") or {}).get("attempt", 0)
    replies = [k for k in messages if (parse_reply_key(k) or ("", -1)) == (last, attempt)]
    return replies[0] if replies else last


async def _follow_reply(
    config: Config, account: Account, repo: Any, did: str, skey: str, reply: str
) -> tuple[str, str | None]:
    """Print the reply as it streams; returns its final (status, error).

    The SSE route answers once this daemon claimed the reply (404 before that, or one
    stored ``status`` when another process runs it), so: stream when we can, poll the
    record when we cannot, and print from the record whatever the stream did not show.
    """
    from recordstore import MESSAGE
    from recordstore.keys import repo_rkey

    printed = ""
    last_id = 0
    delay = 0.1
    url = f"{config.base_url}/api/conversations/{skey}/messages/{reply}/stream"
    headers = {"Authorization": f"Bearer {account.token}"} if account.token else None
    tls = tls_context_for(config.base_url)
    async with httpx.AsyncClient(timeout=httpx.Timeout(10, read=60), verify=tls) as http:
        while True:
            status: str | None = None
            error: str | None = None
            broke = False  # the connection failed (not a 404 before the claim)
            if headers is not None:
                try:
                    async for ev_id, event, data in _sse(http, url, headers, last_id):
                        last_id = ev_id or last_id
                        if event == "part-start":
                            pass
                        elif event == "delta" and data.get("type", "text") == "text":
                            printed += _emit(str(data.get("text", "")))
                        elif event == "queued":
                            print("turnd: queued (rate limit)", file=sys.stderr, flush=True)
                        elif event == "status":
                            status, error = data.get("status"), data.get("error")
                except httpx.TransportError:
                    broke = True  # the daemon may have gone away: asked below
                except (httpx.HTTPError, ValueError):
                    pass  # not claimed yet: fall back to the record
            if status in FINAL and printed:
                break
            from atproto_client.exceptions import NetworkError

            try:
                got = await repo.get_record(
                    {"repo": did, "collection": MESSAGE, "rkey": repo_rkey(skey, reply)}
                )
                value = _value(got)
            except NetworkError:
                broke, value = True, {}
            except Exception:  # noqa: BLE001 - RecordNotFound until the claim lands
                value = {}
            if broke and status not in FINAL and not await _reachable(config.base_url):
                # A daemon that died mid-reply refuses connections at once: say so now
                # rather than polling until --timeout.
                if printed and not printed.endswith("\n"):
                    sys.stdout.write("\n")
                raise SendRefused(
                    f"lost turnd at {config.base_url} mid-reply — is `turnd serve` still running?"
                )
            if value.get("status") in FINAL:
                text = _record_text(value)
                rest = text[len(printed) :] if text.startswith(printed) else "\n" + text
                sys.stdout.write(rest)
                printed += rest
                status, error = value["status"], value.get("error")
                break
            await anyio.sleep(delay)
            delay = min(delay * 1.5, 1.0)
    if printed and not printed.endswith("\n"):
        sys.stdout.write("\n")
    sys.stdout.flush()
    return str(status), error


def _emit(text: str) -> str:
    sys.stdout.write(text)
    sys.stdout.flush()
    return text


def _record_text(value: dict[str, Any]) -> str:
    parts = (value.get("content") or {}).get("parts") or []
    return "".join(
        str(p.get("text", "")) for p in parts if str(p.get("$type", "")).endswith("#textPart")
    )


async def _sse(
    http: httpx.AsyncClient, url: str, headers: dict[str, str], after: int
) -> AsyncIterator[tuple[int, str, dict[str, Any]]]:
    """(id, event, data) of a reply's SSE stream; deltas are tagged with their part's type."""
    send_headers = dict(headers)
    if after:
        send_headers["Last-Event-ID"] = str(after)
    kinds: dict[int, str] = {}
    async with aconnect_sse(http, "GET", url, headers=send_headers) as source:
        if source.response.status_code != 200:
            raise ValueError(f"stream answered {source.response.status_code}")
        async for sse in source.aiter_sse():
            payload = json.loads(sse.data)
            if sse.event == "part-start":
                kinds[payload.get("index", 0)] = payload.get("type", "text")
            elif sse.event == "delta":
                payload["type"] = kinds.get(payload.get("index", 0), "text")
            yield int(sse.id) if sse.id.isdigit() else 0, sse.event, payload
            if sse.event == "status":
                return
