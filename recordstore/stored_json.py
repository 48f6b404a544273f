"""Reading a stored record's JSON text back into a value.

A turn reads its whole conversation back (SPEC §5's load), so parsing stored records
was ~9 % of turnd's CPU on short turns. ``jiter`` (already here as the ``openai``
client's parser) reads a record in ~2 µs where ``json.loads`` takes ~7.5, and gives
the same values for everything the store writes (the AT Protocol data model has no
floats; integers of any size, escapes and non-ASCII text all round-trip). What it
refuses and ``json`` reads, a lone surrogate escape (``"\\ud800"``), goes to ``json``.

Only keys are cached: jiter's default (``cache_mode="all"``) also keeps values in a
process-wide cache of 16,384 strings, ~1.5 MB of texts and CIDs that would stay alive
(SPEC §10's RSS growth).
"""

from __future__ import annotations

import json
from typing import Any

import jiter

__all__ = ["parse"]


def parse(text: str) -> Any:
    """The value of a stored record's JSON text, as ``json.loads`` would give it."""
    try:
        return jiter.from_json(text.encode(), cache_mode="keys")
    except (ValueError, UnicodeEncodeError):
        return json.loads(text)
