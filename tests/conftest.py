pytest_plugins = ["tests.support.fixtures"]

import compileall  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("daemon", "turns", "recordstore", "plugins", "testbed", "bench", "tests")


def pytest_configure(config: pytest.Config) -> None:
    # The suite starts about 150 Python processes (`turnd serve`, `send`, `check`, the
    # fake model server…). An editable install leaves turnd's own modules uncompiled, and
    # with PYTHONDONTWRITEBYTECODE set (as on this machine) none is ever cached: each
    # process compiled all of them again, ~0.5 s of CPU per `turnd serve` start. Once,
    # before the workers start (not in each xdist worker).
    if not hasattr(config, "workerinput"):
        for package in PACKAGES:
            compileall.compile_dir(ROOT / package, quiet=1)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


# tryfirst: xdist's worker adds the ``@group`` suffix to each node id in its own
# collection hook, which pytest calls before this conftest's unless this one goes first
# (without it no group ever took effect and each worker started its own PDS).
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Under pytest-xdist (`-n 3 --dist loadgroup`, the README's command) a worker group is
    # a unit of work that one worker runs whole:
    # - the tests sharing the session's reference PDS (marker `pds`): one PDS starts;
    # - each module whose tests share a module-scoped fixture (a `turnd serve`, Chromium,
    #   an MCP server): it starts once, not once per worker that got one of its tests.
    # Everything else is spread test by test. xdist hands the largest groups out first.
    # Without xdist: no effect.
    for item in items:
        if item.get_closest_marker("pds") is not None:
            item.add_marker(pytest.mark.xdist_group("pds"))
        elif _uses_module_fixture(item):
            item.add_marker(pytest.mark.xdist_group(item.module.__name__))


def _uses_module_fixture(item: pytest.Item) -> bool:
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return False
    # The last definition of a name is the one the test gets (a conftest's overrides a
    # plugin's, as `anyio_backend` above overrides anyio's module-scoped one).
    return any(defs and defs[-1].scope == "module" for defs in info.name2fixturedefs.values())
