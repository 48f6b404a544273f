"""``turnd init``: a commented starter config, its secrets in a 0600 env file, the local account."""

from __future__ import annotations

import argparse
import os
import secrets
from pathlib import Path

import anyio

from daemon.config import KNOWN_PROVIDER_KEYS, load_config, resolve_config_path
from daemon.config_file import ConfigError
from daemon.echo import ECHO
from daemon.exits import EXIT_CONFIG, EXIT_OK, fail

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
# [models.fallbacks]           # tried in order when a model fails before its first token
# "openai:gpt-4o" = ["openrouter:openai/gpt-4o"]

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
# quota = {{ tokensPerDay = 200000, costPerMonth = 5.0 }}   # UTC days and months

[plugins]
enabled = []                   # e.g. ["clock"]; no tool is on unless named here

# [otel]                       # OpenTelemetry traces over OTLP/HTTP (pip install 'turnd[otel]')
# endpoint = "http://127.0.0.1:4318"
# capture_content = false      # true: messages and tool input/output in the spans
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
# [providers.openai.model."gpt-4o-mini"]   # USD per million tokens, for /api/usage and quotas
# inputPrice = 0.15
# outputPrice = 0.6
"""


def cmd_init(args: argparse.Namespace) -> int:
    path, _ = resolve_config_path(args.config)
    if path.exists() and not args.force:
        return fail(f"{path} already exists (use --force to overwrite)")
    name = args.name
    if not name.replace("_", "").isalnum():
        return fail("--name: letters, digits and '_' only", EXIT_CONFIG)
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
        return fail(f"config error: {err}", EXIT_CONFIG)
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
    from recordstore.local import LocalStore
    from turns import account_space

    async with LocalStore.open(data_dir) as store:
        await account_space.ensure(store, did)
