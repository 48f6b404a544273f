"""Moved to ``tests.support.strategies``; this alias keeps test branches written before the move importing.

Import from ``tests.support.strategies`` (see tests/support/__init__.py); this file goes once no test uses it.
"""

from tests.support.strategies import *  # noqa: F403
