"""Finding plugins: the ``turnd.plugins`` entry-point group and names in the config."""

from __future__ import annotations

import importlib
from importlib.metadata import entry_points

from plugins.api import Plugin
from plugins.hooks import PluginSet

GROUP = "turnd.plugins"


class PluginLoadError(Exception):
    pass


def _resolve(target: object, name: str) -> Plugin:
    plugin = target() if callable(target) and not isinstance(target, Plugin) else target
    if not isinstance(plugin, Plugin):
        raise PluginLoadError(f"plugin {name!r} is not a plugins.api.Plugin")
    return plugin


def load_plugins(enabled: list[str]) -> PluginSet:
    """Load the plugins named in ``enabled``, in that order.

    A name is an entry point of the group ``turnd.plugins`` or ``module:attribute``.
    Nothing is loaded unless named: no tool is on by default.
    """
    points = {ep.name: ep for ep in entry_points(group=GROUP)}
    plugins: list[Plugin] = []
    for name in enabled:
        try:
            if name in points:
                target = points[name].load()
            elif ":" in name:
                module, _, attr = name.partition(":")
                target = getattr(importlib.import_module(module), attr)
            else:
                raise PluginLoadError(f"unknown plugin {name!r}")
        except PluginLoadError:
            raise
        except Exception as exc:
            raise PluginLoadError(f"plugin {name!r} failed to load: {exc}") from exc
        plugins.append(_resolve(target, name))
    return PluginSet(plugins)
