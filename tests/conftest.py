pytest_plugins = ["tests.support.fixtures"]

import pytest  # noqa: E402


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"
