"""What a ``[tools.NAME]`` table says, validated: one spec per tool source.

The daemon's config parses the tables into these; the sources are built from them.
Secret values (``env_from``, ``headers_from``) are resolved by the config and kept out
of every repr, so a spec can be logged.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from typing import Any, Literal

Approval = Literal["never", "always"] | tuple[str, ...]


@dataclass(frozen=True, slots=True)
class SourceSpec:
    name: str
    approval: Approval = "never"
    timeout_seconds: float | None = None  # wins over [turns] toolTimeoutSeconds
    # The values that came from env_from / headers_from, for the log redaction filter.
    secrets: tuple[str, ...] = field(default=(), repr=False)

    def needs_approval(self, offered: str, remote: str) -> bool:
        """``always``, ``never``, or a list of tool names (offered or the server's own) or globs."""
        if self.approval == "always":
            return True
        if self.approval == "never":
            return False
        return any(fnmatchcase(offered, p) or fnmatchcase(remote, p) for p in self.approval)


@dataclass(frozen=True, slots=True)
class McpStdioSpec(SourceSpec):
    command: str = ""
    args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict, repr=False)  # plain values and env_from
    cwd: str | None = None


@dataclass(frozen=True, slots=True)
class McpHttpSpec(SourceSpec):
    url: str = ""
    headers: dict[str, str] = field(default_factory=dict, repr=False)  # from headers_from


@dataclass(frozen=True, slots=True)
class HttpToolSpec(SourceSpec):
    url: str = ""
    description: str = ""
    parameters: dict[str, Any] = field(
        default_factory=lambda: {"type": "object", "properties": {}}
    )
    headers: dict[str, str] = field(default_factory=dict, repr=False)


ToolSourceSpec = McpStdioSpec | McpHttpSpec | HttpToolSpec
