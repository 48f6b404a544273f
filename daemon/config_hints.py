"""What a config error or a stray variable points the user at (SPEC §17).

- a misspelt key gets the nearest known one ("did you mean `listen`?", by difflib);
- a ``TURND_*`` variable nothing reads is reported, with the nearest one that is read;
- a secret's variable that is not set, when ``turnd init``'s ``turnd.env`` beside the
  config holds it, points at that file.
"""

from __future__ import annotations

import difflib
import re
import types
import typing
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel

ENV_PREFIX = "TURND_"
# Variables read by the tools around turnd (bench, the test fixtures, the docs'
# examples), not by the daemon itself: never warned about.
_NOT_OURS = ("TURND_BENCH_", "TURND_SKIP_", "TURND_PDS_", "TURND_MCP_", "TURND_URL")
ENV_FILE = "turnd.env"  # written by `turnd init` beside the config


def did_you_mean(word: str, known: Iterable[str]) -> str:
    """`` (did you mean `x`?)`` for the nearest of ``known``, else ``""``."""
    close = difflib.get_close_matches(word, list(known), n=1, cutoff=0.6)
    if not close:
        # Case-only slips (MaxSteps for maxSteps) score low on the raw strings.
        lowered = {k.lower(): k for k in known}
        close = [lowered[c] for c in difflib.get_close_matches(word.lower(), lowered, n=1)]
    return f" (did you mean `{close[0]}`?)" if close else ""


def _model_of(annotation: Any) -> tuple[type[BaseModel] | None, bool]:
    """(the table model, whether it sits under a name: ``dict[str, Model]``)."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        for arg in typing.get_args(annotation):
            found = _model_of(arg)
            if found[0] is not None:
                return found
        return None, False
    if origin is dict:
        args = typing.get_args(annotation)
        inner = args[1] if len(args) == 2 else None
        if isinstance(inner, type) and issubclass(inner, BaseModel):
            return inner, True
        return None, False
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation, False
    return None, False


def known_keys(root: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    """The keys the table at ``loc[:-1]`` knows, following the schema from ``root``."""
    model: type[BaseModel] | None = root
    parts = list(loc[:-1])
    while parts and model is not None:
        name = str(parts.pop(0))
        info = model.model_fields.get(name)
        if info is None:
            return []
        model, named = _model_of(info.annotation)
        if named and parts:
            parts.pop(0)  # the table's own name: [providers.NAME]
        elif named:
            return []
    return list(model.model_fields) if model is not None else []


class RecordingEnv(Mapping[str, str]):
    """The environment, noting every name the config looked up."""

    def __init__(self, env: Mapping[str, str]) -> None:
        self._env = env
        self.asked: set[str] = set()

    def __getitem__(self, key: str) -> str:
        # Not noted: dict(env) (the [turns] reloader's copy) reads every item this way.
        return self._env[key]

    def get(self, key: str, default: Any = None) -> Any:  # type: ignore[override]
        self.asked.add(key)
        return self._env.get(key, default)

    def __contains__(self, key: object) -> bool:
        if isinstance(key, str):
            self.asked.add(key)
        return key in self._env

    def __iter__(self) -> Iterator[str]:
        return iter(self._env)

    def __len__(self) -> int:
        return len(self._env)


def unknown_variables(env: Mapping[str, str], asked: set[str]) -> list[str]:
    """One warning line per ``TURND_*`` variable set but never read by the config.

    ``asked`` holds every override name the config looked up (all of each table's
    keys), so it doubles as the list to suggest from.
    """
    known = sorted(a for a in asked if a.startswith(ENV_PREFIX))
    out = []
    for name in sorted(env):
        if not name.startswith(ENV_PREFIX) or name in asked or name.startswith(_NOT_OURS):
            continue
        out.append(f"unknown variable {name}, ignored{did_you_mean(name, known)}")
    return out


_NOT_SET = re.compile(r"environment variable (\S+) is not set$")


def env_file_hint(message: str, config_path: Path | None) -> str:
    """The message, pointing at ``turnd.env`` when it holds the missing variable."""
    found = _NOT_SET.search(message)
    if not found or config_path is None:
        return message
    env_file = config_path.with_name(ENV_FILE)
    try:
        lines = env_file.read_text().splitlines()
    except OSError:
        return message
    if not any(line.startswith(f"{found.group(1)}=") for line in lines):
        return message
    return f"{message}: it is in {env_file} (`turnd init` wrote it); run `set -a; . {env_file}; set +a` first"
