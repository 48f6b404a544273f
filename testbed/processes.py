"""Stopping a server process the tests or the benchmarks started."""

from __future__ import annotations

import subprocess
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
