"""Shared pieces of the test suites, one job a module.

- ``fixtures``: the pytest fixtures (``fake_model``, ``pds``, ``pds_account``), loaded by
  ``tests/conftest.py``; the servers they start are in the ``testbed`` package;
- ``records``: record builders and readers (user messages, text parts, reply text);
- ``sse``: the one reader of ``text/event-stream`` replies (on ``httpx-sse``);
- ``daemon``: the whole daemon in this process on loopback (HTTP, SSE, XRPC tests);
- ``turnkit``: a turn engine on a real local store (turn tests);
- ``reliability``: real ``turnd serve`` processes and a fake model in its own process;
- ``strategies``: hypothesis strategies for valid records.

A free port is ``testbed.ports.free_port``; the fake model server is ``testbed.fakemodel``.
"""
