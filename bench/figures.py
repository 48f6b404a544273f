"""How a ``python -m bench.<name>`` ends: its figures, one a line, then optionally as JSON."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any


def print_figures(figures: Mapping[str, Any], *, as_json: bool, width: int) -> None:
    """Each figure as ``name value`` (names padded to ``width``); with ``as_json`` the
    whole mapping again as one JSON line, for scripts."""
    for key, value in figures.items():
        print(f"{key:<{width}} {value}")
    if as_json:
        print(json.dumps(dict(figures)))
