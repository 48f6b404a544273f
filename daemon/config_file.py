"""The shape of ``turnd.toml`` (its tables, checked by pydantic) and the environment overrides.

:mod:`daemon.config` turns a file that passed these checks into a :class:`~daemon.config.Config`.
"""

from __future__ import annotations

import json
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

DEFAULT_LISTEN = "127.0.0.1:8787"
DEFAULT_DATA_DIR = "turnd-data"
ENV_PREFIX = "TURND_"


class ConfigError(Exception):
    """A bad config; ``str(err)`` is one line naming the key."""


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


def client_host(host: str) -> str:
    # A wildcard bind is reached through loopback; an IPv6 literal needs brackets in a URL.
    if host in ("0.0.0.0", ""):
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    return f"[{host}]" if ":" in host else host


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




# -- environment overrides ----------------------------------------------------------------


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


def first_error(err: ValidationError) -> str:
    """Pydantic's first error as one line: ``http.listen: expected host:port ...``."""
    first = err.errors()[0]
    where = ".".join(str(p) for p in first["loc"]) or "config"
    kind = first["type"]
    if kind == "extra_forbidden":
        from daemon.config_hints import did_you_mean, known_keys

        hint = did_you_mean(str(first["loc"][-1]), known_keys(FileModel, tuple(first["loc"])))
        return f"{where}: unknown key{hint}"
    if kind == "missing":
        return f"{where}: required key is missing"
    message = first["msg"].removeprefix("Value error, ")
    return f"{where}: {message}"


def read_toml(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as fh:
            return tomllib.load(fh)
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"{path}: not valid TOML: {err}") from None
    except OSError as err:
        raise ConfigError(f"{path}: cannot read: {err.strerror or err}") from None


