pytest_plugins = ["tests.support.fixtures"]

import pytest  # noqa: E402


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Under pytest-xdist (`-n 3 --dist loadgroup`, the README's command) the tests that
    # share the session's reference PDS run on one worker, so one PDS starts, not one per
    # worker; the Chromium tests likewise keep to one worker. Without xdist: no effect.
    for item in items:
        for group in ("pds", "browser"):
            if item.get_closest_marker(group) is not None:
                item.add_marker(pytest.mark.xdist_group(group))
                break
