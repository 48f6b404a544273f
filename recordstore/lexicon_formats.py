"""Lexicon string formats (``datetime``, ``did``, ``at-uri``, ...): why a string is not one.

The SDK's validators hold the grammars; ``datetime`` adds year 0000, which Python's
``datetime`` cannot hold, and ``cid`` reads the CID with ``libipld``.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from collections.abc import Callable
from datetime import datetime
from types import ModuleType, SimpleNamespace
from typing import Any

from recordstore.lexicon_data import Fail, check_cid

__all__ = ["FORMATS", "check_format", "is_type_name", "sdk_format"]


def _sdk_string_formats() -> ModuleType:
    """The SDK's ``atproto_client.models.string_formats``, without its package.

    Importing it the usual way runs ``atproto_client/__init__``, which loads the whole XRPC
    client and its generated namespaces (about a second of CPU on every daemon start) that
    the embedded store never uses; the module itself needs only ``atproto_core`` and
    pydantic. Found through the package's import spec (which does not run the package), so
    it is the installed SDK's own file; kept under a private name, so a later import of the
    SDK proper gets its own copy as usual.
    """
    name = "_turnd_sdk_string_formats"
    if name in sys.modules:
        return sys.modules[name]
    package = importlib.util.find_spec("atproto_client")
    assert package is not None and package.submodule_search_locations, "atproto is installed"
    path = f"{package.submodule_search_locations[0]}/models/string_formats.py"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


string_formats = _sdk_string_formats()

# The atproto datetime grammar; the SDK's validator below adds the calendar checks.
_DATETIME = re.compile(
    r"^[0-9]{4}-[01][0-9]-[0-3][0-9]T[0-2][0-9]:[0-5][0-9]:[0-6][0-9](\.[0-9]+)?"
    r"(?P<offset>Z|[+-][0-2][0-9]:[0-5][0-9])$"
)
# The SDK only checks string formats when asked through a pydantic validation
# context; this stand-in carries that opt-in so its public validators can be reused.
_SDK_PREFIX = re.compile(r"^Invalid [^:]*: ")
_STRICT = SimpleNamespace(context={string_formats._OPT_IN_KEY: True})


def sdk_format(fn: Callable[[str, Any], str]) -> Callable[[str], str | None]:
    def check(v: str) -> str | None:
        try:
            fn(v, _STRICT)
        except ValueError as e:
            # "Invalid datetime: must include timezone" -> "must include timezone"
            return _SDK_PREFIX.sub("", str(e))
        return None

    return check


def _datetime(v: str) -> str | None:
    m = _DATETIME.match(v)
    if not m:
        return "expected a form like 2026-01-01T00:00:00.000Z"
    if m["offset"] == "Z" and _calendar_ok(v):
        # The form turnd and most clients write: of the SDK's checks only the calendar's
        # can fail for it, and that one is made here directly, 0.5 µs a timestamp where
        # the SDK's took 1.9 (a turn writes about a dozen). Refusals go to the SDK, for
        # its words.
        return None
    if v.startswith("0000"):
        # Year 0000 is valid (the interop fixtures), which Python's datetime cannot hold:
        # check the calendar on year 2000, which has the same leap rule, and refuse an
        # offset that puts the instant before 0000-01-01T00:00Z.
        err = _sdk_datetime("2000" + v[4:])
        if err is None and m["offset"][0] == "+" and v[5:10] == "01-01":
            minutes = int(v[11:13]) * 60 + int(v[14:16])
            if minutes < int(m["offset"][1:3]) * 60 + int(m["offset"][4:6]):
                return "is before year 0000 in UTC"
        return err
    return _sdk_datetime(v)


def _calendar_ok(v: str) -> bool:
    """Whether a string of :data:`_DATETIME`'s form ending ``Z`` is on the calendar, as
    the SDK's own last check (``fromisoformat``) reads it; from year 0001 (Python's
    ``datetime`` holds no year 0000)."""
    try:
        datetime.fromisoformat(v)
    except ValueError:
        return False
    return True


def _cid_format(v: str) -> str | None:
    try:
        check_cid(v)
    except Fail as e:
        return e.message
    return None


def _at_identifier(v: str) -> str | None:
    if v.startswith("did:"):
        return sdk_format(string_formats.validate_did)(v)
    return sdk_format(string_formats.validate_handle)(v)


_sdk_datetime = sdk_format(string_formats.validate_datetime)

FORMATS: dict[str, Callable[[str], str | None]] = {
    "datetime": _datetime,
    "uri": sdk_format(string_formats.validate_uri),
    "at-uri": sdk_format(string_formats.validate_at_uri),
    "did": sdk_format(string_formats.validate_did),
    "handle": sdk_format(string_formats.validate_handle),
    "at-identifier": _at_identifier,
    "nsid": sdk_format(string_formats.validate_nsid),
    "cid": _cid_format,
    "tid": sdk_format(string_formats.validate_tid),
    "record-key": sdk_format(string_formats.validate_record_key),
    "language": sdk_format(string_formats.validate_language),
}


_FRAGMENT = re.compile(r"^[a-zA-Z][a-zA-Z0-9_-]*$")


def is_type_name(typ: str) -> bool:
    """``com.example.def`` or ``com.example.doc#def``: what a union's ``$type`` may name."""
    nsid, sep, fragment = typ.partition("#")
    if sep and _FRAGMENT.match(fragment) is None:
        return False
    return sdk_format(string_formats.validate_nsid)(nsid) is None



def check_format(name: str, value: str) -> str | None:
    """Why ``value`` is not a valid string of lexicon format ``name`` (None: it is)."""
    check = FORMATS.get(name)
    if check is None:
        raise ValueError(f"unknown string format {name!r}")
    if not isinstance(value, str):
        return "must be a string"
    return check(value)
