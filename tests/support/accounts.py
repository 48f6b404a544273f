"""The test accounts, alice and bob, of a local store: their DIDs and secrets, and the
environment variables a test config names for them."""

from __future__ import annotations

from daemon.accounts import local_did

ALICE_TOKEN = "alice-api-token-0123456789"
BOB_TOKEN = "bob-api-token-0123456789"
ALICE_PASSWORD = "alice-password-xyz"
BOB_PASSWORD = "bob-password-xyz"
ALICE = local_did("alice.test")
BOB = local_did("bob.test")

# password_env and token_env of each account, as daemon_config and write_config name them.
ACCOUNT_ENV = {
    "T_ALICE_PASSWORD": ALICE_PASSWORD,
    "T_ALICE_TOKEN": ALICE_TOKEN,
    "T_BOB_PASSWORD": BOB_PASSWORD,
    "T_BOB_TOKEN": BOB_TOKEN,
}
