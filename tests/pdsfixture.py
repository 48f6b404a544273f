"""Moved to ``testbed.pds``; this alias keeps test branches written before the move importing.

Import from ``testbed.pds`` (see tests/support/__init__.py); this file goes once no test uses it.
"""

from testbed.pds import *  # noqa: F403
