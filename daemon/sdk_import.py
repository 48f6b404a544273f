"""Importing the atproto SDK for ``turnd send`` without building models it never uses.

SPEC §10 wants ``turnd send`` under 0.5 s wall, and importing ``atproto_client`` took
0.75 s of a 0.85 s command. Nearly all of it is the SDK's generated namespaces
(``atproto_client.namespaces.async_ns`` and ``sync_ns``, both imported by the
package): every method's signature names ``models.<Lexicon>.Params`` unquoted, Python
evaluates annotations when it defines a function, and each ``models.<Lexicon>`` is a
lazy accessor that imports that lexicon's module and builds its pydantic models. That
is 379 modules and 664 models for the two or three methods ``turnd send`` calls.

:func:`postpone_namespace_annotations` loads those two modules as if they began with
``from __future__ import annotations`` (PEP 563): their annotations stay strings, the
code is otherwise the one the SDK ships, and the models of a method are built when it
first runs, as the SDK's own loader intends. Nothing in the SDK reads those
annotations at run time. The compiled code is kept next to the SDK's own bytecode,
under a tag of its own, so the compile (~65 ms a module) is paid once; not written
when Python is told not to write bytecode (``PYTHONDONTWRITEBYTECODE``), as CPython
would not write its own.

``sync_ns`` is also loaded lazily (``importlib.util.LazyLoader``): the package imports
it for the blocking ``Client``, which ``turnd send`` never makes, so its code runs only
if something touches it.
"""

from __future__ import annotations
import __future__

import contextlib
import importlib.abc
import importlib.machinery
import importlib.util
import marshal
import os
import sys
from types import CodeType

ASYNC_NAMESPACES = "atproto_client.namespaces.async_ns"
SYNC_NAMESPACES = "atproto_client.namespaces.sync_ns"
NAMESPACES = (ASYNC_NAMESPACES, SYNC_NAMESPACES)
_CACHE_TAG = "postponed"  # the pyc's "optimization" slot: names a file apart from CPython's


def postpone_namespace_annotations() -> None:
    """Make the next import of the SDK's namespaces leave their annotations unevaluated.

    A no-op once they are imported (a test process, or the daemon itself) or installed.
    """
    if any(name in sys.modules for name in NAMESPACES):
        return
    if not any(isinstance(finder, PostponedFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, PostponedFinder(NAMESPACES, lazy=(SYNC_NAMESPACES,)))


class PostponedFinder(importlib.abc.MetaPathFinder):
    """Finds the named source modules and loads them with postponed annotations; those
    named in ``lazy`` when their module is first used rather than when imported."""

    def __init__(self, names: tuple[str, ...], *, lazy: tuple[str, ...] = ()) -> None:
        self._names = frozenset(names)
        self._lazy = frozenset(lazy)

    def find_spec(self, fullname, path, target=None):  # noqa: ANN001, ANN201 - importlib's
        if fullname not in self._names:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.origin is None or not spec.origin.endswith(".py"):
            return spec  # not the source layout this knows: import it as shipped
        loader = _PostponedLoader(fullname, spec.origin)
        spec.loader = importlib.util.LazyLoader(loader) if fullname in self._lazy else loader
        return spec


class _PostponedLoader(importlib.machinery.SourceFileLoader):
    def get_code(self, fullname: str) -> CodeType:
        source_path = self.get_filename(fullname)
        stats = os.stat(source_path)
        key = (importlib.util.MAGIC_NUMBER, stats.st_mtime_ns, stats.st_size)
        cache_path = importlib.util.cache_from_source(source_path, optimization=_CACHE_TAG)
        try:
            with open(cache_path, "rb") as cached:
                stored_key, code = marshal.load(cached)
            if stored_key == key and isinstance(code, CodeType):
                return code
        except (OSError, EOFError, ValueError, TypeError):
            pass  # absent, stale or torn: compile again
        code = compile(
            self.get_data(source_path),
            source_path,
            "exec",
            flags=__future__.annotations.compiler_flag,
            dont_inherit=True,
        )
        _store(cache_path, marshal.dumps((key, code)))
        return code


def _store(cache_path: str, data: bytes) -> None:
    """Write the cache atomically; a read-only install just compiles each time."""
    if sys.dont_write_bytecode:
        return
    partial = f"{cache_path}.{os.getpid()}.tmp"
    try:
        os.makedirs(os.path.dirname(cache_path), exist_ok=True)
        with open(partial, "wb") as out:
            out.write(data)
        os.replace(partial, cache_path)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(partial)
