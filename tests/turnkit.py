"""Moved to ``tests.support.turnkit``; this alias keeps test branches written before the move importing.

Import from ``tests.support.turnkit`` (see tests/support/__init__.py); this file goes once no test uses it.
"""

from tests.support.turnkit import *  # noqa: F403
