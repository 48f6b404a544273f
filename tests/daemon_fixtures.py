"""Moved to ``tests.support.daemon``; this alias keeps test branches written before the move importing.

Import from ``tests.support.daemon`` (see tests/support/__init__.py); this file goes once no test uses it.
"""

from tests.support.daemon import *  # noqa: F403
from tests.support.sse import read_events as sse_events  # noqa: E402, F401
