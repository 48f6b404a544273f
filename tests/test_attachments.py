"""SPEC §12/§15 attachments for the model: derivatives with Pillow, cached by CID, the
blob untouched; corrupt images as a note; one read per CID; the byte bound; file text cap.
A real engine, a real local store, the fake model server."""

from __future__ import annotations

import base64
import io
from pathlib import Path
from typing import Any

import pytest
from PIL import Image, ImageDraw

from recordstore import RecordStore
from recordstore.local import LocalStore
from testbed.fakemodel import FakeModel
from tests.support.records import text_part
from tests.support.turnkit import DID, turn_kit
from turns.attachments import UNREADABLE, Attachments
from turns.prompt import chat_messages
from turns.settings import TurnSettings

pytestmark = pytest.mark.anyio

DEFS = "network.sharedcomputer.chat.defs"


def png(width: int, height: int) -> bytes:
    image = Image.new("RGB", (width, height), (40, 90, 160))
    draw = ImageDraw.Draw(image)
    for x in range(0, width, 250):
        draw.rectangle((x, 0, x + 120, height), fill=(200, x % 255, 60))
    out = io.BytesIO()
    image.save(out, "PNG")
    return out.getvalue()


def image_part(blob: dict[str, Any]) -> dict[str, Any]:
    return {"$type": f"{DEFS}#imagePart", "image": blob}


def images_sent(request: Any) -> list[bytes]:
    out = []
    for message in request.json["messages"]:
        content = message.get("content")
        if isinstance(content, list):
            for part in content:
                if part.get("type") == "image_url":
                    url = part["image_url"]["url"]
                    out.append(base64.b64decode(url.split(",", 1)[1]))
    return out


def texts_sent(request: Any) -> str:
    out = []
    for message in request.json["messages"]:
        content = message.get("content")
        if isinstance(content, str):
            out.append(content)
        elif isinstance(content, list):
            out += [p["text"] for p in content if p.get("type") == "text"]
    return "\n".join(out)


async def post(kit: Any, skey: str, parts: list[dict[str, Any]]) -> dict[str, Any]:
    posted = await kit.engine.post_message(DID, skey, parent=None, parts=parts, generation={})
    return await kit.reply(skey, posted.reply_key, wait=60)


async def test_a_large_png_reaches_the_model_as_a_cached_derivative_and_the_blob_is_untouched(
    tmp_path: Path, fake: FakeModel
) -> None:
    original = png(6000, 4000)
    cache = tmp_path / "derivatives"
    async with turn_kit(tmp_path, fake, cache_dir=cache) as kit:
        blob = await kit.store.upload_blob(DID, original, "image/png")
        cid = blob["ref"]["$link"]
        skey = await kit.conversation(title="photo")
        final = await post(kit, skey, [text_part("what is this?"), image_part(blob)])
        assert final["status"] == "complete"
        (sent,) = images_sent(fake.last_request)
        with Image.open(io.BytesIO(sent)) as got:
            assert max(got.size) <= 2048 and got.size == (2048, 1365)
        assert await kit.store.get_blob(DID, cid) == original  # the stored blob is the same
        cached = list(cache.glob(f"{cid}-*"))
        assert len(cached) == 1 and cached[0].read_bytes() == sent

        # Computed once per blob: a later turn sends what the cache holds.
        marker = io.BytesIO()
        Image.new("RGB", (16, 16), (1, 2, 3)).save(marker, "JPEG")
        cached[0].write_bytes(marker.getvalue())
        await post(kit, skey, [image_part(blob)])
        assert images_sent(fake.last_request) == [marker.getvalue()]


async def test_a_small_image_goes_as_it_is(tmp_path: Path, fake: FakeModel) -> None:
    original = png(300, 200)
    async with turn_kit(tmp_path, fake, cache_dir=tmp_path / "derivatives") as kit:
        blob = await kit.store.upload_blob(DID, original, "image/png")
        skey = await kit.conversation()
        await post(kit, skey, [image_part(blob)])
        assert images_sent(fake.last_request) == [original]
        url = fake.last_request.json["messages"][-1]["content"][0]["image_url"]["url"]
        assert url.startswith("data:image/png;base64,")


async def test_a_corrupt_image_becomes_a_note_and_the_turn_goes_on(
    tmp_path: Path, fake: FakeModel
) -> None:
    broken = png(400, 300)[:300]  # a PNG header and then nothing
    async with turn_kit(tmp_path, fake, cache_dir=tmp_path / "derivatives") as kit:
        blob = await kit.store.upload_blob(DID, broken, "image/png")
        skey = await kit.conversation()
        final = await post(kit, skey, [text_part("look"), image_part(blob)])
        assert final["status"] == "complete"
        assert images_sent(fake.last_request) == []
        assert UNREADABLE in texts_sent(fake.last_request)
        assert await kit.store.get_blob(DID, blob["ref"]["$link"]) == broken


class CountingStore:
    """The real store, counting the blob reads that reach it."""

    def __init__(self, store: RecordStore) -> None:
        self._store = store
        self.blob_reads: list[str] = []

    async def get_blob(self, did: str, cid: str) -> bytes:
        self.blob_reads.append(cid)
        return await self._store.get_blob(did, cid)


async def test_a_blob_named_by_eight_parts_is_read_once_held_once_and_sent_once(tmp_path: Path) -> None:
    async with LocalStore.open(tmp_path / "data") as store:
        blob = await store.upload_blob(DID, png(3000, 2000), "image/png")
        counting = CountingStore(store)
        attachments = Attachments(counting, DID)  # type: ignore[arg-type]
        chain = [
            {
                "role": "user",
                "content": {"$type": f"{DEFS}#plainContent", "parts": [image_part(blob) for _ in range(4)]},
            },
            {
                "role": "user",
                "content": {"$type": f"{DEFS}#plainContent", "parts": [image_part(blob) for _ in range(4)]},
            },
        ]
        messages = await chat_messages(counting, DID, chain, "", attachments)  # type: ignore[arg-type]
        content = [p for m in messages for p in m["content"]]
        sent = [p for p in content if p.get("type") == "image_url"]
        # The model gets it once, where it was named last; the other parts say so.
        assert len(sent) == 1 and content[-1] is sent[0]
        notes = [p["text"] for p in content if p.get("type") == "text"]
        assert len(notes) == 7 and all("the same image" in n for n in notes)
        assert counting.blob_reads == [blob["ref"]["$link"]]
        assert attachments.held == len(sent[0]["image_url"]["url"])  # counted once


async def test_past_the_byte_bound_the_oldest_attachments_become_a_note_naming_them(
    tmp_path: Path, fake: FakeModel
) -> None:
    settings = TurnSettings(retries=0, max_attachment_bytes=7000, file_text_max_bytes=3000)
    async with turn_kit(tmp_path, fake, settings=settings) as kit:
        skey = await kit.conversation()
        parts = []
        for name in ("old.txt", "middle.txt", "new.txt"):
            text = await kit.store.upload_blob(DID, (name * 1000).encode(), "text/plain")
            file = await kit.store.upload_blob(DID, b"%PDF-1.4 ...", "application/pdf")
            parts.append(
                {
                    "$type": f"{DEFS}#filePart",
                    "file": file,
                    "name": name,
                    "extracted": {"text": text, "method": "text"},
                }
            )
        final = await post(kit, skey, parts)
        assert final["status"] == "complete"
        sent = texts_sent(fake.last_request)
        # Each file's text is capped at 3000 bytes; two fit in 7000 bytes, not three.
        assert "File: new.txt" in sent and "File: middle.txt" in sent
        assert "File: old.txt" not in sent
        assert "'old.txt' is left out" in sent
        assert "(middle.txt" not in sent
        assert sent.count("is left out]") >= 2  # the cap notes, then the bound's


def test_a_20_mb_png_named_by_eight_parts_stays_far_from_a_gigabyte(tmp_path: Path) -> None:
    """SPEC §12's probe, in a fresh process (its peak RSS is the prompt's own)."""
    import json
    import os
    import subprocess
    import sys

    width, height = 2550, 2600  # noise: a PNG just under the lexicon's 20 MB
    image = Image.frombytes("RGB", (width, height), os.urandom(width * height * 3))
    photo = tmp_path / "photo.png"
    image.save(photo, "PNG", compress_level=1)
    assert 19_000_000 < photo.stat().st_size <= 20_000_000
    probe = subprocess.run(
        [sys.executable, "-m", "bench.conversations", "--probe", str(photo), "8"],
        capture_output=True, text=True, timeout=120, check=True,
        cwd=Path(__file__).resolve().parent.parent,
    )
    got = json.loads(probe.stdout)
    assert got["rss_peak_mb"] < 1024
    assert got["held_bytes"] < 4 * 1024 * 1024 * 4 // 3 + 100  # one derivative, base64
    assert got["sent_bytes_all_parts"] == got["held_bytes"]  # sent once, not eight times
