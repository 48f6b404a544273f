"""The seed's size rule: a reply record stays under 900 KB of JSON.

The largest tool outputs move to ``outputBlob`` blobs, a short summary left in
``output``; a record still too large keeps the parts that fit, cut at a part boundary, as an
``error`` saying where it was cut.
"""

from __future__ import annotations

from typing import Any

from recordstore import RecordStore
from turns.parts import TOOL_RESULT, encode_json

RECORD_LIMIT = 900_000  # bytes of JSON; a PDS refuses record bodies over 1,000,000
SUMMARY_CHARS = 200


async def fit_record(store: RecordStore, did: str, record: dict[str, Any]) -> dict[str, Any]:
    """``record`` itself when it fits, else a copy that does (blobs uploaded to ``store``)."""
    size = _size(record)
    if size <= RECORD_LIMIT:
        return record
    parts = [dict(p) for p in record["content"]["parts"]]
    largest_first = sorted(
        (i for i, p in enumerate(parts)
         if p.get("$type") == TOOL_RESULT and isinstance(p.get("output"), str)),
        key=lambda i: len(parts[i]["output"].encode()),
        reverse=True,
    )
    record = {**record, "content": {**record["content"], "parts": parts}}
    for i in largest_first:
        if size <= RECORD_LIMIT:
            break
        output = parts[i]["output"]
        data = output.encode()
        parts[i]["outputBlob"] = await store.upload_blob(did, data, "text/plain")
        parts[i]["output"] = f"[{len(data)} bytes, moved to outputBlob] {output[:SUMMARY_CHARS]}"
        size = _size(record)
    if size <= RECORD_LIMIT:
        return record
    return _cut(record, parts, size)


def _cut(record: dict[str, Any], parts: list[dict[str, Any]], size: int) -> dict[str, Any]:
    """Keep the longest run of whole parts from the start that fits (SPEC §12): what the
    subscribers saw is cut at a part boundary, never thrown away whole."""
    total = len(parts)
    error = (
        f"the reply is too large to store ({size} bytes of JSON, limit {RECORD_LIMIT}): "
        f"kept the first {{kept}} of {total} parts"
    )

    def cut_at(kept: int) -> dict[str, Any]:
        return {
            **record,
            "content": {**record["content"], "parts": parts[:kept]},
            "status": "error",
            "error": error.format(kept=kept),
        }

    # Sizes add up part by part (plus a comma each), so one pass finds the cut.
    budget = RECORD_LIMIT - _size(cut_at(0)) - 16  # the count in `error` may grow
    kept = 0
    for part in parts:
        budget -= _size(part) + 1
        if budget < 0:
            break
        kept += 1
    return cut_at(kept)


def _size(record: dict[str, Any]) -> int:
    return len(encode_json(record).encode())
