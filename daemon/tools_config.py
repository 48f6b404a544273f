"""``[tools.NAME]`` tables -> tool source specs (SPEC §14).

Every mistake is a ``ValueError`` whose message is one line naming the key
(``tools.time.command: ...``); the config turns it into a config error (exit 2).
Secrets are never in the file: ``env_from`` and ``headers_from`` name the variables
holding them, and a variable that is not set is an error naming both.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from plugins.sources.naming import SOURCE_NAME
from plugins.sources.specs import HttpToolSpec, McpHttpSpec, McpStdioSpec, ToolSourceSpec


class _ToolTable(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    kind: Literal["mcp", "http"]
    # mcp over stdio
    command: str | None = Field(default=None, min_length=1)
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    env_from: dict[str, str] = Field(default_factory=dict)
    cwd: str | None = None
    # mcp over streamable HTTP, and http tools
    url: str | None = None
    headers_from: dict[str, str] = Field(default_factory=dict)
    # http tools
    description: str | None = Field(default=None, max_length=1024)
    parameters: dict[str, Any] | None = None
    # every kind
    approval: Literal["never", "always"] | list[str] = "never"
    timeoutSeconds: float | None = Field(default=None, gt=0)  # noqa: N815 - the file's name


def parse_tools(
    tables: Mapping[str, Any], env: Mapping[str, str], base_dir: str | os.PathLike[str]
) -> list[ToolSourceSpec]:
    """The ``[tools]`` table, validated, in file order."""
    specs: list[ToolSourceSpec] = []
    for name, raw in tables.items():
        where = f"tools.{name}"
        if not SOURCE_NAME.fullmatch(name):
            raise ValueError(f"{where}: a tool source's name is 1-32 letters, digits, '_' or '-'")
        if not isinstance(raw, Mapping):
            raise ValueError(f"{where}: must be a table")
        try:
            table = _ToolTable.model_validate(dict(raw))
        except ValidationError as err:
            first = err.errors()[0]
            key = str(first["loc"][0]) if first["loc"] else "?"  # not a union member's tag
            if key == "approval":
                raise ValueError(
                    f'{where}.approval: must be "never", "always" or a list of tool names'
                ) from None
            if first["type"] == "extra_forbidden":
                raise ValueError(f"{where}.{key}: unknown key") from None
            if first["type"] == "missing":
                raise ValueError(f"{where}.{key}: required key is missing") from None
            raise ValueError(f"{where}.{key}: {first['msg']}") from None
        specs.append(_spec(name, table, env, base_dir))
    return specs


def _spec(
    name: str, table: _ToolTable, env: Mapping[str, str], base_dir: str | os.PathLike[str]
) -> ToolSourceSpec:
    where = f"tools.{name}"
    approval = table.approval if isinstance(table.approval, str) else tuple(table.approval)
    common: dict[str, Any] = {
        "name": name,
        "approval": approval,
        "timeout_seconds": table.timeoutSeconds,
    }
    headers = _secrets(f"{where}.headers_from", table.headers_from, env)
    common["secrets"] = tuple(headers.values())
    if table.url is not None and not table.url.startswith(("http://", "https://")):
        raise ValueError(f"{where}.url: must be an http(s) URL")
    if table.kind == "http":
        for key, given in (("command", table.command), ("cwd", table.cwd)):
            if given is not None:
                raise ValueError(f"{where}.{key}: not a key of an http tool (kind = \"http\")")
        if table.args or table.env or table.env_from:
            raise ValueError(f"{where}: args, env and env_from are for MCP servers over stdio")
        if table.url is None:
            raise ValueError(f"{where}.url: required for an http tool")
        parameters = table.parameters or {"type": "object", "properties": {}}
        if parameters.get("type") != "object":
            raise ValueError(f'{where}.parameters: must be a JSON schema with type = "object"')
        return HttpToolSpec(
            **common,
            url=table.url,
            description=table.description or f"The {name} tool",
            parameters=parameters,
            headers=headers,
        )
    if table.description is not None or table.parameters is not None:
        raise ValueError(f"{where}: description and parameters come from the MCP server")
    if (table.command is None) == (table.url is None):
        raise ValueError(f"{where}.command: an MCP source has either command (stdio) or url (HTTP)")
    if table.url is not None:
        if table.args or table.env or table.env_from or table.cwd:
            raise ValueError(f"{where}: args, env, env_from and cwd are for MCP servers over stdio")
        return McpHttpSpec(**common, url=table.url, headers=headers)
    if table.headers_from:
        raise ValueError(f"{where}.headers_from: only for MCP servers over HTTP (url)")
    assert table.command is not None
    cwd = None
    if table.cwd is not None:
        cwd = str(os.path.join(base_dir, os.path.expanduser(table.cwd)))
        if not os.path.isdir(cwd):
            raise ValueError(f"{where}.cwd: no directory {cwd}")
    path = {**table.env}.get("PATH") or env.get("PATH") or os.defpath
    if shutil.which(table.command, path=path) is None and shutil.which(
        os.path.join(cwd or str(base_dir), table.command)
    ) is None:
        raise ValueError(f"{where}.command: {table.command!r} is not an executable on PATH")
    secret_env = _secrets(f"{where}.env_from", table.env_from, env)
    common["secrets"] = tuple(secret_env.values())
    return McpStdioSpec(
        **common,
        command=table.command,
        args=tuple(table.args),
        env={**table.env, **secret_env},
        cwd=cwd,
    )


def _secrets(where: str, names: Mapping[str, str], env: Mapping[str, str]) -> dict[str, str]:
    out = {}
    for key, var in names.items():
        value = env.get(var)
        if not value:
            raise ValueError(f"{where}.{key}: environment variable {var} is not set")
        out[key] = value
    return out


def tool_secrets(specs: list[ToolSourceSpec]) -> list[str]:
    """Every secret value in the tool sources, for the log redaction filter."""
    return [value for spec in specs for value in spec.secrets]
