"""The lexicon documents and the validator compiled from them, rule by rule."""

from __future__ import annotations

import copy
import json
import re
from datetime import UTC, datetime, timedelta
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
from atproto_lexicon.parser import lexicon_parse
from hypothesis import given, settings
from hypothesis import strategies as st

from recordstore import InvalidRecord, lexicon, lexicon_formats
from recordstore.lexicon import has_lexicon, validate_record
from recordstore.times import now_iso
from recordstore.vocabulary import (
    CONVERSATION,
    CONVERSATION_REF,
    DEFS,
    INFO,
    MESSAGE,
    PREFERENCES,
    SETTINGS,
    SUMMARY,
)
from recordstore.write import prepare_write

CID = "bafkreibnoelefnzgwbcacyt4vh52ymxvzbjq7mmqhtcnwarfq4lzegsiqe"
VECTORS = Path(__file__).parent / "vectors" / "cids.json"  # facts from the reference PDS


def blob(mime: str = "image/png", size: int = 1000, cid: str = CID) -> dict[str, Any]:
    return {"$type": "blob", "ref": {"$link": cid}, "mimeType": mime, "size": size}


def text(t: str = "hello") -> dict[str, Any]:
    return {"$type": f"{DEFS}#textPart", "text": t}


def message(*parts: dict[str, Any], **fields: Any) -> dict[str, Any]:
    return {
        "$type": MESSAGE,
        "role": "user",
        "content": {"$type": f"{DEFS}#plainContent", "parts": list(parts or [text()])},
        "createdAt": "2026-01-01T00:00:00.000Z",
        **fields,
    }


def refused(collection: str, value: Any, expected: str) -> str:
    with pytest.raises(InvalidRecord) as info:
        validate_record(collection, value)
    assert str(info.value) == expected
    return str(info.value)


def refused_like(collection: str, value: Any, start: str) -> None:
    with pytest.raises(InvalidRecord) as info:
        validate_record(collection, value)
    assert str(info.value).startswith(start), str(info.value)


# ------------------------------------------------------------------ documents


def _docs() -> list[dict[str, Any]]:
    root = resources.files("lexicons") / "network" / "sharedcomputer" / "chat"
    return [json.loads(p.read_text("utf-8")) for p in root.iterdir() if p.name.endswith(".json")]


def test_every_document_is_lexicon_v1_named_after_its_file() -> None:
    root = resources.files("lexicons") / "network" / "sharedcomputer" / "chat"
    names = sorted(p.name for p in root.iterdir() if p.name.endswith(".json"))
    assert names == [
        "approval.json",
        "conversation.json",
        "conversationRef.json",
        "defs.json",
        "info.json",
        "message.json",
        "preferences.json",
        "settings.json",
        "summary.json",
    ]
    for doc in _docs():
        parsed = lexicon_parse(doc)
        assert parsed.lexicon == 1
        assert doc["id"].startswith("network.sharedcomputer.chat.")


def test_record_documents_have_keys() -> None:
    keys = {d["id"]: d["defs"]["main"].get("key") for d in _docs() if d["defs"].get("main", {}).get("type") == "record"}
    assert keys == {
        MESSAGE: "any",
        INFO: "literal:self",
        PREFERENCES: "literal:self",
        CONVERSATION_REF: "tid",
        SUMMARY: "any",
        "network.sharedcomputer.chat.approval": "any",
    }


def test_space_documents_are_tokens_naming_their_collections() -> None:
    docs = {d["id"]: d for d in _docs()}
    for space, held in ((CONVERSATION, (INFO, MESSAGE, SUMMARY)), (SETTINGS, (PREFERENCES, CONVERSATION_REF))):
        main = docs[space]["defs"]["main"]
        assert main["type"] == "token"
        for collection in held:
            assert collection in main["description"]


def test_readme_ships_with_the_lexicons() -> None:
    readme = (resources.files("lexicons") / "README.md").read_text("utf-8")
    assert "generation" in readme and ".r<attempt>" in readme


def test_has_lexicon() -> None:
    for collection in (MESSAGE, INFO, PREFERENCES, CONVERSATION_REF):
        assert has_lexicon(collection)
    for collection in (CONVERSATION, SETTINGS, "app.bsky.feed.post", DEFS):
        assert not has_lexicon(collection)


def test_shared_vectors_validate() -> None:
    vectors = json.loads(VECTORS.read_text())["vectors"]
    assert vectors
    for vector in vectors:
        record = vector["record"]
        validate_record(record["$type"], record)


# ------------------------------------------------------------------ records


def test_minimal_records_of_every_collection() -> None:
    validate_record(MESSAGE, message())
    validate_record(INFO, {"createdAt": "2026-01-01T00:00:00Z"})
    validate_record(PREFERENCES, {})
    validate_record(
        CONVERSATION_REF,
        {
            "conversation": "at://did:plc:abc/space/network.sharedcomputer.chat.conversation/3m2a4b5c6d7e2",
            "updatedAt": "2026-01-01T00:00:00Z",
        },
    )


def test_full_records() -> None:
    validate_record(
        INFO,
        {
            "$type": INFO,
            "title": "Trip",
            "titleSource": "generated",
            "systemPrompt": "Be brief.",
            "createdAt": "2026-01-01T00:00:00Z",
        },
    )
    validate_record(
        PREFERENCES,
        {
            "defaultModel": {"provider": "openai", "id": "gpt-4o-mini"},
            "defaultEffort": "low",
            "customInstructions": "Metric units.",
            "generateTitles": False,
            "timezone": "Europe/Paris",
            "updatedAt": "2026-01-01T00:00:00Z",
        },
    )
    validate_record(
        CONVERSATION_REF,
        {
            "conversation": "at://did:plc:abc/space/network.sharedcomputer.chat.conversation/3m2a4b5c6d7e2",
            "title": "Trip",
            "tags": ["travel"] * 32,
            "updatedAt": "2026-01-01T00:00:00Z",
        },
    )


def test_every_part_type() -> None:
    validate_record(
        MESSAGE,
        message(
            text("hi"),
            {"$type": f"{DEFS}#reasoningPart", "text": "hmm", "providerData": '{"sig":"x"}'},
            {"$type": f"{DEFS}#imagePart", "image": blob("image/webp"), "alt": "a cat"},
            {
                "$type": f"{DEFS}#filePart",
                "file": blob("application/pdf", 50_000_000),
                "name": "a.pdf",
                "extracted": {"text": blob("text/plain"), "method": "ocr"},
            },
            {"$type": f"{DEFS}#toolCallPart", "callId": "c1", "tool": "search", "input": "{}"},
            {
                "$type": f"{DEFS}#toolResultPart",
                "callId": "c1",
                "output": "done",
                "outputBlob": blob("application/json", 50_000_000),
                "isError": True,
            },
            {"$type": f"{DEFS}#sourcePart", "url": "https://example.com/a?b=c", "title": "A"},
        ),
    )


def test_encrypted_content() -> None:
    enc = {
        "$type": f"{DEFS}#encryptedContent",
        "scheme": "xchacha20poly1305",
        "keyId": "k1",
        "nonce": {"$bytes": "AAECAwQFBgcICQoLDA0ODxAREhMUFRYX"},
        "ciphertext": {"$bytes": "aGVsbG8"},  # no padding, as atproto writes it
        "blobs": [blob("application/octet-stream")],
    }
    validate_record(MESSAGE, {**message(), "content": enc})
    padded = {**enc, "ciphertext": {"$bytes": "aGVsbG8="}}
    validate_record(MESSAGE, {**message(), "content": padded})
    refused(
        MESSAGE,
        {**message(), "content": {**enc, "nonce": {"$bytes": "A" * 88}}},
        "content.nonce must not be longer than 64 bytes",
    )
    refused(
        MESSAGE,
        {**message(), "content": {**enc, "nonce": "AAEC"}},
        'content.nonce must be bytes {"$bytes": base64}',
    )
    refused(
        MESSAGE,
        {**message(), "content": {**enc, "ciphertext": {"$bytes": "!!!"}}},
        "content.ciphertext must be valid base64 in $bytes",
    )
    del enc["scheme"]
    refused(MESSAGE, {**message(), "content": enc}, "content.scheme is required")


def test_assistant_reply() -> None:
    validate_record(
        MESSAGE,
        message(
            role="assistant",
            parent="3m2a4b5c6d7e2",
            model={"provider": "openai", "id": "gpt-4o-mini"},
            effort="max",
            status="error",
            error="model unavailable",
            usage={"inputTokens": 0, "outputTokens": 5},
        ),
    )


# ------------------------------------------------------------------ $type and shape


def test_type_may_be_missing_but_must_match() -> None:
    value = message()
    del value["$type"]
    validate_record(MESSAGE, value)
    assert "$type" not in value  # the store fills it in, not the validator
    refused(MESSAGE, {**message(), "$type": INFO}, f"$type must be {MESSAGE}")
    refused(INFO, message(), f"$type must be {INFO}")


def test_record_must_be_an_object() -> None:
    refused(MESSAGE, [], "record must be an object, not array")
    refused(MESSAGE, None, "record must be an object, not null")
    refused("com.example.other", "x", "record must be an object, not string")


# ------------------------------------------------------------------ required


def test_required_fields_name_their_path() -> None:
    refused(MESSAGE, message({"$type": f"{DEFS}#textPart"}), "content.parts[0].text is required")
    v = message()
    del v["createdAt"]
    refused(MESSAGE, v, "createdAt is required")
    v = message()
    del v["content"]
    refused(MESSAGE, v, "content is required")
    refused(MESSAGE, message(model={"provider": "openai"}), "model.id is required")
    refused(MESSAGE, message({"$type": f"{DEFS}#imagePart"}), "content.parts[0].image is required")
    refused(MESSAGE, message(text(), {"$type": f"{DEFS}#sourcePart"}), "content.parts[1].url is required")
    refused(INFO, {}, "createdAt is required")
    refused(CONVERSATION_REF, {"updatedAt": "2026-01-01T00:00:00Z"}, "conversation is required")


# ------------------------------------------------------------------ strings


def test_max_length_counts_utf8_bytes() -> None:
    validate_record(MESSAGE, message(error="x" * 3000))
    refused(MESSAGE, message(error="x" * 3001), "error must not be longer than 3000 bytes (UTF-8)")
    # 1000 characters, 4000 bytes.
    refused(MESSAGE, message(error="😀" * 1000), "error must not be longer than 3000 bytes (UTF-8)")
    validate_record(MESSAGE, message(error="é" * 1500))  # 3000 bytes exactly
    refused(MESSAGE, message(model={"provider": "p" * 129, "id": "x"}), "model.provider must not be longer than 128 bytes (UTF-8)")
    refused(
        MESSAGE,
        message(text("a" * 500_001)),
        "content.parts[0].text must not be longer than 500000 bytes (UTF-8)",
    )
    refused(
        MESSAGE,
        message({"$type": f"{DEFS}#toolCallPart", "input": "{" * 200_001}),
        "content.parts[0].input must not be longer than 200000 bytes (UTF-8)",
    )
    refused(
        MESSAGE,
        message({"$type": f"{DEFS}#textPart", "text": "x", "providerData": "0" * 100_001}),
        "content.parts[0].providerData must not be longer than 100000 bytes (UTF-8)",
    )


def test_max_graphemes_counts_grapheme_clusters() -> None:
    info = {"createdAt": "2026-01-01T00:00:00Z"}
    # "e" + combining acute: two code points, one grapheme.
    validate_record(INFO, {**info, "title": "e\u0301" * 300})
    refused(INFO, {**info, "title": "e\u0301" * 301}, "title must not be longer than 300 graphemes")
    # Flags are two regional indicators each; a family is five code points joined by ZWJ.
    validate_record(INFO, {**info, "title": "🇫🇷" * 300})
    refused(INFO, {**info, "title": "🇫🇷" * 301}, "title must not be longer than 300 graphemes")
    validate_record(INFO, {**info, "title": "👨‍👩‍👧" * 150})
    validate_record(INFO, {**info, "title": "x" * 300})
    refused(INFO, {**info, "title": "x" * 301}, "title must not be longer than 300 graphemes")
    # The byte limit still applies to text that is short in graphemes.
    refused(INFO, {**info, "title": "👨‍👩‍👧" * 200}, "title must not be longer than 3000 bytes (UTF-8)")


def test_strings_must_be_strings_and_utf8() -> None:
    refused(MESSAGE, message(text(5)), "content.parts[0].text must be a string, not integer")
    refused(MESSAGE, message(text(None)), "content.parts[0].text must be a string, not null")
    refused(MESSAGE, message(text("a\ud800b")), "content.parts[0].text must be valid UTF-8 (it contains a lone surrogate)")
    refused(MESSAGE, message(extra="\udfff"), "extra must be valid UTF-8 (it contains a lone surrogate)")


def test_known_values_are_open() -> None:
    validate_record(MESSAGE, message(role="system"))
    validate_record(MESSAGE, message(role="assistant", status="thinking-hard"))
    validate_record(INFO, {"titleSource": "imported", "createdAt": "2026-01-01T00:00:00Z"})
    validate_record(
        MESSAGE,
        message({"$type": f"{DEFS}#filePart", "file": blob("text/csv"), "extracted": {"text": blob("text/plain"), "method": "asr"}}),
    )
    refused(MESSAGE, message(role=1), "role must be a string, not integer")


def test_enum_is_closed() -> None:
    for effort in ("none", "low", "medium", "high", "max"):
        validate_record(MESSAGE, message(effort=effort, generation={"effort": effort}))
    refused(MESSAGE, message(effort="xhigh"), "effort must be one of none, low, medium, high, max")
    refused(
        MESSAGE,
        message(generation={"effort": "High"}),
        "generation.effort must be one of none, low, medium, high, max",
    )
    refused(PREFERENCES, {"defaultEffort": ""}, "defaultEffort must be one of none, low, medium, high, max")


@pytest.mark.parametrize(
    "value",
    [
        "2026-01-01T00:00:00Z",
        "2026-01-01T00:00:00.1Z",
        "2026-01-01T00:00:00.123456789Z",
        "2026-01-01T00:00:00+05:30",
        "2026-01-01T00:00:00.000-08:00",
        "0001-01-01T00:00:00Z",
    ],
)
def test_datetime_accepts(value: str) -> None:
    validate_record(MESSAGE, message(createdAt=value))


@pytest.mark.parametrize(
    "value",
    [
        "2026-01-01",
        "2026-01-01T00:00Z",
        "2026-01-01T00:00:00",
        "2026-01-01 00:00:00Z",
        "2026-01-01t00:00:00z",
        "2026-01-01T00:00:00-00:00",
        "2026-13-01T00:00:00Z",
        "2026-02-30T00:00:00Z",
        "2026-01-01T00:00:00.Z",
        " 2026-01-01T00:00:00Z",
        "26-01-01T00:00:00Z",
        "20260101T000000Z",
        "",
    ],
)
def test_datetime_refuses(value: str) -> None:
    refused_like(MESSAGE, message(createdAt=value), "createdAt must be a valid datetime: ")


@settings(max_examples=400, deadline=None)
@given(
    date=st.tuples(st.integers(0, 9999), st.integers(0, 19), st.integers(0, 39)),
    clock=st.tuples(st.integers(0, 29), st.integers(0, 59), st.integers(0, 69)),
    fraction=st.one_of(st.just(""), st.text("0123456789", min_size=1, max_size=9).map("." .__add__)),
)
def test_datetime_of_the_usual_form_is_judged_as_the_sdk_judges_it(
    date: tuple[int, int, int], clock: tuple[int, int, int], fraction: str
) -> None:
    # recordstore.lexicon_formats checks a "...Z" datetime's calendar itself, without the
    # SDK's validator: the verdict must be the SDK's, and a refusal keeps the SDK's words.
    (year, month, day), (hour, minute, second) = date, clock
    v = f"{year:04d}-{month:02d}-{day:02d}T{hour:02d}:{minute:02d}:{second:02d}{fraction}Z"
    if v.startswith("0000"):
        assert not lexicon_formats._calendar_ok(v)  # year 0000 keeps its own checks
        return
    assert lexicon_formats._datetime(v) == lexicon_formats._sdk_datetime(v)


def test_now_iso_is_now_in_the_form_turnd_writes() -> None:
    before = datetime.now(UTC)
    stamp = now_iso()
    after = datetime.now(UTC)
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", stamp)
    at = datetime.fromisoformat(stamp)
    assert before - timedelta(milliseconds=1) <= at <= after
    assert lexicon_formats._datetime(stamp) is None


def test_record_key_format() -> None:
    for key in ("3m2a4b5c6d7e2", "3m2a4b5c6d7e2.r10", "self", "a:b", "~_-.x"):
        validate_record(MESSAGE, message(parent=key))
    for key in ("", ".", "..", "a/b", "a b", "é", "x" * 513):
        refused_like(MESSAGE, message(parent=key), "parent must be a valid record-key: ")


def test_uri_format() -> None:
    validate_record(MESSAGE, message({"$type": f"{DEFS}#sourcePart", "url": "https://example.com"}))
    for bad in ("not a url", "example.com", "", "1http://x"):
        refused_like(
            MESSAGE,
            message({"$type": f"{DEFS}#sourcePart", "url": bad}),
            "content.parts[0].url must be a valid uri: ",
        )


# ------------------------------------------------------------------ integers


def test_integer_bounds_and_types() -> None:
    validate_record(MESSAGE, message(generation={"attempt": 0}))
    validate_record(MESSAGE, message(generation={"attempt": 1000}))
    refused(MESSAGE, message(generation={"attempt": 1001}), "generation.attempt must be <= 1000")
    refused(MESSAGE, message(generation={"attempt": -1}), "generation.attempt must be >= 0")
    refused(MESSAGE, message(generation={"attempt": "1"}), "generation.attempt must be an integer, not string")
    refused(MESSAGE, message(generation={"attempt": True}), "generation.attempt must be an integer, not boolean")
    refused(
        MESSAGE,
        message(generation={"attempt": 1.0}),
        "generation.attempt must be an integer (the atproto data model has no floats)",
    )
    refused(MESSAGE, message(usage={"outputTokens": -5}), "usage.outputTokens must be >= 0")
    refused(
        MESSAGE,
        message(usage={"inputTokens": 2**53}),
        "usage.inputTokens must be an integer between -(2^53-1) and 2^53-1",
    )


def test_defaults_are_not_applied_and_input_is_not_changed() -> None:
    value = message(
        {"$type": f"{DEFS}#toolResultPart", "callId": "c", "output": "x"},
        generation={},
        unknownField={"nested": [1, "two", None]},
    )
    before = copy.deepcopy(value)
    validate_record(MESSAGE, value)
    assert value == before
    assert "attempt" not in value["generation"]
    assert "isError" not in value["content"]["parts"][0]
    validate_record(PREFERENCES, prefs := {})
    assert prefs == {}


# ------------------------------------------------------------------ arrays


def test_array_lengths() -> None:
    validate_record(MESSAGE, message(generation={"tools": ["t"] * 64}))
    refused(MESSAGE, message(generation={"tools": ["t"] * 65}), "generation.tools must not have more than 64 items")
    refused(MESSAGE, message(generation={"tools": "search"}), "generation.tools must be an array, not string")
    refused(MESSAGE, message(generation={"tools": ["ok", 3]}), "generation.tools[1] must be a string, not integer")
    validate_record(MESSAGE, message(*[text()] * 1000))
    refused(MESSAGE, message(*[text()] * 1001), "content.parts must not have more than 1000 items")
    refused(
        CONVERSATION_REF,
        {"conversation": "at://did:plc:a/space/x/y", "tags": ["t"] * 33, "updatedAt": "2026-01-01T00:00:00Z"},
        "tags must not have more than 32 items",
    )
    validate_record(MESSAGE, message(*[]) | {"content": {"$type": f"{DEFS}#plainContent", "parts": []}})


# ------------------------------------------------------------------ unions and refs


def test_open_union_keeps_unknown_variants() -> None:
    future = {"$type": "com.example.chat#videoPart", "video": {"anything": [1, 2]}}
    value = message(text(), future)
    validate_record(MESSAGE, value)
    assert value["content"]["parts"][1] == future
    validate_record(MESSAGE, {**message(), "content": {"$type": "com.example.chat#sealedV2", "x": "y"}})
    # An unknown variant still has to be valid data.
    refused(
        MESSAGE,
        message({"$type": "com.example.chat#videoPart", "seconds": 1.5}),
        "content.parts[0].seconds must not be a float (the atproto data model has no floats)",
    )


def test_union_members_need_a_type() -> None:
    refused(
        MESSAGE,
        message({"text": "no type"}),
        f"content.parts[0] must have a $type (one of {DEFS}#textPart, {DEFS}#reasoningPart, "
        f"{DEFS}#imagePart, {DEFS}#filePart, {DEFS}#toolCallPart, {DEFS}#toolResultPart, {DEFS}#sourcePart)",
    )
    refused(MESSAGE, message("hello"), "content.parts[0] must be an object, not string")
    refused(MESSAGE, message({"$type": 7}), "content.parts[0].$type must be a non-empty string")
    refused(MESSAGE, {**message(), "content": "hello"}, "content must be an object, not string")


def test_known_variant_is_checked_by_its_def() -> None:
    refused(
        MESSAGE,
        message(text(), {"$type": f"{DEFS}#toolResultPart", "isError": "no"}),
        "content.parts[1].isError must be a boolean, not string",
    )


def test_refs_across_files() -> None:
    refused(MESSAGE, message(usage={"inputTokens": "9"}), "usage.inputTokens must be an integer, not string")
    refused(MESSAGE, message(generation={"model": {"id": "x"}}), "generation.model.provider is required")
    refused(PREFERENCES, {"defaultModel": "openai:gpt"}, "defaultModel must be an object, not string")
    refused(
        INFO,
        {"createdAt": "2026-01-01T00:00:00Z", "sealed": {"scheme": "s", "nonce": {"$bytes": ""}}},
        "sealed.ciphertext is required",
    )


# ------------------------------------------------------------------ blobs


def image(b: Any) -> dict[str, Any]:
    return message({"$type": f"{DEFS}#imagePart", "image": b})


def test_blob_accept_and_size() -> None:
    for mime in ("image/png", "image/jpeg", "image/webp", "image/gif"):
        validate_record(MESSAGE, image(blob(mime)))
    refused(
        MESSAGE,
        image(blob("image/svg+xml")),
        "content.parts[0].image.mimeType must be one of image/png, image/jpeg, image/webp, image/gif",
    )
    validate_record(MESSAGE, image(blob(size=20_000_000)))
    refused(MESSAGE, image(blob(size=20_000_001)), "content.parts[0].image must not be larger than 20000000 bytes")
    refused(
        MESSAGE,
        message({"$type": f"{DEFS}#filePart", "file": blob("application/zip", 50_000_001)}),
        "content.parts[0].file must not be larger than 50000000 bytes",
    )
    refused(
        MESSAGE,
        message({"$type": f"{DEFS}#toolResultPart", "outputBlob": blob("application/json", 50_000_001)}),
        "content.parts[0].outputBlob must not be larger than 50000000 bytes",
    )
    refused(
        MESSAGE,
        message({"$type": f"{DEFS}#filePart", "file": blob("application/pdf"), "extracted": {"text": blob("application/pdf")}}),
        "content.parts[0].extracted.text.mimeType must be one of text/plain",
    )


def test_blob_shape() -> None:
    refused(
        MESSAGE,
        image(blob(cid="not-a-cid")),
        "content.parts[0].image.ref.$link must be a valid CID",
    )
    refused(MESSAGE, image({**blob(), "ref": CID}), 'content.parts[0].image.ref must be a CID link {"$link": cid}')
    b = blob()
    del b["size"]
    refused(MESSAGE, image(b), "content.parts[0].image.size is required")
    refused(MESSAGE, image({**blob(), "size": -1}), "content.parts[0].image.size must be a non-negative integer")
    refused(MESSAGE, image({**blob(), "size": 1.0}), "content.parts[0].image.size must be a non-negative integer")
    refused(MESSAGE, image({**blob(), "mimeType": 3}), "content.parts[0].image.mimeType must be a MIME type")
    refused_like(MESSAGE, image("bafy..."), "content.parts[0].image must be a blob")


@pytest.mark.anyio
async def test_the_legacy_blob_form_is_read_but_never_written() -> None:
    legacy = image({"cid": CID, "mimeType": "image/png"})
    validate_record(MESSAGE, legacy)  # on read, as a PDS reads old repos
    refused(MESSAGE, image({"cid": "junk", "mimeType": "image/png"}), "content.parts[0].image.cid must be a valid CID")
    refused(MESSAGE, image({"cid": CID, "mimeType": "text/plain"}), "content.parts[0].image.mimeType must be one of image/png, image/jpeg, image/webp, image/gif")
    with pytest.raises(InvalidRecord, match=f"Legacy blobs are not allowed \\({CID}\\)"):
        await prepare_write(MESSAGE, legacy)


def test_an_open_union_type_must_name_a_lexicon_def() -> None:
    for typ in ("com.example.part", "com.example.doc#part"):
        validate_record(MESSAGE, message({"$type": typ, "x": 1}))
    for typ in ("a.b.c#d#e", "#textPart", "notansid", "com.example.doc#"):
        refused(MESSAGE, message({"$type": typ, "x": 1}), "content.parts[0].$type must be an NSID, optionally with one #fragment")


def test_link_and_bytes_objects_hold_nothing_else() -> None:
    refused_like(MESSAGE, message(extra={"$link": CID, "other": 1}), 'extra must be a CID link {"$link": cid}')
    refused_like(MESSAGE, message(extra={"$bytes": "AAAA", "x": 1}), 'extra must be bytes {"$bytes": base64}')


@pytest.mark.anyio
async def test_integral_numbers_are_integers() -> None:
    w = await prepare_write(MESSAGE, message(extra={"a": 123.0, "b": [1.0, -0.0]}))
    assert w.value["extra"] == {"a": 123, "b": [1, 0]}
    assert all(type(n) is int for n in [w.value["extra"]["a"], *w.value["extra"]["b"]])
    with pytest.raises(InvalidRecord, match="float"):
        await prepare_write(MESSAGE, message(extra=123.5))


# ------------------------------------------------------------------ data model


def test_floats_are_refused_anywhere() -> None:
    expected = "must not be a float (the atproto data model has no floats)"
    refused(MESSAGE, message(score=0.5), f"score {expected}")
    refused(MESSAGE, message(extra={"a": [1, {"b": 2.0}]}), f"extra.a[1].b {expected}")
    refused(MESSAGE, message(extra=float("nan")), f"extra {expected}")
    refused("com.example.other", {"x": [1.25]}, f"x[0] {expected}")


def test_unknown_fields_are_allowed_and_kept() -> None:
    value = message(text(), futureField={"$type": "com.example.thing", "n": 1}, note="kept")
    validate_record(MESSAGE, value)
    assert value["futureField"] == {"$type": "com.example.thing", "n": 1}
    assert value["note"] == "kept"
    refused(MESSAGE, message(extra={"$type": ""}), "extra.$type must be a non-empty string")
    refused(MESSAGE, message(extra={"$link": "nope"}), "extra.$link must be a valid CID")
    refused(MESSAGE, message(extra={"$bytes": "***"}), "extra must be valid base64 in $bytes")
    refused(MESSAGE, message(extra={"$type": "blob"}), "extra.ref is required")
    refused(MESSAGE, message(extra={1: "x"}), "extra must have only string keys")
    refused(MESSAGE, message(extra=(1, 2)), "extra must be a JSON value, not tuple")
    refused(MESSAGE, message(extra=2**60), "extra must be an integer between -(2^53-1) and 2^53-1")


def test_collections_without_a_lexicon_get_data_model_checks_only() -> None:
    validate_record("com.example.thing", {"anything": {"goes": [1, "x", None, True]}})
    validate_record("com.example.thing", {"$type": "com.example.thing"})
    refused("com.example.thing", {"$type": "com.example.other"}, "$type must be com.example.thing")
    refused("com.example.thing", {"deep": {"x": 0.1}}, "deep.x must not be a float (the atproto data model has no floats)")


def test_deep_nesting_is_refused_not_crashed() -> None:
    deep: Any = "x"
    for _ in range(5000):
        deep = [deep]
    refused_like(MESSAGE, message(extra=deep), "extra")
    deep = {}
    cursor = deep
    for _ in range(5000):
        cursor["a"] = {}
        cursor = cursor["a"]
    refused_like("com.example.thing", {"d": deep}, "d.a.a")


def test_error_messages_stay_short() -> None:
    long_key = "k" * 5000
    with pytest.raises(InvalidRecord) as info:
        validate_record(MESSAGE, message(**{long_key: 0.5}))
    assert len(str(info.value)) < 200
    assert str(info.value).startswith("k" * 64 + "…")


# ------------------------------------------------------------------ rules our documents do not use


def compile_test_lexicon(properties: dict[str, Any], required: list[str] | None = None, **defs: Any) -> Any:
    doc = {
        "lexicon": 1,
        "id": "com.example.test",
        "defs": {
            "main": {
                "type": "record",
                "key": "any",
                "record": {"type": "object", "required": required or [], "properties": properties},
            },
            **defs,
        },
    }
    schema = lexicon._compile([doc])

    def check(value: dict[str, Any]) -> None:
        lexicon._validate(schema, "com.example.test", value)

    return check


def test_const_min_length_min_graphemes_and_integer_enum() -> None:
    check = compile_test_lexicon(
        {
            "kind": {"type": "string", "const": "fixed"},
            "flag": {"type": "boolean", "const": True},
            "n": {"type": "integer", "const": 3},
            "level": {"type": "integer", "enum": [1, 2, 3]},
            "word": {"type": "string", "minLength": 4, "minGraphemes": 2},
            "list": {"type": "array", "minLength": 2, "items": {"type": "integer"}},
            "blobish": {"type": "bytes", "minLength": 2},
        }
    )
    check({"kind": "fixed", "flag": True, "n": 3, "level": 2, "word": "abcd", "list": [1, 2], "blobish": {"$bytes": "AAA"}})
    cases = [
        ({"kind": "other"}, 'kind must be "fixed"'),
        ({"flag": False}, "flag must be true"),
        ({"n": 4}, "n must be 3"),
        ({"level": 4}, "level must be one of 1, 2, 3"),
        ({"word": "abc"}, "word must not be shorter than 4 bytes (UTF-8)"),
        ({"word": "éé"}, None),  # 4 bytes, 2 graphemes
        ({"word": "e\u0301\u0301\u0301"}, "word must not be shorter than 2 graphemes"),
        ({"list": [1]}, "list must not have fewer than 2 items"),
        ({"blobish": {"$bytes": "AA"}}, "blobish must not be shorter than 2 bytes"),
    ]
    for value, expected in cases:
        if expected is None:
            check(value)
            continue
        with pytest.raises(InvalidRecord) as info:
            check(value)
        assert str(info.value) == expected


def test_closed_union_nullable_unknown_and_cid_link() -> None:
    check = compile_test_lexicon(
        {
            "pick": {"type": "union", "refs": ["#a", "com.example.test#b"], "closed": True},
            "open": {"type": "union", "refs": ["#a"]},
            "maybe": {"type": "string"},
            "blob": {"type": "unknown"},
            "link": {"type": "cid-link"},
            "pic": {"type": "blob", "accept": ["image/*"]},
            "any": {"type": "blob", "accept": ["*/*"]},
        },
        a={"type": "object", "required": ["x"], "properties": {"x": {"type": "integer"}}},
        b={"type": "object", "properties": {}},
    ).__call__
    check({"pick": {"$type": "com.example.test#a", "x": 1}, "open": {"$type": "z.z.z#q"}})
    check({"pick": {"$type": "com.example.test#b"}})
    check({"blob": {"any": ["thing"]}, "link": {"$link": CID}})
    check({"pic": blob("image/avif"), "any": blob("model/gltf+json")})
    cases = [
        ({"pick": {"$type": "z.z.z#q"}}, "pick.$type must be one of com.example.test#a, com.example.test#b"),
        ({"pick": {"$type": "com.example.test#a"}}, "pick.x is required"),
        ({"maybe": None}, "maybe must be a string, not null"),
        ({"blob": [1]}, "blob must be an object, not array"),
        ({"blob": {"f": 1.5}}, "blob.f must not be a float (the atproto data model has no floats)"),
        ({"link": CID}, 'link must be a CID link {"$link": cid}'),
        ({"link": {"$link": "zzz"}}, "link.$link must be a valid CID"),
        ({"pic": blob("video/mp4")}, "pic.mimeType must be one of image/*"),
    ]
    for value, expected in cases:
        with pytest.raises(InvalidRecord) as info:
            check(value)
        assert str(info.value) == expected


def test_nullable_fields() -> None:
    check = compile_test_lexicon({"maybe": {"type": "string"}})
    doc = {
        "lexicon": 1,
        "id": "com.example.nullable",
        "defs": {
            "main": {
                "type": "record",
                "key": "any",
                "record": {"type": "object", "nullable": ["maybe"], "properties": {"maybe": {"type": "string"}}},
            }
        },
    }
    schema = lexicon._compile([doc])
    lexicon._validate(schema, "com.example.nullable", {"maybe": None})
    with pytest.raises(InvalidRecord):
        check({"maybe": None})


@pytest.mark.parametrize(
    ("fmt", "good", "bad"),
    [
        ("did", ["did:plc:z72i7hdynmk6r22z27h6tvur", "did:web:example.com"], ["did:plc", "DID:plc:x", "plc:x", "did:plc:x/y"]),
        ("handle", ["alice.test", "a.example.com"], ["alice", "-a.test", "a..test", "al ice.test"]),
        ("at-identifier", ["alice.test", "did:plc:abc"], ["alice", "did:"]),
        ("nsid", ["network.sharedcomputer.chat.message", "com.example.fooBar"], ["message", "com..example.x", "1com.example.x"]),
        ("cid", [CID], ["bafy", "hello world"]),
        ("tid", ["3m2a4b5c6d7e2"], ["3m2a4b5c6d7e", "zm2a4b5c6d7e2", "3M2A4B5C6D7E2"]),
        (
            "at-uri",
            ["at://did:plc:abc/network.sharedcomputer.chat.message/3m2a4b5c6d7e2", "at://alice.test"],
            ["https://x.test", "at://", "at://did:plc:abc/not a nsid"],
        ),
        ("language", ["en", "pt-BR", "i-klingon"], ["english", "e", "EN"]),
    ],
)
def test_string_formats(fmt: str, good: list[str], bad: list[str]) -> None:
    check = compile_test_lexicon({"v": {"type": "string", "format": fmt}})
    for value in good:
        check({"v": value})
    for value in bad:
        with pytest.raises(InvalidRecord) as info:
            check({"v": value})
        assert str(info.value).startswith(f"v must be a valid {fmt}"), value


def test_broken_lexicons_fail_at_load() -> None:
    with pytest.raises(ValueError, match="undefined defs"):
        compile_test_lexicon({"x": {"type": "ref", "ref": "com.example.missing#thing"}})
    with pytest.raises(ValueError, match="unsupported string format"):
        compile_test_lexicon({"x": {"type": "string", "format": "colour"}})


def test_a_summary_record_validates_and_needs_what_it_covers() -> None:
    summary = {
        "$type": SUMMARY,
        "covers": "3n3kfmfreezal.r0",
        "text": "They agreed on Tuesday.",
        "model": {"provider": "fake", "id": "m"},
        "createdAt": "2026-12-01T00:00:00.000Z",
    }
    validate_record(SUMMARY, summary)
    refused_like(SUMMARY, {k: v for k, v in summary.items() if k != "covers"}, "covers")
    refused_like(SUMMARY, {**summary, "text": "x" * 100_001}, "text")
