"""What every ``turnd`` command shares: exit codes and the one-line failure report."""

from __future__ import annotations

import sys
from collections.abc import Sequence

EXIT_OK, EXIT_FAIL, EXIT_CONFIG = 0, 1, 2


def fail(message: str, code: int = EXIT_FAIL) -> int:
    print(f"turnd: {message}", file=sys.stderr, flush=True)
    return code


def leaf(exc: BaseException) -> BaseException:
    """The one real error inside anyio's exception groups, for a one-line report."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


def short(exc: BaseException, secrets: Sequence[str] = ()) -> str:
    """One line for an error; a server that echoes a key back must not get it printed."""
    text = str(exc).strip().splitlines()
    line = f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")
    for secret in secrets:
        line = line.replace(secret, "[redacted]")
    return line
