"""Shared pieces of the test suites, one job a module.

- ``fixtures``: the pytest fixtures (``fake_model``/``fake``, ``pds``, ``pds_account``,
  ``redis_server``, ``serve``), loaded by ``tests/conftest.py``; the servers they start are
  in the ``testbed`` package;
- ``records``: record builders and readers (user messages, text parts, reply text);
- ``feeds``: reading a store's change feed (the next ``n`` changes, within a deadline);
- ``sse``: the one reader of ``text/event-stream`` replies (on ``httpx-sse``);
- ``accounts``: the test accounts alice and bob (DIDs, passwords, tokens);
- ``daemon``: the whole daemon in this process on loopback (HTTP, SSE, XRPC tests);
- ``turnkit``: a turn engine on a real local store (turn tests);
- ``cli``: the ``turnd`` console script in subprocesses (``turnd(...)``, ``Served``,
  ``wait_healthy``, config files for the account ``me``);
- ``reliability``: real ``turnd serve`` processes with their own config and a fake model
  in its own process;
- ``browser``: the web page in Chromium (Playwright): the ``browser`` fixture, ``turnd_serve``,
  the page helpers the browser test modules share;
- ``http_tools``: a real HTTP tool server (seed 000's ``handler_type: http``);
- ``disk``: a small tmpfs for the full-disk cases;
- ``strategies``: hypothesis strategies for valid records.

A free port is ``testbed.ports.free_port``; the fake model server is ``testbed.fakemodel``.
"""
