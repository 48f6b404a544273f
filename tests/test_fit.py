"""turns.fit: the 900 KB rule, on a real local store (blobs are really uploaded)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from recordstore.local import LocalStore
from turns.fit import RECORD_LIMIT, fit_record

pytestmark = pytest.mark.anyio

DID = "did:plc:aliceaaaaaaaaaaaaaaaaaaa"
RESULT = "network.sharedcomputer.chat.defs#toolResultPart"
TEXT = "network.sharedcomputer.chat.defs#textPart"


def record(*outputs: str, text: str = "done") -> dict[str, Any]:
    parts: list[dict[str, Any]] = [
        {"$type": RESULT, "callId": f"c{i}", "output": out} for i, out in enumerate(outputs)
    ]
    parts.append({"$type": TEXT, "text": text})
    return {"$type": "network.sharedcomputer.chat.message", "role": "assistant",
            "content": {"$type": "network.sharedcomputer.chat.defs#plainContent", "parts": parts},
            "status": "complete"}


def size(value: dict[str, Any]) -> int:
    return len(json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode())


async def test_a_record_that_fits_is_left_as_it_is(tmp_path: Path) -> None:
    value = record("small", "x" * 1000)
    async with LocalStore.open(tmp_path) as store:
        assert await fit_record(store, DID, value) is value


async def test_the_largest_outputs_move_first_and_only_as_many_as_needed(tmp_path: Path) -> None:
    # 300 + 500 + 200 KB: moving the 500 KB one alone brings it under the limit.
    sizes = [300_000, 500_000, 200_000]
    value = record(*("abc"[i] * n for i, n in enumerate(sizes)))
    assert size(value) > RECORD_LIMIT
    async with LocalStore.open(tmp_path) as store:
        fitted = await fit_record(store, DID, value)
        parts = fitted["content"]["parts"]
        moved = [i for i, p in enumerate(parts) if "outputBlob" in p]
        assert moved == [1]
        blob = await store.get_blob(DID, parts[1]["outputBlob"]["ref"]["$link"])
        assert blob == b"b" * 500_000
    assert parts[1]["output"].startswith("[500000 bytes, moved to outputBlob] bbb")
    assert len(parts[1]["output"]) < 300
    assert parts[0]["output"] == "a" * 300_000 and parts[2]["output"] == "c" * 200_000
    assert size(fitted) <= RECORD_LIMIT and fitted["status"] == "complete"
    # The caller's record is not changed.
    assert "outputBlob" not in value["content"]["parts"][1]


async def test_the_limit_is_900_kb(tmp_path: Path) -> None:
    base = size(record(""))
    async with LocalStore.open(tmp_path) as store:
        at_limit = record("x" * (RECORD_LIMIT - base))
        assert size(at_limit) == RECORD_LIMIT == 900_000
        assert await fit_record(store, DID, at_limit) is at_limit
        over = record("x" * (RECORD_LIMIT - base + 1))
        assert "outputBlob" in (await fit_record(store, DID, over))["content"]["parts"][0]


async def test_a_record_still_too_large_becomes_an_error_without_parts(tmp_path: Path) -> None:
    async with LocalStore.open(tmp_path) as store:
        fitted = await fit_record(store, DID, record(text="t" * 950_000))
    assert fitted["status"] == "error" and fitted["content"]["parts"] == []
    assert "too large" in fitted["error"]
