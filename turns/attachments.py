"""A turn's attachments as the model gets them (SPEC §12, §15).

- Each blob is read once per turn, whatever number of parts name its CID; an image
  named again goes to the model once, where it was named last (the others are a note).
- An image over ``imageMaxPixels`` on its long side, or over 4 MB, goes as a
  downscaled derivative (Pillow, in a worker thread), computed once per blob and
  cached in the data directory by CID; the stored blob is never touched. An image
  Pillow cannot read becomes the text note "image could not be read".
- A file part's extracted text is capped at ``fileTextMaxBytes``.
- A prompt holds at most ``maxAttachmentBytes`` of attachments: they are taken
  newest first, and the oldest ones past the limit become a text note naming them.
"""

from __future__ import annotations

import base64
import io
import logging
import os
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio

from recordstore import RecordStore, StoreError
from recordstore.vocabulary import FILE_PART as FILE
from recordstore.vocabulary import IMAGE_PART as IMAGE

log = logging.getLogger("turnd.turns")

MAX_IMAGE_BYTES = 4 * 1024 * 1024  # larger originals go as a derivative (SPEC §15)
UNREADABLE = "image could not be read"
_JPEG_QUALITY = 85


@dataclass(frozen=True, slots=True)
class Prepared:
    """What one attachment part becomes: an image_url content part or a text."""

    content: dict[str, Any]
    cost: int  # bytes held for it (0 when its CID was already counted)


def blob_cid(ref: Any) -> str | None:
    if not isinstance(ref, Mapping):
        return None
    link = ref.get("ref")
    # The legacy form {cid, mimeType} is read too (old records; never written).
    cid = link.get("$link") if isinstance(link, Mapping) else ref.get("cid")
    return cid if isinstance(cid, str) else None


def describe(part: Mapping[str, Any]) -> str:
    """How a note names an attachment: its file name, alt text or type and size."""
    if part.get("$type") == FILE:
        name = part.get("name")
        return repr(name) if isinstance(name, str) and name else "a file"
    alt = part.get("alt")
    if isinstance(alt, str) and alt:
        return f"an image ({alt[:80]})"
    blob = part.get("image") if isinstance(part.get("image"), Mapping) else {}
    size = blob.get("size") if isinstance(blob.get("size"), int) else None
    return f"an image ({blob.get('mimeType', 'image')}, {size} bytes)" if size else "an image"


class Attachments:
    """One turn's attachment reader. ``prepare`` the branch once, then look parts up."""

    def __init__(
        self,
        store: RecordStore,
        did: str,
        *,
        max_pixels: int = 2048,
        file_text_max: int = 200_000,
        budget: int = 64 * 1024 * 1024,
        cache_dir: Path | None = None,
    ) -> None:
        self._store = store
        self._did = did
        self._max_pixels = max_pixels
        self._file_text_max = file_text_max
        self._budget = budget
        self._cache_dir = cache_dir
        self._by_part: dict[int, Prepared] = {}  # id(part) -> what it becomes
        self._by_cid: dict[str, dict[str, Any]] = {}  # CID -> content, read once
        self.held = 0  # bytes of attachment content held for this prompt
        self.left_out: list[str] = []

    def get(self, part: Mapping[str, Any]) -> dict[str, Any] | None:
        prepared = self._by_part.get(id(part))
        return prepared.content if prepared else None

    async def prepare(self, parts: Sequence[Mapping[str, Any]]) -> None:
        """``parts``: every attachment part of the branch, oldest first."""
        over = False
        for part in reversed(parts):  # the newest are the ones to keep
            if over:
                self._note(part)
                continue
            if part.get("$type") == IMAGE and blob_cid(part.get("image")) in self._by_cid:
                # The model sees each image once, where it was named last (the newest
                # stay when the context window leaves old messages out).
                note = f"[{describe(part)}: the same image as the one sent further on]"
                self._by_part[id(part)] = Prepared({"type": "text", "text": note}, 0)
                continue
            content, cid = await self._content(part)
            cost = 0
            if cid is None or cid not in self._by_cid:
                cost = _size(content)
            if self.held + cost > self._budget:
                over = True
                self._note(part)
                continue
            self.held += cost
            if cid is not None:
                self._by_cid[cid] = content
            self._by_part[id(part)] = Prepared(content, cost)

    def _note(self, part: Mapping[str, Any]) -> None:
        name = describe(part)
        self.left_out.append(name)
        text = (
            f"[{name} is left out: this conversation's attachments exceed "
            f"{self._budget} bytes, and the oldest go first]"
        )
        self._by_part[id(part)] = Prepared({"type": "text", "text": text}, 0)

    async def _content(self, part: Mapping[str, Any]) -> tuple[dict[str, Any], str | None]:
        if part.get("$type") == IMAGE:
            cid = blob_cid(part.get("image"))
            if cid is not None and cid in self._by_cid:
                return self._by_cid[cid], cid
            return await self._image(part.get("image") or {}, cid), cid
        extracted = part.get("extracted")
        ref = extracted.get("text") if isinstance(extracted, Mapping) else None
        cid = blob_cid(ref)
        if cid is not None and cid in self._by_cid:
            return self._by_cid[cid], cid
        return {"type": "text", "text": await self._file_text(part, cid)}, cid

    # -- images ------------------------------------------------------------------------

    async def _image(self, blob: Mapping[str, Any], cid: str | None) -> dict[str, Any]:
        if cid is None:
            return {"type": "text", "text": f"[{UNREADABLE}]"}
        cached = await anyio.to_thread.run_sync(self._cached, cid)
        original = blob.get("mimeType") if isinstance(blob.get("mimeType"), str) else None
        try:
            if cached is None:
                data = await self._store.get_blob(self._did, cid)
                mime, derived = await anyio.to_thread.run_sync(self._derive, cid, data)
                payload = derived or data
            else:
                mime, derived = cached
                # An original that needs no derivative is read from the store as it is.
                payload = derived or (await self._store.get_blob(self._did, cid) if mime else b"")
            if mime is None:
                return {"type": "text", "text": f"[{UNREADABLE}]"}
        except StoreError:
            return {"type": "text", "text": "[an image that could not be loaded]"}
        if not derived:
            mime = original or mime
        url = f"data:{mime};base64,{base64.b64encode(payload).decode()}"
        return {"type": "image_url", "image_url": {"url": url}}

    def _paths(self, cid: str) -> dict[str, Path] | None:
        if self._cache_dir is None:
            return None
        stem = f"{cid}-{self._max_pixels}"
        return {
            "image/jpeg": self._cache_dir / f"{stem}.jpg",
            "image/png": self._cache_dir / f"{stem}.png",
            "ok": self._cache_dir / f"{stem}.ok",  # the original needs no derivative
            "bad": self._cache_dir / f"{stem}.bad",  # Pillow cannot read it
        }

    def _cached(self, cid: str) -> tuple[str | None, bytes] | None:
        paths = self._paths(cid)
        if paths is None:
            return None
        for kind, path in paths.items():
            if path.exists():
                if kind == "bad":
                    return None, b""
                if kind == "ok":
                    return "image/png", b""  # the blob's own type is used
                return kind, path.read_bytes()
        return None

    def _derive(self, cid: str, data: bytes) -> tuple[str | None, bytes]:
        """(mime, derivative bytes); ``b""``: send the original; mime None: unreadable."""
        result = derivative(data, self._max_pixels)
        paths = self._paths(cid)
        if paths is not None:
            kind = "bad" if result[0] is None else ("ok" if not result[1] else result[0])
            _write_atomically(paths[kind], result[1])
        return result if result[0] is not None else (None, b"")

    # -- files ---------------------------------------------------------------------------

    async def _file_text(self, part: Mapping[str, Any], cid: str | None) -> str:
        name = part.get("name") if isinstance(part.get("name"), str) else "attachment"
        text = None
        if cid is not None:
            try:
                data = await self._store.get_blob(self._did, cid)
            except StoreError:
                data = None
            if data is not None:
                text = _capped(data, self._file_text_max)
        if text is None:
            return f"File: {name}\n\n(no text could be extracted from this file)"
        return f"File: {name}\n\n{text}"


def derivative(data: bytes, max_pixels: int) -> tuple[str | None, bytes]:
    """Downscale an image that is too large; ``(mime, b"")`` when it may go as it is."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(data)) as image:
            width, height = image.size
            needs = max(width, height) > max_pixels or len(data) > MAX_IMAGE_BYTES
            if image.format == "JPEG" and needs:
                image.draft("RGB", (max_pixels, max_pixels))  # decode at a lower scale
            image.load()  # a truncated or corrupt file fails here, not at the model
            if not needs:
                return Image.MIME.get(image.format or "", "image/png"), b""
            alpha = image.mode in ("RGBA", "LA", "PA") or "transparency" in image.info
            frame = image.convert("RGBA" if alpha else "RGB")
    except (UnidentifiedImageError, OSError, ValueError, Image.DecompressionBombError):
        return None, b""
    side = max_pixels
    while True:
        copy = frame.copy()
        copy.thumbnail((side, side), Image.Resampling.LANCZOS)
        out = io.BytesIO()
        if alpha:
            copy.save(out, "PNG", optimize=True)
        else:
            copy.save(out, "JPEG", quality=_JPEG_QUALITY, optimize=True)
        if out.tell() <= MAX_IMAGE_BYTES or side <= 256:
            return ("image/png" if alpha else "image/jpeg"), out.getvalue()
        side = int(side * 0.75)


def _capped(data: bytes, limit: int) -> str:
    if len(data) <= limit:
        return data.decode("utf-8", "replace")
    text = data[:limit].decode("utf-8", "ignore")  # never half a character
    return f"{text}\n\n[the rest of this file's text ({len(data) - limit} bytes) is left out]"


def _size(content: Mapping[str, Any]) -> int:
    if content.get("type") == "image_url":
        return len(content["image_url"]["url"])
    return len(str(content.get("text", "")).encode())


def _write_atomically(path: Path, data: bytes) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".derive-")
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except OSError as exc:  # a cache that cannot be written only costs time
        log.warning("could not cache an image derivative at %s: %s", path, exc)


def forget(cache_dir: Path | None, cids: Sequence[str] | set[str]) -> None:
    """Remove the cached derivatives of deleted blobs."""
    if cache_dir is None:
        return
    for cid in cids:
        for path in cache_dir.glob(f"{cid}-*"):
            path.unlink(missing_ok=True)
