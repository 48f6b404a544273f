"""Moved to ``testbed.fakemodel``; this alias keeps test branches written before the move importing.

Import from ``testbed.fakemodel`` (see tests/support/__init__.py); this file goes once no test uses it.
"""

from testbed.fakemodel import *  # noqa: F403
