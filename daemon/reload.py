"""``[turns]`` reread when turnd.toml changes, so a running daemon takes an edit."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from daemon.config_file import ConfigError, apply_env_overrides, read_toml
from turns.settings import TurnSettings

log = logging.getLogger("turnd.config")


class SettingsReloader:
    """``settings()`` for the engine: the ``[turns]`` table, reread when the file changes.

    A turn calls it when it starts, so it stats the file at most once a second. A broken
    edit is logged and the last good settings stay in force: a typo must not stop turns.
    """

    def __init__(
        self,
        path: Path | None,
        current: TurnSettings,
        env: Mapping[str, str],
        *,
        clock: Callable[[], float] = time.monotonic,  # a test's clock lets the second pass
    ) -> None:
        self._path = path
        self._current = current
        self._env = dict(env)
        self._clock = clock
        self._checked = clock()
        self._mtime = self._stat()
        self._lock = threading.Lock()  # the engine may call from worker threads too

    def _stat(self) -> int | None:
        if self._path is None:
            return None
        try:
            return self._path.stat().st_mtime_ns
        except OSError:
            return None

    def __call__(self) -> TurnSettings:
        now = self._clock()
        if self._path is None or now - self._checked < 1.0:
            return self._current
        with self._lock:
            self._checked = now
            mtime = self._stat()
            if mtime is None or mtime == self._mtime:
                return self._current
            self._mtime = mtime
            try:
                data = apply_env_overrides(read_toml(self._path), self._env)
                table = data.get("turns", {})
                if not isinstance(table, dict):
                    raise ConfigError("turns: must be a table")
                self._current = TurnSettings.from_toml(table)
                log.info("reloaded [turns] from %s", self._path)
            except (ConfigError, ValueError) as err:
                log.error("ignoring the edited [turns] (keeping the previous settings): %s", err)
            return self._current
