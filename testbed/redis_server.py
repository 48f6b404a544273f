"""A real ``redis-server`` (Debian's package) on a free loopback port ([cluster] tests, bench).

No persistence: a restart after ``kill()`` comes back empty, the harder case for
turnd (every stream and counter on Redis is gone).
"""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

from testbed.ports import free_port
from testbed.processes import stop

REDIS_SERVER = shutil.which("redis-server") or "/usr/bin/redis-server"


class RedisServer:
    def __init__(self, work: Path, port: int | None = None) -> None:
        self.work = work
        self.port = port or free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.runs = 0

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 10) -> RedisServer:
        self.runs += 1
        log = (self.work / f"redis.{self.runs}.log").open("wb")
        self.proc = subprocess.Popen(
            [
                REDIS_SERVER,
                "--port", str(self.port),
                "--bind", "127.0.0.1",
                "--save", "",
                "--appendonly", "no",
                "--dir", str(self.work),
                "--protected-mode", "no",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.ping():
                return self
            if self.proc.poll() is not None:
                raise AssertionError(f"redis-server exited {self.proc.returncode}")
            time.sleep(0.02)
        raise AssertionError(f"redis-server not answering on {self.port} after {timeout}s")

    def ping(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                s.sendall(b"PING\r\n")
                return s.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None:
            stop(self.proc)
