"""Moved to ``tests.support.reliability``; this alias keeps test branches written before the move importing.

Import from ``tests.support.reliability`` (see tests/support/__init__.py); this file goes once no test uses it.
"""

from tests.support.reliability import *  # noqa: F403
