"""Offered tool names: ``<source>_<tool>``, in the characters providers accept, at most 64
of them (OpenAI's limit for a function name), unique within the daemon."""

from __future__ import annotations

import hashlib
import re

MAX_NAME = 64
_BAD = re.compile(r"[^A-Za-z0-9_-]")
SOURCE_NAME = re.compile(r"[A-Za-z0-9_-]{1,32}")


def offered_name(source: str, tool: str | None, taken: set[str]) -> str:
    """The name the model sees for ``tool`` of ``source`` (``source`` alone for an HTTP tool).

    Characters outside ``[A-Za-z0-9_-]`` become ``_``; a name that is too long, or that
    collides with one already ``taken``, is cut and ends in a short hash of the original,
    so the same server tool keeps the same name across restarts.
    """
    original = source if tool is None else f"{source}_{tool}"
    name = _BAD.sub("_", original)
    if len(name) <= MAX_NAME and name not in taken:
        return name
    digest = hashlib.sha256(original.encode()).hexdigest()
    for width in (8, 12, 16, 64):
        candidate = f"{name[: MAX_NAME - width - 1]}_{digest[:width]}"
        if candidate not in taken:
            return candidate
    raise ValueError(f"cannot name {original!r} uniquely")  # pragma: no cover - 2^256
