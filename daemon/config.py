"""``turnd.toml`` -> a validated :class:`Config` (SPEC §7).

Rules, in the order they apply:

1. The file is found from ``--config``, else ``$TURND_CONFIG``, else ``./turnd.toml``.
   When none of those names an existing file and the path was only the implicit
   ``./turnd.toml``, turnd runs on the *embedded defaults* (:func:`embedded_defaults`).
2. Any value can be overridden by an environment variable named
   ``TURND_<TABLE>_<KEY>`` (upper case, dashes as underscores), e.g.
   ``TURND_HTTP_LISTEN``, ``TURND_TURNS_MAXSTEPS`` (camelCase keys are just upper-cased),
   ``TURND_STORE_PATH``; inside named tables ``TURND_PROVIDERS_<NAME>_<KEY>`` and
   ``TURND_ACCOUNTS_<NAME>_<KEY>`` for the tables the file has. Lists take a comma-separated
   value or a JSON array. The variable wins over the file.
3. Secrets are never in the file: it names the environment variable holding each one
   (``api_key_env``, ``password_env``, ``token_env``). A named variable that is not set is a
   config error naming the key and the variable.
4. Relative paths are relative to the directory of the config file.

Every error is a :class:`ConfigError` whose message is one line naming the bad key.
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
import time
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from daemon.dids import account_did, legacy_did
from turns.limits import Quota
from turns.pricing import Price, check_price, price_from_table
from turns.settings import Provider, TurnSettings
from turns.telemetry import OtelSettings

log = logging.getLogger("turnd.config")

DEFAULT_LISTEN = "127.0.0.1:8787"
DEFAULT_DATA_DIR = "turnd-data"
STATE_FILE = "state.sqlite3"
# Where the first start keeps the generated account (0600), inside the local data dir.
CREDENTIALS_FILE = "credentials.json"
ECHO = "echo"
ECHO_LABEL = "echo (built-in test provider)"
ECHO_MODEL = "echo"
ENV_PREFIX = "TURND_"

# Provider keys picked up by the embedded defaults (no config file): env var -> provider.
KNOWN_PROVIDER_KEYS: dict[str, tuple[str, str, str]] = {
    # env var: (provider name, base URL, default model id)
    "OPENAI_API_KEY": ("openai", "https://api.openai.com/v1", "gpt-4o-mini"),
    "OPENROUTER_API_KEY": ("openrouter", "https://openrouter.ai/api/v1", "openai/gpt-4o-mini"),
}


class ConfigError(Exception):
    """A bad config; ``str(err)`` is one line naming the key."""


# -- the file's tables ------------------------------------------------------------------


class _Table(BaseModel):
    # Unknown keys are errors so a typo is named instead of silently ignored.
    model_config = ConfigDict(extra="forbid", frozen=True)


class StoreTable(_Table):
    kind: Literal["local", "pds"] = "local"
    path: str = DEFAULT_DATA_DIR
    service: str | None = None


class StateTable(_Table):
    path: str | None = None


class HttpTable(_Table):
    listen: str = DEFAULT_LISTEN
    cors_origins: list[str] = Field(default_factory=list)
    web: bool = True
    # Large enough for a 50 MB filePart upload (SPEC §2); JSON bodies are smaller anyway.
    max_body_bytes: int = Field(default=52_428_800, gt=0)
    # SPEC §12: Host names besides our own ("host" = any port, "host:port").
    allowed_hosts: list[str] = Field(default_factory=list)
    header_timeout: float = Field(default=10.0, gt=0)  # seconds to send a request head
    max_connections: int = Field(default=1000, gt=0)

    @field_validator("allowed_hosts")
    @classmethod
    def _hosts(cls, value: list[str]) -> list[str]:
        from daemon.hosts import split_host

        for entry in value:
            if not split_host(entry)[0]:
                raise ValueError(f"expected host or host:port, got {entry!r}")
        return value

    @field_validator("listen")
    @classmethod
    def _listen(cls, value: str) -> str:
        parse_listen(value)
        return value


class XrpcTable(_Table):
    # SPEC §12: the local store's XRPC reads need a login unless this is true.
    public_reads: bool = False


class ModelsTable(_Table):
    default: str | None = None
    # "provider:id" -> the models to try, in order, when it fails before its first token.
    fallbacks: dict[str, list[str]] = Field(default_factory=dict)


class ModelTable(_Table):
    """``[providers.X.model."ID"]``: what turnd knows of one model."""

    context: int | None = Field(default=None, gt=0)  # tokens (SPEC §15)
    # USD per million tokens (SPEC §16), checked in build_config so the error names the key.
    inputPrice: Any = None  # noqa: N815
    outputPrice: Any = None  # noqa: N815
    cachedInputPrice: Any = None  # noqa: N815


class ProviderTable(_Table):
    base_url: str
    api_key_env: str | None = None
    models: list[str] = Field(default_factory=list)
    label: str | None = None
    context: int | None = Field(default=None, gt=0)  # every model's, unless its own says
    model: dict[str, ModelTable] = Field(default_factory=dict)


class PresetTable(_Table):
    """``[presets.NAME]`` (SPEC §15): a starting point for a new conversation."""

    title: str | None = Field(default=None, max_length=3000)
    systemPrompt: str | None = Field(default=None, max_length=100_000)  # noqa: N815
    model: str | None = None  # "provider:id"
    template: str | None = Field(default=None, max_length=100_000)


class QuotaTable(_Table):
    tokensPerDay: Any = None
    costPerMonth: Any = None


class OtelTable(_Table):
    endpoint: str | None = None  # OTLP/HTTP, e.g. http://127.0.0.1:4318
    capture_content: bool = False
    service_name: str = "turnd"
    batch_delay_ms: int = Field(default=2000, ge=1, le=60_000)


class AccountTable(_Table):
    handle: str
    password_env: str | None = None
    token_env: str | None = None
    did: str | None = None
    # Tools offered when a message's generation request names none.
    tools: list[str] = Field(default_factory=list)
    maxStorageBytes: int | None = Field(default=None, gt=0)  # SPEC §12: caps the blobs
    quota: QuotaTable | None = None


class ClusterTable(_Table):
    # The variable holding the Redis URL (it may carry a password: never in the file).
    redis_url_env: str = Field(min_length=1)


class PluginsTable(_Table):
    enabled: list[str] = Field(default_factory=list)


class FileModel(_Table):
    store: StoreTable = Field(default_factory=StoreTable)
    state: StateTable = Field(default_factory=StateTable)
    http: HttpTable = Field(default_factory=HttpTable)
    xrpc: XrpcTable = Field(default_factory=XrpcTable)
    models: ModelsTable = Field(default_factory=ModelsTable)
    # Checked by TurnSettings.from_toml, which owns those names and defaults.
    turns: dict[str, Any] = Field(default_factory=dict)
    providers: dict[str, ProviderTable] = Field(default_factory=dict)
    accounts: dict[str, AccountTable] = Field(default_factory=dict)
    plugins: PluginsTable = Field(default_factory=PluginsTable)
    presets: dict[str, PresetTable] = Field(default_factory=dict)
    # [tools.NAME] tool sources (SPEC §14), checked by daemon.tools_config.
    tools: dict[str, Any] = Field(default_factory=dict)
    otel: OtelTable = Field(default_factory=OtelTable)
    cluster: ClusterTable | None = None


# -- the result --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Account:
    """An account turnd acts for. ``password``/``token`` are secrets: never log them."""

    name: str
    handle: str
    did: str | None
    password: str | None = field(default=None, repr=False)
    token: str | None = field(default=None, repr=False)
    # The names of the variables holding the secrets (shown in messages, never the values).
    password_env: str | None = None
    token_env: str | None = None
    tools: tuple[str, ...] = ()
    max_storage_bytes: int | None = None  # [accounts.X] maxStorageBytes
    quota: Quota | None = None


@dataclass(slots=True)
class Config:
    path: Path | None  # None: the embedded defaults
    base_dir: Path  # where relative paths start
    store_kind: Literal["local", "pds"]
    store_path: Path  # local: the data directory
    store_service: str | None  # pds: the PDS URL
    state_path: Path
    listen: str
    host: str
    port: int
    cors_origins: list[str]
    web: bool
    max_body_bytes: int
    default_model: str  # "provider:id"
    providers: dict[str, Provider]
    accounts: list[Account]
    plugins: list[str]
    turns: TurnSettings
    # name -> {title?, systemPrompt?, model?, template?} (SPEC §15), in file order.
    presets: dict[str, dict[str, str]] = field(default_factory=dict)
    # SPEC §16: "provider:id" -> Price; "provider:id" -> fallback refs; traces.
    prices: dict[str, Price] = field(default_factory=dict)
    fallbacks: dict[str, list[str]] = field(default_factory=dict)
    otel: OtelSettings | None = None
    # True when the accounts came from the generated first-start credentials file.
    generated_account: bool = False
    # Set by load_config: rereads [turns] when the file changes (at most one stat a second).
    settings: Callable[[], TurnSettings] = field(default=lambda: TurnSettings(), repr=False)
    # SPEC §12, the service's safety limits ([http] and [xrpc] keys of the same names).
    allowed_hosts: list[str] = field(default_factory=list)
    header_timeout: float = 10.0
    max_connections: int = 1000
    public_reads: bool = False
    tools: list[Any] = field(default_factory=list)  # plugins.sources specs, in file order
    # SPEC §18: set with [cluster] redis_url_env; a secret (it may hold a password).
    redis_url: str | None = field(default=None, repr=False)
    redis_url_env: str | None = None

    @property
    def base_url(self) -> str:
        """How a client on this machine reaches turnd's HTTP server."""
        return self.http_url()

    def http_url(self, port: int | None = None) -> str:
        """The URL for ``port`` (the bound one may differ when the config says port 0)."""
        return f"http://{_client_host(self.host)}:{port or self.port}"

    def secrets(self) -> list[str]:
        """Every secret value in this config, for the log redaction filter."""
        values = [p.api_key for p in self.providers.values() if p.api_key and p.name != ECHO]
        for account in self.accounts:
            values += [v for v in (account.password, account.token) if v]
        values += [v for spec in self.tools for v in spec.secrets]
        if self.redis_url:
            values.append(self.redis_url)
            password = urlsplit(self.redis_url).password
            if password:
                values.append(password)
        return values


# -- helpers -----------------------------------------------------------------------------


def local_did(handle: str) -> str:
    """The DID older turnds derived from the handle (data dirs they made keep it).

    New local accounts get a random DID kept in the data directory
    (:func:`daemon.dids.account_did`); tests pin this one with ``[accounts.X] did``.
    """
    return legacy_did(handle)


def parse_listen(value: str) -> tuple[str, int]:
    """``host:port`` or ``[v6]:port`` -> (host, port); ValueError when malformed."""
    match = re.fullmatch(r"\[([0-9A-Fa-f:.]+)\]:(\d+)|([^:\[\]\s]+):(\d+)", value)
    if not match:
        raise ValueError(f"expected host:port, got {value!r}")
    host = match.group(1) or match.group(3)
    port = int(match.group(2) or match.group(4))
    if not 0 <= port < 65536:  # 0: any free port (serve prints the one it got)
        raise ValueError(f"port {port} out of range")
    return host, port


def _client_host(host: str) -> str:
    # A wildcard bind is reached through loopback; an IPv6 literal needs brackets in a URL.
    if host in ("0.0.0.0", ""):
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    return f"[{host}]" if ":" in host else host


def resolve_config_path(
    cli_path: str | os.PathLike[str] | None, env: Mapping[str, str] | None = None
) -> tuple[Path, bool]:
    """The config file to read and whether it was named explicitly (flag or env)."""
    if cli_path:
        return Path(cli_path), True
    env = (os.environ if env is None else env).get("TURND_CONFIG")
    if env:
        return Path(env), True
    return Path("turnd.toml"), False


def _env_name(*parts: str) -> str:
    return ENV_PREFIX + "_".join(p.replace("-", "_").upper() for p in parts)


def _env_list(raw: str) -> list[str]:
    raw = raw.strip()
    if raw.startswith("["):
        value = json.loads(raw)
        if not isinstance(value, list):
            raise ValueError("expected a JSON array")
        return [str(v) for v in value]
    return [item.strip() for item in raw.split(",") if item.strip()]


def _turns_value(key: str, raw: str) -> Any:
    """Env strings -> the TOML type the [turns] key takes, so from_toml checks them alike."""
    if key in ("systemPrompt", "appName", "summaryModel", "titleModel"):
        return raw
    if raw.strip().lower() in ("true", "false"):
        return raw.strip().lower() == "true"
    try:
        return int(raw)
    except ValueError:
        try:
            return float(raw)
        except ValueError:
            return raw  # from_toml names the key and says it must be a number


_TURNS_KEYS = (
    "ratePerMinute",
    "maxSteps",
    "timeoutSeconds",
    "backfillMinutes",
    "maxParallelTools",
    "toolTimeoutSeconds",
    "retries",
    "systemPrompt",
    "appName",
    "replyReserveTokens",
    "summarize",
    "summaryModel",
    "titleModel",
    "imageMaxPixels",
    "fileTextMaxBytes",
    "maxAttachmentBytes",
    "approvalTimeoutSeconds",
    "maxQueued",
    "abandonAfterMinutes",
)


def apply_env_overrides(data: dict[str, Any], env: Mapping[str, str]) -> dict[str, Any]:
    """Overlay ``TURND_<TABLE>_<KEY>`` variables on the parsed file (a new dict).

    Only names the schema knows are looked up, so provider and account names with
    underscores stay unambiguous and unrelated ``TURND_*`` variables (secrets named by
    ``*_env``) are never read as settings.
    """
    out: dict[str, Any] = {k: (dict(v) if isinstance(v, dict) else v) for k, v in data.items()}

    def list_field(model: type[BaseModel], key: str) -> bool:
        return "list" in str(model.model_fields[key].annotation)

    simple: dict[str, type[BaseModel]] = {
        "store": StoreTable,
        "state": StateTable,
        "http": HttpTable,
        "xrpc": XrpcTable,
        "models": ModelsTable,
        "plugins": PluginsTable,
        "otel": OtelTable,
        "cluster": ClusterTable,
    }
    for table, model in simple.items():
        for key in model.model_fields:
            raw = env.get(_env_name(table, key))
            if raw is None:
                continue
            section = out.setdefault(table, {})
            if not isinstance(section, dict):
                continue  # the schema check reports a non-table
            try:
                section[key] = _env_list(raw) if list_field(model, key) else raw
            except ValueError as err:
                raise ConfigError(f"{table}.{key}: {_env_name(table, key)}: {err}") from None
    for key in _TURNS_KEYS:
        raw = env.get(_env_name("turns", key))
        if raw is not None:
            section = out.setdefault("turns", {})
            if isinstance(section, dict):
                section[key] = _turns_value(key, raw)
    for table, model in (("providers", ProviderTable), ("accounts", AccountTable)):
        named = out.get(table)
        if not isinstance(named, dict):
            continue
        for name, section in list(named.items()):
            if not isinstance(section, dict):
                continue
            section = named[name] = dict(section)
            for key in model.model_fields:
                raw = env.get(_env_name(table, name, key))
                if raw is None:
                    continue
                try:
                    section[key] = _env_list(raw) if list_field(model, key) else raw
                except ValueError as err:
                    raise ConfigError(f"{table}.{name}.{key}: {err}") from None
    return out


def _first_error(err: ValidationError) -> str:
    """Pydantic's first error as one line: ``http.listen: expected host:port ...``."""
    first = err.errors()[0]
    where = ".".join(str(p) for p in first["loc"]) or "config"
    kind = first["type"]
    if kind == "extra_forbidden":
        return f"{where}: unknown key"
    if kind == "missing":
        return f"{where}: required key is missing"
    message = first["msg"].removeprefix("Value error, ")
    return f"{where}: {message}"


def _secret(key: str, var: str | None, env: Mapping[str, str]) -> str | None:
    if var is None:
        return None
    value = env.get(var)
    if not value:
        raise ConfigError(f"{key}: environment variable {var} is not set")
    return value


def _redis_url(table: ClusterTable | None, env: Mapping[str, str]) -> str | None:
    if table is None:
        return None
    url = _secret("cluster.redis_url_env", table.redis_url_env, env)
    assert url is not None
    if urlsplit(url).scheme not in ("redis", "rediss", "unix"):
        # Never echo the value: it may hold a password.
        raise ConfigError(
            f"cluster.redis_url_env: {table.redis_url_env} must be a redis://, rediss:// or unix:// URL"
        )
    return url


def _resolve_path(base: Path, value: str) -> Path:
    path = Path(value).expanduser()
    return path if path.is_absolute() else (base / path)


def echo_provider(listen: str) -> Provider:
    host, port = parse_listen(listen)
    return Provider(
        name=ECHO,
        base_url=f"http://{_client_host(host)}:{port}/echo/v1",
        # Not a secret: the openai client insists on some key, the echo ignores it.
        api_key="echo",
        models=(ECHO_MODEL,),
        label=ECHO_LABEL,
    )


# -- embedded defaults ------------------------------------------------------------------


def embedded_defaults(env: Mapping[str, str]) -> dict[str, Any]:
    """The config used when there is no file: local store, echo unless a key is set."""
    data: dict[str, Any] = {"store": {"kind": "local", "path": DEFAULT_DATA_DIR}}
    for var, (name, base_url, model) in KNOWN_PROVIDER_KEYS.items():
        if env.get(var):
            data["providers"] = {name: {"base_url": base_url, "api_key_env": var}}
            data["models"] = {"default": f"{name}:{model}"}
            break
    return data


def read_credentials(data_dir: Path) -> Account | None:
    """The first-start account kept in ``<data>/credentials.json``, if it was made."""
    path = data_dir / CREDENTIALS_FILE
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as err:
        raise ConfigError(f"store.path: cannot read {path}: {err}") from None
    try:
        return Account(
            name=raw["name"],
            handle=raw["handle"],
            did=raw["did"],
            password=raw["password"],
            token=raw["token"],
        )
    except (KeyError, TypeError):
        raise ConfigError(f"store.path: {path} is not a turnd credentials file") from None


def ensure_credentials(
    data_dir: Path, name: str = "me", handle: str = "me.test"
) -> tuple[Account, bool]:
    """The first-start account, created (0600, never overwritten) when missing.

    Returns (account, created); the caller prints the secrets only when ``created``.
    """
    import secrets as _secrets

    existing = read_credentials(data_dir)
    if existing is not None:
        return existing, False
    data_dir.mkdir(parents=True, exist_ok=True)
    account = Account(
        name=name,
        handle=handle,
        did=account_did(data_dir, handle),
        password=_secrets.token_urlsafe(18),
        token=_secrets.token_urlsafe(32),
    )
    body = {
        "name": account.name,
        "handle": account.handle,
        "did": account.did,
        "password": account.password,
        "token": account.token,
    }
    path = data_dir / CREDENTIALS_FILE
    # O_EXCL: two processes starting at once must not each write (and print) an account.
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        again = read_credentials(data_dir)
        assert again is not None
        return again, False
    with os.fdopen(fd, "w") as fh:
        json.dump(body, fh, indent=2)
        fh.write("\n")
    return account, True


# -- loading -----------------------------------------------------------------------------


def _read_file(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as fh:
            return tomllib.load(fh)
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"{path}: not valid TOML: {err}") from None
    except OSError as err:
        raise ConfigError(f"{path}: cannot read: {err.strerror or err}") from None


def load_config(
    path: str | os.PathLike[str] | None = None,
    *,
    env: Mapping[str, str] | None = None,
) -> Config:
    """Find, parse, override and validate the config. Raises :class:`ConfigError`."""
    env = os.environ if env is None else env
    file_path, explicit = resolve_config_path(path, env)
    if file_path.is_file():
        data = _read_file(file_path)
        config_path: Path | None = file_path.resolve()
        base_dir = file_path.resolve().parent
    elif explicit:
        raise ConfigError(f"{file_path}: config file not found")
    else:
        data = embedded_defaults(env)
        config_path = None
        base_dir = Path.cwd()
    return build_config(data, env=env, path=config_path, base_dir=base_dir)


def build_config(
    data: dict[str, Any],
    *,
    env: Mapping[str, str],
    path: Path | None,
    base_dir: Path,
) -> Config:
    data = apply_env_overrides(data, env)
    try:
        parsed = FileModel.model_validate(data)
    except ValidationError as err:
        raise ConfigError(_first_error(err)) from None

    try:
        turns = TurnSettings.from_toml(parsed.turns)
    except ValueError as err:
        raise ConfigError(str(err).splitlines()[0]) from None

    store = parsed.store
    store_path = _resolve_path(base_dir, store.path)
    if store.kind == "pds" and not store.service:
        raise ConfigError('store.service: required when store.kind is "pds"')
    if parsed.state.path:
        state_path = _resolve_path(base_dir, parsed.state.path)
    elif store.kind == "local":
        state_path = store_path / STATE_FILE
    else:
        state_path = base_dir / STATE_FILE

    host, port = parse_listen(parsed.http.listen)

    providers: dict[str, Provider] = {ECHO: echo_provider(parsed.http.listen)}
    for name, table in parsed.providers.items():
        if name == ECHO:
            raise ConfigError("providers.echo: the name is reserved for the built-in echo provider")
        if not re.fullmatch(r"[A-Za-z0-9_.-]{1,128}", name):
            raise ConfigError(f"providers.{name}: name must be letters, digits, '_', '-' or '.'")
        if not table.base_url.startswith(("http://", "https://")):
            raise ConfigError(f"providers.{name}.base_url: must be an http(s) URL")
        providers[name] = Provider(
            name=name,
            base_url=table.base_url.rstrip("/"),
            api_key=_secret(f"providers.{name}.api_key_env", table.api_key_env, env),
            models=tuple(table.models),
            label=table.label,
            context=table.context,
            model_context={
                mid: m.context for mid, m in table.model.items() if m.context is not None
            },
        )

    prices: dict[str, Price] = {}
    for name, table in parsed.providers.items():
        for model_id, model_table in table.model.items():
            where = f'providers.{name}.model."{model_id}"'
            try:
                price = price_from_table(where, model_table.model_dump())
            except ValueError as err:
                raise ConfigError(str(err)) from None
            if price is not None:
                prices[f"{name}:{model_id}"] = price
    fallbacks = _fallbacks(parsed.models.fallbacks, providers)

    default_model = parsed.models.default or f"{ECHO}:{ECHO_MODEL}"
    provider_name, sep, model_id = default_model.partition(":")
    if not sep or not provider_name or not model_id:
        raise ConfigError(f'models.default: expected "provider:id", got {default_model!r}')
    if provider_name not in providers:
        known = ", ".join(sorted(providers))
        raise ConfigError(f"models.default: unknown provider {provider_name!r} (known: {known})")

    for key, ref in (("turns.summaryModel", turns.summary_model), ("turns.titleModel", turns.title_model)):
        if ref:
            _check_model_ref(key, ref, providers)
    presets: dict[str, dict[str, str]] = {}
    for name, preset in parsed.presets.items():
        if preset.model:
            _check_model_ref(f"presets.{name}.model", preset.model, providers)
        presets[name] = preset.model_dump(exclude_none=True)

    accounts: list[Account] = []
    for name, table in parsed.accounts.items():
        password = _secret(f"accounts.{name}.password_env", table.password_env, env)
        token = _secret(f"accounts.{name}.token_env", table.token_env, env)
        if store.kind == "pds" and password is None:
            raise ConfigError(
                f"accounts.{name}.password_env: required with a pds store (the app password)"
            )
        did = table.did
        if did is None and store.kind == "local":
            try:
                did = account_did(store_path, table.handle)
            except (OSError, ValueError) as err:
                raise ConfigError(f"accounts.{name}: cannot keep its DID: {err}") from None
        accounts.append(
            Account(
                name=name,
                handle=table.handle,
                did=did,
                password=password,
                token=token,
                password_env=table.password_env,
                token_env=table.token_env,
                tools=tuple(table.tools),
                max_storage_bytes=table.maxStorageBytes,
                quota=_quota(f"accounts.{name}.quota", table.quota),
            )
        )

    generated = False
    if not accounts and store.kind == "local":
        # No account configured: the one generated on first start (SPEC §7 embedded
        # defaults); `turnd serve` makes it with ensure_credentials when it is missing.
        account = read_credentials(store_path)
        if account is not None:
            accounts.append(account)
            generated = True

    from daemon.tools_config import parse_tools

    try:
        tools = parse_tools(parsed.tools, env, base_dir)
    except ValueError as err:
        raise ConfigError(str(err).splitlines()[0]) from None

    config = Config(
        path=path,
        base_dir=base_dir,
        store_kind=store.kind,
        store_path=store_path,
        store_service=store.service,
        state_path=state_path,
        listen=parsed.http.listen,
        host=host,
        port=port,
        cors_origins=list(parsed.http.cors_origins),
        web=parsed.http.web,
        max_body_bytes=parsed.http.max_body_bytes,
        default_model=default_model,
        providers=providers,
        accounts=accounts,
        plugins=list(parsed.plugins.enabled),
        turns=turns,
        presets=presets,
        prices=prices,
        fallbacks=fallbacks,
        otel=_otel(parsed.otel),
        generated_account=generated,
        allowed_hosts=list(parsed.http.allowed_hosts),
        header_timeout=parsed.http.header_timeout,
        max_connections=parsed.http.max_connections,
        public_reads=parsed.xrpc.public_reads,
        tools=tools,
        redis_url=_redis_url(parsed.cluster, env),
        redis_url_env=parsed.cluster.redis_url_env if parsed.cluster else None,
    )
    config.settings = SettingsReloader(path, turns, env)
    return config


def _check_model_ref(key: str, ref: str, providers: Mapping[str, Provider]) -> None:
    provider_name, sep, model_id = ref.partition(":")
    if not sep or not provider_name or not model_id:
        raise ConfigError(f'{key}: expected "provider:id", got {ref!r}')
    if provider_name not in providers:
        known = ", ".join(sorted(providers))
        raise ConfigError(f"{key}: unknown provider {provider_name!r} (known: {known})")


def _fallbacks(table: dict[str, list[str]], providers: Mapping[str, Provider]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for model, chain in table.items():
        for ref in (model, *chain):
            provider, sep, model_id = ref.partition(":")
            where = f'models.fallbacks."{model}"'
            if not sep or not provider or not model_id:
                raise ConfigError(f'{where}: expected "provider:id", got {ref!r}')
            if provider not in providers:
                known = ", ".join(sorted(providers))
                raise ConfigError(f"{where}: unknown provider {provider!r} (known: {known})")
        out[model] = list(chain)
    return out


def _quota(where: str, table: QuotaTable | None) -> Quota | None:
    if table is None:
        return None
    try:
        tokens = table.tokensPerDay
        cost = table.costPerMonth
        return Quota(
            tokens_per_day=None if tokens is None else check_price(f"{where}.tokensPerDay", tokens),
            cost_per_month=None if cost is None else check_price(f"{where}.costPerMonth", cost),
        )
    except ValueError as err:
        raise ConfigError(str(err)) from None


def _otel(table: OtelTable) -> OtelSettings | None:
    if not table.endpoint:
        return None
    if not table.endpoint.startswith(("http://", "https://")):
        raise ConfigError("otel.endpoint: must be an http(s) URL (OTLP/HTTP)")
    return OtelSettings(
        endpoint=table.endpoint,
        capture_content=table.capture_content,
        service_name=table.service_name,
        batch_delay_ms=table.batch_delay_ms,
    )


class SettingsReloader:
    """``settings()`` for the engine: the ``[turns]`` table, reread when the file changes.

    A turn calls it when it starts, so it stats the file at most once a second. A broken
    edit is logged and the last good settings stay in force: a typo must not stop turns.
    """

    def __init__(
        self,
        path: Path | None,
        current: TurnSettings,
        env: Mapping[str, str],
        *,
        clock: Callable[[], float] = time.monotonic,  # a test's clock lets the second pass
    ) -> None:
        self._path = path
        self._current = current
        self._env = dict(env)
        self._clock = clock
        self._checked = clock()
        self._mtime = self._stat()
        self._lock = threading.Lock()  # the engine may call from worker threads too

    def _stat(self) -> int | None:
        if self._path is None:
            return None
        try:
            return self._path.stat().st_mtime_ns
        except OSError:
            return None

    def __call__(self) -> TurnSettings:
        now = self._clock()
        if self._path is None or now - self._checked < 1.0:
            return self._current
        with self._lock:
            self._checked = now
            mtime = self._stat()
            if mtime is None or mtime == self._mtime:
                return self._current
            self._mtime = mtime
            try:
                data = apply_env_overrides(_read_file(self._path), self._env)
                table = data.get("turns", {})
                if not isinstance(table, dict):
                    raise ConfigError("turns: must be a table")
                self._current = TurnSettings.from_toml(table)
                log.info("reloaded [turns] from %s", self._path)
            except (ConfigError, ValueError) as err:
                log.error("ignoring the edited [turns] (keeping the previous settings): %s", err)
            return self._current
