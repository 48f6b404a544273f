"""Hypothesis strategies for valid chat records (shared by the validator and store tests)."""

from __future__ import annotations

import base64
import hashlib
import json
from datetime import UTC, datetime
from typing import Any

import libipld
from hypothesis import strategies as st

NS = "network.sharedcomputer.chat"
MESSAGE = f"{NS}.message"
DEFS = f"{NS}.defs"

_B32 = "234567abcdefghijklmnopqrstuvwxyz"

# Text as people and models write it: any Unicode scalar value (hypothesis leaves
# out lone surrogates, which are not UTF-8), kept short so examples stay fast.
texts = st.text(max_size=200)
short_texts = st.text(max_size=40)

tids = st.builds(
    lambda first, rest: first + rest,
    st.sampled_from("234567abcdefghij"),
    st.text(alphabet=_B32, min_size=12, max_size=12),
)
reply_keys = st.builds(lambda k, n: f"{k}.r{n}", tids, st.integers(0, 1000))
record_keys = st.one_of(tids, reply_keys)

datetimes = st.datetimes(
    min_value=datetime(1970, 1, 1), max_value=datetime(2100, 1, 1), timezones=st.just(UTC)
).map(lambda d: d.isoformat(timespec="milliseconds").replace("+00:00", "Z"))

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**31), 2**31) | short_texts,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(short_texts, inner, max_size=4),
    max_leaves=10,
)
json_strings = json_values.map(lambda v: json.dumps(v, ensure_ascii=False))


def _cid(data: bytes) -> str:
    # CIDv1, raw codec, sha-256: what a PDS gives an uploaded blob.
    return libipld.encode_cid(b"\x01\x55\x12\x20" + hashlib.sha256(data).digest())


def blobs(mime_types: st.SearchStrategy[str], max_size: int) -> st.SearchStrategy[dict[str, Any]]:
    return st.builds(
        lambda data, mime, size: {
            "$type": "blob",
            "ref": {"$link": _cid(data)},
            "mimeType": mime,
            "size": size,
        },
        st.binary(max_size=16),
        mime_types,
        st.integers(0, max_size),
    )


def _part(name: str, fields: dict[str, st.SearchStrategy[Any]], optional: dict | None = None):
    return st.fixed_dictionaries(
        {"$type": st.just(f"{DEFS}#{name}"), **fields}, optional=optional or {}
    )


provider_data = {"providerData": json_strings}

text_parts = _part("textPart", {"text": texts}, provider_data)
reasoning_parts = _part("reasoningPart", {}, {"text": texts, **provider_data})
image_parts = _part(
    "imagePart",
    {"image": blobs(st.sampled_from(["image/png", "image/jpeg", "image/webp", "image/gif"]), 20_000_000)},
    {"alt": short_texts},
)
file_parts = _part(
    "filePart",
    {"file": blobs(st.sampled_from(["application/pdf", "text/csv", "application/zip"]), 50_000_000)},
    {
        "name": short_texts,
        "extracted": st.fixed_dictionaries(
            {"text": blobs(st.just("text/plain"), 50_000_000)},
            optional={"method": st.sampled_from(["text", "ocr", "transcript"])},
        ),
    },
)
tool_names = st.from_regex(r"[A-Za-z][A-Za-z0-9_-]{0,30}", fullmatch=True)
call_ids = st.from_regex(r"call_[A-Za-z0-9]{1,20}", fullmatch=True)
tool_call_parts = _part(
    "toolCallPart", {"callId": call_ids, "tool": tool_names, "input": json_strings}, provider_data
)
tool_result_parts = _part(
    "toolResultPart",
    {"callId": call_ids, "output": texts},
    {"isError": st.booleans(), "outputBlob": blobs(st.just("application/json"), 50_000_000)},
)
source_parts = _part(
    "sourcePart",
    {"url": st.builds(lambda host, path: f"https://{host}.example/{path}", tool_names, tool_names)},
    {"title": short_texts},
)
parts = st.one_of(
    text_parts,
    reasoning_parts,
    image_parts,
    file_parts,
    tool_call_parts,
    tool_result_parts,
    source_parts,
)

plain_content = st.fixed_dictionaries(
    {"$type": st.just(f"{DEFS}#plainContent"), "parts": st.lists(parts, max_size=8)}
)
def _b64(data: bytes) -> dict[str, str]:
    # atproto's JSON form of bytes: standard base64 without padding.
    return {"$bytes": base64.b64encode(data).decode().rstrip("=")}


encrypted_content = st.fixed_dictionaries(
    {
        "$type": st.just(f"{DEFS}#encryptedContent"),
        "scheme": st.just("xchacha20poly1305"),
        "nonce": st.binary(min_size=24, max_size=24).map(_b64),
        "ciphertext": st.binary(max_size=64).map(_b64),
    },
    optional={"keyId": short_texts},
)

model_refs = st.fixed_dictionaries(
    {"provider": st.sampled_from(["openai", "echo", "ollama"]), "id": tool_names}
)
efforts = st.sampled_from(["none", "low", "medium", "high", "max"])
generation_requests = st.fixed_dictionaries(
    {},
    optional={
        "model": model_refs,
        "effort": efforts,
        "attempt": st.integers(0, 1000),
        "tools": st.lists(tool_names, max_size=5),
    },
)
usages = st.fixed_dictionaries(
    {},
    optional={
        "inputTokens": st.integers(0, 10**7),
        "outputTokens": st.integers(0, 10**7),
        "reasoningTokens": st.integers(0, 10**7),
    },
)

user_messages = st.fixed_dictionaries(
    {
        "$type": st.just(MESSAGE),
        "role": st.just("user"),
        "content": st.one_of(plain_content, encrypted_content),
        "createdAt": datetimes,
    },
    optional={"parent": record_keys, "generation": generation_requests},
)
assistant_messages = st.fixed_dictionaries(
    {
        "$type": st.just(MESSAGE),
        "role": st.just("assistant"),
        "parent": tids,
        "content": plain_content,
        "createdAt": datetimes,
    },
    optional={
        "model": model_refs,
        "effort": efforts,
        "status": st.sampled_from(["pending", "complete", "error", "cancelled"]),
        "error": short_texts,
        "usage": usages,
    },
)


def valid_messages() -> st.SearchStrategy[dict[str, Any]]:
    """Valid ``network.sharedcomputer.chat.message`` records, user and assistant, in JSON form."""
    return st.one_of(user_messages, assistant_messages)
