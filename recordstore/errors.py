"""The errors the record store raises on purpose, all of them :class:`StoreError`s.

A module of their own so that the store's leaf modules (:mod:`recordstore.keys`) raise
them without importing the package.
"""

from __future__ import annotations

__all__ = [
    "BlobNotFound",
    "InvalidKey",
    "InvalidRecord",
    "InvalidSwap",
    "RecordExists",
    "RecordNotFound",
    "StoreError",
]


class StoreError(Exception):
    """Base of every error the store raises on purpose."""


class RecordExists(StoreError):
    """``create_record`` found the key taken: somebody else owns it."""


class RecordNotFound(StoreError):
    pass


class BlobNotFound(StoreError):
    pass


class InvalidSwap(StoreError):
    """The compare-and-swap CID did not match the stored record."""


class InvalidRecord(StoreError):
    """The record does not follow its lexicon; the message names the bad field."""


class InvalidKey(StoreError, ValueError):
    """A key that is not a valid record key (or space key)."""
