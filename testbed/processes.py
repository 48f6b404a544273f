"""Server processes the tests or the benchmarks started: their ready line, their stop."""

from __future__ import annotations

import json
import subprocess
import threading
from collections.abc import Callable, Iterable
from typing import Any


def stop(proc: subprocess.Popen[Any], grace: float = 10.0, kill_wait: float = 10.0) -> None:
    """SIGTERM, up to ``grace`` seconds to exit, then SIGKILL; a process that already
    exited is left as it is."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(kill_wait)


def ready_line(
    lines: Iterable[str], timeout: float, is_ready: Callable[[str], bool] = lambda line: True
) -> dict[str, Any] | None:
    """The first JSON object line of a starting server's output for which ``is_ready``
    holds, decoded; ``None`` if none came within ``timeout`` seconds. The reading thread
    ends with the output (a server that keeps logging keeps it alive, as a daemon)."""
    found: list[dict[str, Any]] = []

    def read() -> None:
        for line in lines:
            line = line.strip()
            if line.startswith("{") and is_ready(line):
                found.append(json.loads(line))
                return

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    thread.join(timeout)
    return found[0] if found else None
