"""The reasoning efforts a request may name, listed once (the HTTP API and the CLI take
these). Its own module so that ``turnd send`` can offer them without importing openai."""

from __future__ import annotations

from typing import Literal, get_args

Effort = Literal["none", "low", "medium", "high", "max"]
EFFORTS: tuple[str, ...] = get_args(Effort)
