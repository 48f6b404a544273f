"""What one turn costs, counted (never timed): connections to the model, store reads.

SPEC §10: nothing per turn makes a round trip it does not need. Counts are exact, so
they are asserted; the time each one takes is the bench's (``bench/``).
"""

from __future__ import annotations

import pytest

from testbed.fakemodel import FakeModel, Reply
from tests.support.records import text_part
from tests.support.turnkit import DID, turn_kit

pytestmark = pytest.mark.anyio


@pytest.fixture
def fake():
    with FakeModel() as server:
        yield server


async def test_consecutive_turns_reuse_one_connection_to_the_model(tmp_path, fake):
    async with turn_kit(tmp_path, fake) as kit:
        skey = await kit.conversation(title="t")
        for text in ("one", "two", "three"):
            fake.push(Reply.text([text, "!"]))
            posted = await kit.engine.post_message(
                DID, skey, parent=None, parts=[text_part("hi")], generation={}
            )
            final = await kit.reply(skey, posted.reply_key)
            assert final["status"] == "complete"
        # Each stream was read to its end, so its connection went back to the pool.
        assert fake.request_count == 3
        assert fake.connections == 1
