"""The ``turnd`` command: init, serve, send, check (SPEC §7).

Exit codes: 0 success; 1 a runtime failure (a port taken, a check that failed, a reply
that ended in ``error``); 2 a bad config or bad command line, reported in one line
before anything starts.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import sys
import textwrap
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import anyio
import httpx
from httpx_sse import aconnect_sse

from daemon.config import (
    CREDENTIALS_FILE,
    ECHO,
    KNOWN_PROVIDER_KEYS,
    Account,
    Config,
    ConfigError,
    ensure_credentials,
    load_config,
    resolve_config_path,
)
from recordstore.times import now_iso
from recordstore.vocabulary import CONVERSATION, PLAIN_CONTENT, TEXT_PART
from turns.models import EFFORTS

EXIT_OK, EXIT_FAIL, EXIT_CONFIG = 0, 1, 2
FINAL = ("complete", "error", "cancelled")


def _fail(message: str, code: int = EXIT_FAIL) -> int:
    print(f"turnd: {message}", file=sys.stderr, flush=True)
    return code


def _leaf(exc: BaseException) -> BaseException:
    """The one real error inside anyio's exception groups, for a one-line report."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


# -- init --------------------------------------------------------------------------------

STARTER = """\
# turnd.toml: written by `turnd init`. Every value can be overridden by an environment
# variable TURND_<TABLE>_<KEY> (e.g. TURND_HTTP_LISTEN, TURND_TURNS_MAXSTEPS).
# Secrets are never in this file: it names the environment variables that hold them.
# Relative paths are relative to this file's directory.

[store]
kind = "local"                 # or "pds"
path = "turnd-data"            # local: data directory (records, blobs, turnd's own state)
# service = "https://pds.example.com"   # pds: the PDS URL

# [state]
# path = "turnd-data/state.sqlite3"     # turnd's own SQLite state (claims, queue, cursors)

[http]
listen = "{listen}"
# cors_origins = ["https://chat.example.com"]   # default: none (CORS off)
# web = true                                    # the built-in chat page at /
# max_body_bytes = 52428800                     # largest upload (attachments)
# allowed_hosts = ["chat.example.com"]          # Host names besides our own ("host" or "host:port")
# header_timeout = 10                           # seconds a connection has to send its request head
# max_connections = 1000                        # open at once; new ones get 503 beyond

# [xrpc]
# public_reads = false          # true: getRecord/listRecords/describeRepo/getBlob need no login

[models]
default = "{default_model}"   # provider:id, the last resort of model resolution

[turns]                        # the seed's admin settings; edits apply to the next turn
ratePerMinute = 10
maxSteps = 8
timeoutSeconds = 600
backfillMinutes = 60
maxParallelTools = 5
toolTimeoutSeconds = 30
# maxQueued = 1000             # per account waiting for the rate limit; more get an error reply
# abandonAfterMinutes = 60     # others' pending replies older than this become "abandoned"
# systemPrompt = "You are {{{{appName}}}} ... {{{{date}}}}"

# The built-in `echo` provider (echo:echo) needs no section: it is always there and
# answers with "Echo: <your message>", so the whole path can be tried without a key.
{providers}
[accounts.{name}]
handle = "{handle}"
password_env = "{password_env}"   # local store: the password createSession checks; pds: the app password
token_env = "{token_env}"         # the bearer token for /api routes
# did = "did:plc:..."                # pds: the account's DID (else resolved from the handle)
# maxStorageBytes = 1073741824       # cap on this account's blobs (413 beyond); default none

[plugins]
enabled = []                   # e.g. ["clock"]; no tool is on unless named here
"""

PROVIDER_BLOCK = """
[providers.{name}]
base_url = "{base_url}"
api_key_env = "{var}"
"""

COMMENTED_PROVIDER = """
# [providers.openai]
# base_url = "https://api.openai.com/v1"
# api_key_env = "OPENAI_API_KEY"
# models = ["gpt-4o-mini"]
"""


def cmd_init(args: argparse.Namespace) -> int:
    path, _ = resolve_config_path(args.config)
    if path.exists() and not args.force:
        return _fail(f"{path} already exists (use --force to overwrite)")
    name = args.name
    if not name.replace("_", "").isalnum():
        return _fail("--name: letters, digits and '_' only", EXIT_CONFIG)
    prefix = f"TURND_{name.upper()}"
    password_env, token_env = f"{prefix}_PASSWORD", f"{prefix}_TOKEN"
    providers, default_model = COMMENTED_PROVIDER, f"{ECHO}:{ECHO}"
    for var, (pname, base_url, model) in KNOWN_PROVIDER_KEYS.items():
        if os.environ.get(var):
            providers = PROVIDER_BLOCK.format(name=pname, base_url=base_url, var=var)
            default_model = f"{pname}:{model}"
            break
    text = STARTER.format(
        listen=args.listen,
        default_model=default_model,
        providers=providers,
        name=name,
        handle=args.handle,
        password_env=password_env,
        token_env=token_env,
    )
    password, token = secrets.token_urlsafe(18), secrets.token_urlsafe(32)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)

    # The same secrets as KEY=value lines: systemd's EnvironmentFile and `set -a; . file`.
    env_path = path.with_name("turnd.env")
    fd = os.open(env_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(f"{password_env}={password}\n{token_env}={token}\n")
    os.chmod(env_path, 0o600)  # O_CREAT's mode does not apply to an existing file

    # Create the local account: its settings space in the store (loading the config drew
    # its random DID, kept in the data directory).
    env = {**os.environ, password_env: password, token_env: token}
    try:
        config = load_config(path, env=env)
    except ConfigError as err:
        return _fail(f"config error: {err}", EXIT_CONFIG)
    did = next((a.did for a in config.accounts if a.name == name), None) or "(learned at login)"
    if config.store_kind == "local":
        anyio.run(_create_local_account, config.store_path, did)

    print(f"wrote {path}")
    print(f"account {name}: handle {args.handle}, did {did}")
    print(f"  password: {password}")
    print(f"  token:    {token}")
    print(f"These are shown once (also kept, mode 0600, in {env_path}). Before `turnd serve`:")
    print(f"  export {password_env}={password}")
    print(f"  export {token_env}={token}")
    print(f"or: set -a; . {env_path}; set +a")
    return EXIT_OK


async def _create_local_account(data_dir: Path, did: str) -> None:
    from recordstore import SETTINGS, SETTINGS_SPACE
    from recordstore.local import LocalStore

    async with LocalStore.open(data_dir) as store:
        await store.create_space(did, SETTINGS, SETTINGS_SPACE)


# -- serve -------------------------------------------------------------------------------


def cmd_serve(args: argparse.Namespace) -> int:
    from daemon.logs import setup_logging
    from daemon.service import Service, ServiceError

    try:
        config = load_config(args.config)
        created: Account | None = None
        if config.store_kind == "local" and not config.accounts:
            # First start without an account: make one, kept 0600 in the data dir.
            account, was_created = ensure_credentials(config.store_path)
            config.accounts = [account]
            config.generated_account = True
            created = account if was_created else None
        service = Service(config)
    except ConfigError as err:
        return _fail(f"config error: {err}", EXIT_CONFIG)

    setup_logging(args.log_format, secrets=config.secrets())
    if created is not None:
        print(
            f"turnd: created account {created.handle} ({created.did}) "
            f"password {created.password} token {created.token} "
            f"(shown once; kept in {config.store_path / CREDENTIALS_FILE}, mode 0600)",
            flush=True,
        )

    def ready(svc: Service) -> None:
        print(f"turnd: {_how_to_reach(svc.config, svc.port, created)}", flush=True)

    try:
        anyio.run(lambda: service.run(on_ready=ready))
    except BaseException as exc:  # noqa: BLE001 - unwrap anyio's groups for one line
        leaf = _leaf(exc)
        if isinstance(leaf, ServiceError | ConfigError):
            return _fail(str(leaf))
        if isinstance(leaf, KeyboardInterrupt):
            return 130
        raise
    return EXIT_OK


def _how_to_reach(config: Config, port: int | None, created: Account | None) -> str:
    url = config.http_url(port)
    account = config.accounts[0] if config.accounts else None
    if account is None:
        token = "no account configured"
    elif created is not None:
        token = f"token {created.token}"
    elif config.generated_account:
        token = f"token in {config.store_path / CREDENTIALS_FILE}"
    elif account.token_env:
        token = f"token in ${account.token_env}"  # the variable's name, never its value
    else:
        token = f"no token for {account.name}: set accounts.{account.name}.token_env"
    model = config.default_model
    provider = config.providers[model.split(":", 1)[0]]
    label = f" [{provider.label}]" if provider.label else ""
    return f'serving {url} ({token}; model {model}{label}); try: turnd send "hello"'


# -- send --------------------------------------------------------------------------------


def cmd_send(args: argparse.Namespace) -> int:
    try:
        config = load_config(args.config)
    except ConfigError as err:
        return _fail(f"config error: {err}", EXIT_CONFIG)
    account = _pick_account(config, args.account)
    if isinstance(account, str):
        return _fail(account, EXIT_CONFIG)
    model = None
    if args.model:
        provider, sep, model_id = args.model.partition(":")
        if not sep or not provider or not model_id:
            return _fail("--model: expected PROVIDER:ID", EXIT_CONFIG)
        model = {"provider": provider, "id": model_id}
    try:
        return anyio.run(_send, config, account, args, model)
    except BaseException as exc:  # noqa: BLE001 - one line, not a traceback
        leaf = _leaf(exc)
        if isinstance(leaf, KeyboardInterrupt):
            return 130
        if isinstance(leaf, Exception):
            return _fail(f"send failed: {_short(leaf, config.secrets())}")
        raise


def _short(exc: BaseException, secrets: Sequence[str] = ()) -> str:
    """One line for an error; a server that echoes a key back must not get it printed."""
    text = str(exc).strip().splitlines()
    line = f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")
    for secret in secrets:
        line = line.replace(secret, "[redacted]")
    return line


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
    from atproto import AsyncClient

    from recordstore import CONVERSATION_REF, INFO, MESSAGE, SETTINGS_SPACE
    from recordstore.keys import new_tid, repo_rkey

    # The stock SDK, against turnd's own XRPC (local store) or the PDS itself.
    xrpc_url = config.base_url if config.store_kind == "local" else str(config.store_service)
    client = AsyncClient(base_url=xrpc_url)
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
        parent = await _branch_tip(repo, did, skey)

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
        return _fail(f"no final reply at {reply} after {args.timeout:g}s")
    if status != "complete":
        return _fail(f"the reply ended in {status}" + (f": {error}" if error else ""))
    if args.conversation is None and config.settings().title_model != "":
        await _print_title(repo, did, skey)
    return EXIT_OK


TITLE_WAIT = 10.0  # seconds a new conversation's generated title is waited for


async def _print_title(repo: Any, did: str, skey: str) -> None:
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
        while True:
            info = await read(INFO, repo_rkey(skey, "self")) or {}
            if isinstance(info.get("title"), str) and info["title"]:
                print(f"turnd: title {info['title']!r}", file=sys.stderr, flush=True)
                return
            await anyio.sleep(0.02)


def _text_part(text: str) -> dict[str, Any]:
    return {"$type": TEXT_PART, "text": text}


def _value(response: Any) -> dict[str, Any]:
    """A record value from the SDK as a plain dict (it may be a model or a DotDict)."""
    value = response.value
    for attr in ("to_dict", "model_dump"):
        if hasattr(value, attr):
            return getattr(value, attr)()
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
    async with httpx.AsyncClient(timeout=httpx.Timeout(10, read=60)) as http:
        while True:
            status: str | None = None
            error: str | None = None
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
                except (httpx.HTTPError, ValueError):
                    pass  # not claimed yet, or the stream broke: fall back to the record
            if status in FINAL and printed:
                break
            try:
                got = await repo.get_record(
                    {"repo": did, "collection": MESSAGE, "rkey": repo_rkey(skey, reply)}
                )
                value = _value(got)
            except Exception:  # noqa: BLE001 - RecordNotFound until the claim lands
                value = {}
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


# -- check -------------------------------------------------------------------------------


def cmd_check(args: argparse.Namespace) -> int:
    try:
        config = load_config(args.config)
        from daemon.service import _load_plugins

        _load_plugins(config.plugins)
    except ConfigError as err:
        return _fail(f"config error: {err}", EXIT_CONFIG)
    where = str(config.path) if config.path else "embedded defaults (no turnd.toml)"
    print(f"ok    config    {where}")
    results = anyio.run(_checks, config)
    for ok, what, detail in results:
        print(f"{'ok' if ok else 'FAIL':<5} {what:<9} {detail}")
    return EXIT_OK if all(ok for ok, _, _ in results) else EXIT_FAIL


async def _checks(config: Config) -> list[tuple[bool, str, str]]:
    results = [await _check_store(config)]
    for provider in config.providers.values():
        results.append(await _check_provider(config, provider))
    return results


async def _check_store(config: Config) -> tuple[bool, str, str]:
    try:
        if config.store_kind == "local":
            from recordstore.local import LocalStore

            async with LocalStore.open(config.store_path):
                pass
            return True, "store", f"local {config.store_path}"
        from atproto import AsyncClient

        for account in config.accounts:
            client = AsyncClient(base_url=config.store_service)
            await client.login(account.handle, account.password, fetch_bsky_profile=False)
        return True, "store", f"pds {config.store_service} ({len(config.accounts)} accounts)"
    except Exception as err:  # noqa: BLE001 - reported, not raised
        return False, "store", f"{config.store_kind}: {_short(err, config.secrets())}"


async def _check_provider(config: Config, provider: Any) -> tuple[bool, str, str]:
    import openai

    name = f"{provider.name} [{provider.label}]" if provider.label else provider.name
    http_client = None
    where = provider.base_url
    if provider.name == ECHO:
        # The echo is served by `turnd serve`; check the same code in-process so this
        # works whether or not the daemon is running.
        from fastapi import FastAPI

        from daemon.echo import router

        app = FastAPI()
        app.include_router(router())
        http_client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app))
        where = f"{provider.base_url} (checked in-process)"
    client = openai.AsyncOpenAI(
        base_url=provider.base_url if provider.name != ECHO else "http://echo/echo/v1",
        api_key=provider.api_key or "none",
        max_retries=0,
        timeout=10,
        http_client=http_client,
    )
    try:
        ids = [m.id async for m in client.models.list()]
    except Exception as err:  # noqa: BLE001 - reported, not raised; the key is never shown
        return False, "provider", f"{name} {where}: {_short(err, config.secrets())}"
    finally:
        await client.close()
    missing = [m for m in provider.models if m not in ids]
    note = f"; not listed: {', '.join(missing)}" if missing else ""
    count = f"{len(ids)} model" + ("" if len(ids) == 1 else "s")
    return True, "provider", f"{name} {where}: {count}{note}"


# -- argparse ----------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="turnd",
        description="A self-hostable daemon answering LLM chat turns stored as AT Protocol records.",
        epilog=textwrap.dedent(
            """\
            config: --config PATH, else $TURND_CONFIG, else ./turnd.toml; with none of
            them, `serve` runs on embedded defaults (local store in ./turnd-data, the
            built-in echo provider unless OPENAI_API_KEY or OPENROUTER_API_KEY is set).
            Any value can be overridden by TURND_<TABLE>_<KEY>, e.g. TURND_HTTP_LISTEN."""
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    def command(name: str, help_text: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.add_argument("--config", metavar="PATH", help="the config file (default: see turnd -h)")
        return p

    p = command("init", "write a commented starter config and create the local account")
    p.add_argument("--handle", default="me.test", help="the account's handle (default me.test)")
    p.add_argument("--name", default="me", help="the account's table name (default me)")
    p.add_argument("--listen", default="127.0.0.1:8787", help="host:port for [http] listen")
    p.add_argument("--force", action="store_true", help="overwrite an existing config")
    p.set_defaults(func=cmd_init)

    p = command("serve", "run everything: store, change feed, turns, HTTP")
    p.add_argument(
        "--log-format", choices=("text", "json"), default="text", help="log lines (stderr)"
    )
    p.set_defaults(func=cmd_serve)

    p = command(
        "send",
        "write a user message with the stock atproto client and print the reply as it streams "
        "(exit 1 when the reply ends in error or cancelled)",
    )
    p.add_argument("text", help="the message")
    p.add_argument("--conversation", metavar="SKEY", help="continue this conversation")
    p.add_argument("--model", metavar="PROVIDER:ID", help="the model for this turn")
    p.add_argument("--effort", choices=EFFORTS, help="reasoning effort")
    p.add_argument("--account", metavar="NAME", help="the account (default: the first)")
    p.add_argument(
        "--timeout", type=float, default=660, metavar="SECONDS", help="give up after (660)"
    )
    p.set_defaults(func=cmd_send)

    p = command("check", "validate the config and reach the store and each provider")
    p.set_defaults(func=cmd_check)

    from daemon import usage_cli

    usage_cli.add_parser(sub, "the config file (default: see turnd -h)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
