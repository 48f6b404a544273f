"""The TLS contexts clients share (turns/tls.py)."""

from __future__ import annotations

import ssl

from turns.tls import tls_context, tls_context_for


def test_an_https_url_gets_the_shared_context_with_its_roots() -> None:
    assert tls_context_for("https://pds.example.com") is tls_context()
    assert tls_context_for("HTTPS://pds.example.com") is tls_context()
    assert tls_context().cert_store_stats()["x509_ca"] > 0


def test_a_plain_http_url_gets_a_context_that_verifies_against_nothing() -> None:
    plain = tls_context_for("http://127.0.0.1:8787")
    assert plain is not tls_context()
    # Still verifying: a redirect to https fails instead of going unchecked.
    assert plain.verify_mode == ssl.CERT_REQUIRED
    assert plain.check_hostname
    assert plain.cert_store_stats()["x509_ca"] == 0
