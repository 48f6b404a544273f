"""The reference-PDS fixture works, and the PDS behaves as SPEC §4 says turnd relies on."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from atproto import Client
from atproto_client.exceptions import RequestException

from recordstore import MESSAGE
from testbed.pds import Account, PdsServer

pytestmark = pytest.mark.pds


def _vectors() -> list[dict[str, Any]]:
    # The checkout's copy of the shared vectors, else shared/ beside the checkout.
    here = Path(__file__).resolve().parent
    for path in (
        here / "vectors" / "cids.json",
        here.parents[1] / "shared" / "vectors" / "cids.json",
    ):
        if path.exists():
            return json.loads(path.read_text())["vectors"]
    raise FileNotFoundError("cids.json: neither tests/vectors/ nor ../shared/vectors/")


VECTORS = _vectors()


def _client(pds: PdsServer, account: Account, *, app_password: bool = False) -> Client:
    client = Client(pds.url)
    # There is no app view behind this PDS, so skip the Bluesky profile look-up.
    client.login(
        account.handle,
        account.app_password if app_password else account.password,
        fetch_bsky_profile=False,
    )
    return client


def _create(client: Client, did: str, rkey: str, record: dict[str, Any]) -> Any:
    return client.com.atproto.repo.create_record(
        {"repo": did, "collection": MESSAGE, "rkey": rkey, "record": record}
    )


def test_fixture_is_up(pds: PdsServer) -> None:
    desc = pds.xrpc("GET", "com.atproto.server.describeServer")
    assert ".test" in desc["availableUserDomains"]
    assert pds.url.startswith("http://localhost:")
    # A *.test handle resolves from the PDS's own accounts (no DNS).
    account = pds.create_account()
    out = pds.xrpc("GET", "com.atproto.identity.resolveHandle", params={"handle": account.handle})
    assert out["did"] == account.did


def test_created_cids_match_the_vectors(pds: PdsServer, pds_account: Account) -> None:
    client = _client(pds, pds_account, app_password=True)
    for i, vector in enumerate(VECTORS):
        out = _create(client, pds_account.did, f"3m2a4b5c6d7e2:v{i}", vector["record"])
        assert out.cid == vector["cid"], vector["name"]
        assert out.uri == f"at://{pds_account.did}/{MESSAGE}/3m2a4b5c6d7e2:v{i}"


def test_duplicate_create_is_a_bare_500(pds: PdsServer, pds_account: Account) -> None:
    client = _client(pds, pds_account)
    record = VECTORS[0]["record"]
    _create(client, pds_account.did, "3m2a4b5c6d7e2:dup", record)
    with pytest.raises(RequestException) as info:
        _create(client, pds_account.did, "3m2a4b5c6d7e2:dup", {**record, "role": "assistant"})
    # What SPEC §4 measured: no named error (no "RecordExists" or the like), just a 500.
    assert info.value.response is not None
    assert info.value.response.status_code == 500
    # The first record stays.
    got = client.com.atproto.repo.get_record(
        {"repo": pds_account.did, "collection": MESSAGE, "rkey": "3m2a4b5c6d7e2:dup"}
    )
    assert got.cid == VECTORS[0]["cid"]


def test_list_records_reverse_scans_one_space(pds: PdsServer, pds_account: Account) -> None:
    client = _client(pds, pds_account)
    record = VECTORS[0]["record"]
    keys = ["3m2a4b5c6d7e2:b", "3m2a4b5c6d7e2:a", "3m2a4b5c6d7e2:c"]
    for rkey in [*keys, "3m2a4b5c6d7e3:x", "3m2a4b5c6d7e1:y"]:
        _create(client, pds_account.did, rkey, record)

    def rkeys(**params: Any) -> list[str]:
        out = client.com.atproto.repo.list_records(
            {"repo": pds_account.did, "collection": MESSAGE, **params}
        )
        return [r.uri.rsplit("/", 1)[1] for r in out.records]

    # Ascending from just after "<skey>:", the space's records first and in key order.
    assert rkeys(reverse=True, cursor="3m2a4b5c6d7e2:", limit=3) == sorted(keys)
    # Without reverse, newest key first.
    assert rkeys(limit=2) == ["3m2a4b5c6d7e3:x", "3m2a4b5c6d7e2:c"]
    # Descending from just before "<skey>;" (the character after ':') lists the space backwards.
    assert rkeys(cursor="3m2a4b5c6d7e2;", limit=3) == sorted(keys, reverse=True)
