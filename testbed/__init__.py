"""Real parts on loopback that both the tests and the benchmarks start.

- ``testbed.fakemodel``: a fake OpenAI-compatible model server (real HTTP, real SSE);
  ``python -m testbed.fakemodel`` runs it as a process;
- ``testbed.pds``: installs and starts the reference ``@atproto/pds`` (``tests/pds/``);
- ``testbed.ports``: a free loopback port;
- ``testbed.processes``: a started server's ready line, and stopping it (SIGTERM, then SIGKILL);
- ``testbed.mcp_test_server``: a stdio MCP server on the official SDK that misbehaves on cue
  (the tool tests; ``bench.tools`` runs its ``echo``);
- ``testbed.otlp``: an OTLP/HTTP trace receiver decoding the protobuf (the trace tests
  and ``bench``'s OpenTelemetry figure);
- ``testbed.redis_server``: a real ``redis-server`` on a free port ([cluster], SPEC §18).

It is not part of the installed ``turnd`` package and imports nothing from ``tests`` (the
pytest fixtures that wrap these live in ``tests/support/fixtures.py``), so ``bench/`` can
use it without pytest.
"""
