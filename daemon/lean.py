"""What the ``turnd`` command can do without, kept out of its imports (SPEC §10:
``turnd send`` ≤ 0.5 s wall). :mod:`daemon.cli` imports this before anything else.

httpx imports its own command-line client (``httpx._main``: click, rich and pygments,
when they are installed) with the package. turnd never runs it, and where those are
installed (any venv with schemathesis, such as the test one) it was ~0.1-0.25 s of
`turnd send`'s own imports, a third of them. A ``None`` entry in ``sys.modules`` makes
that one import fail as if they were absent, which httpx handles: its ``main`` then
only says what to install.

FastAPI imports ``pydantic.v1`` (~0.15 s of CPU, a fifth of pydantic) the first time a
route is declared, only to refuse v1 models, which turnd has none of. Without it, its
checks (``fastapi._compat.shared``) catch the ImportError and answer "not a v1 model".
They run only for an annotation or a value that is no plain type, so no request pays.
"""

from __future__ import annotations

import sys

sys.modules.setdefault("httpx._main", None)  # type: ignore[assignment]
sys.modules.setdefault("pydantic.v1", None)  # type: ignore[assignment]
