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

import logging
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import ValidationError

from daemon.accounts import Account, read_credentials
from daemon.config_file import (
    DEFAULT_DATA_DIR,
    ClusterTable,
    ConfigError,
    FileModel,
    OtelTable,
    QuotaTable,
    apply_env_overrides,
    client_host,
    first_error,
    parse_listen,
    read_toml,
)
from daemon.dids import account_did
from daemon.echo import ECHO, ECHO_MODEL, echo_provider
from daemon.reload import SettingsReloader
from plugins.sources.specs import ToolSourceSpec
from turns.limits import Quota
from turns.pricing import Price, check_price, price_from_table
from turns.settings import Provider, TurnSettings
from turns.telemetry import OtelSettings

log = logging.getLogger("turnd.config")

STATE_FILE = "state.sqlite3"

# Provider keys picked up by the embedded defaults (no config file): env var -> provider.
KNOWN_PROVIDER_KEYS: dict[str, tuple[str, str, str]] = {
    # env var: (provider name, base URL, default model id)
    "OPENAI_API_KEY": ("openai", "https://api.openai.com/v1", "gpt-4o-mini"),
    "OPENROUTER_API_KEY": ("openrouter", "https://openrouter.ai/api/v1", "openai/gpt-4o-mini"),
}


# -- the result --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Config:
    """The loaded config; never changed after loading (``dataclasses.replace`` for a variant)."""

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
    tools: list[ToolSourceSpec] = field(default_factory=list)  # [tools.NAME], in file order
    # SPEC §18: set with [cluster] redis_url_env; a secret (it may hold a password).
    redis_url: str | None = field(default=None, repr=False)
    redis_url_env: str | None = None
    warnings: list[str] = field(default_factory=list)  # e.g. unknown TURND_* variables

    @property
    def base_url(self) -> str:
        """How a client on this machine reaches turnd's HTTP server."""
        return self.http_url()

    def http_url(self, port: int | None = None) -> str:
        """The URL for ``port`` (the bound one may differ when the config says port 0)."""
        return f"http://{client_host(self.host)}:{port or self.port}"

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


# -- loading -----------------------------------------------------------------------------


def load_config(
    path: str | os.PathLike[str] | None = None,
    *,
    env: Mapping[str, str] | None = None,
) -> Config:
    """Find, parse, override and validate the config. Raises :class:`ConfigError`."""
    from daemon.config_hints import RecordingEnv, env_file_hint, unknown_variables

    raw_env = os.environ if env is None else env
    env = RecordingEnv(raw_env)  # notes what is read, for the unknown TURND_* warning
    file_path, explicit = resolve_config_path(path, env)
    if file_path.is_file():
        data = read_toml(file_path)
        config_path: Path | None = file_path.resolve()
        base_dir = file_path.resolve().parent
    elif explicit:
        raise ConfigError(f"{file_path}: config file not found")
    else:
        data = embedded_defaults(env)
        config_path = None
        base_dir = Path.cwd()
    try:
        config = build_config(data, env=env, path=config_path, base_dir=base_dir)
    except ConfigError as err:
        raise ConfigError(env_file_hint(str(err), config_path)) from None
    if config.generated_account or (config.store_kind == "local" and not config.accounts):
        # The README's `export TURND_ME_TOKEN=…` (and its password) for the generated account.
        for name in [a.name for a in config.accounts] or ["me"]:
            env.asked |= {f"TURND_{name.upper()}_TOKEN", f"TURND_{name.upper()}_PASSWORD"}
    return replace(config, warnings=unknown_variables(raw_env, env.asked))


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
        raise ConfigError(first_error(err)) from None

    try:
        turns = TurnSettings.from_toml(parsed.turns)
    except ValueError as err:
        message = str(err).splitlines()[0]
        if message.endswith(": unknown setting"):
            from daemon.config_file import _TURNS_KEYS
            from daemon.config_hints import did_you_mean

            message += did_you_mean(message.split(":")[0].removeprefix("turns."), _TURNS_KEYS)
        raise ConfigError(message) from None

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
    _check_model_ref("models.default", default_model, providers)

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

    return Config(
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
        settings=SettingsReloader(path, turns, env),
    )


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


