pytest_plugins = ["tests.pdsfixture", "tests.fakemodel"]

import pytest  # noqa: E402


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"
