"""What the ``turnd`` command can do without, kept out of its imports (SPEC §10:
``turnd send`` ≤ 0.5 s wall). :mod:`daemon.cli` imports this before anything else.

httpx imports its own command-line client (``httpx._main``: click, rich and pygments,
when they are installed) with the package. turnd never runs it, and where those are
installed (any venv with schemathesis, such as the test one) it was ~0.1-0.25 s of
`turnd send`'s own imports, a third of them. A ``None`` entry in ``sys.modules`` makes
that one import fail as if they were absent, which httpx handles: its ``main`` then
only says what to install.
"""

from __future__ import annotations

import sys

sys.modules.setdefault("httpx._main", None)  # type: ignore[assignment]
