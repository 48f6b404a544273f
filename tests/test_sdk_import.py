"""``turnd send`` imports the atproto SDK without building the models it never calls
(SPEC §10: ``turnd send`` ≤ 0.5 s), and the loader that does it keeps its cache honest."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from daemon.sdk_import import PostponedFinder

PROBE = textwrap.dedent(
    """
    import sys
    from daemon.sdk_import import postpone_namespace_annotations
    {install}
    import atproto_client
    from atproto_client.namespaces import async_ns
    built = [m for m in sys.modules if m.startswith("atproto_client.models.")]
    hint = async_ns.ComAtprotoRepoNamespace.create_record.__annotations__["data"]
    print(len(built), type(hint).__name__)
    """
)


def _probe(install: str) -> tuple[int, str]:
    done = subprocess.run(
        [sys.executable, "-c", PROBE.format(install=install)],
        capture_output=True, text=True, timeout=120, check=True,
    )
    count, hint_type = done.stdout.split()
    return int(count), hint_type


def test_the_sdk_namespaces_load_without_building_every_lexicon() -> None:
    shipped_count, shipped_hint = _probe("")
    postponed_count, postponed_hint = _probe("postpone_namespace_annotations()")
    # As shipped, every method's annotation imports its lexicon's models at import time.
    assert shipped_hint != "str"
    assert shipped_count > 300
    assert postponed_hint == "str"
    assert postponed_count < shipped_count / 10


def test_the_sdk_still_builds_a_method_s_models_when_it_runs() -> None:
    code = textwrap.dedent(
        """
        from daemon.sdk_import import postpone_namespace_annotations
        postpone_namespace_annotations()
        from atproto_client import models
        params = models.ComAtprotoRepoGetRecord.Params(
            collection="a.b.c", repo="did:plc:x", rkey="k"
        )
        print(params.model_dump(exclude_none=True))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert "'rkey': 'k'" in done.stdout


def _module(tmp_path: Path, name: str, body: str) -> Path:
    source = tmp_path / f"{name}.py"
    source.write_text(body)
    return source


def _load(tmp_path: Path, name: str):  # noqa: ANN202 - a module
    finder = PostponedFinder((name,))
    spec = finder.find_spec(name, [str(tmp_path)])
    assert spec is not None and spec.loader is not None
    module = type(sys)(name)
    module.__spec__ = spec
    spec.loader.exec_module(module)
    return module


def test_annotations_stay_strings_and_the_cache_follows_the_source(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    # An annotation naming something that does not exist would raise when evaluated.
    _module(tmp_path, "postponed_probe", "def f(x: nowhere.Thing) -> int:\n    return 1\n")
    first = _load(tmp_path, "postponed_probe")
    assert first.f.__annotations__ == {"x": "nowhere.Thing", "return": "int"}
    cached = list((tmp_path / "__pycache__").glob("postponed_probe.*postponed.pyc"))
    assert len(cached) == 1

    # A changed source (another size) is compiled again, not served from the cache.
    changed = "def f(y: elsewhere.Thing = None) -> str:\n    return 'changed'\n"
    _module(tmp_path, "postponed_probe", changed)
    second = _load(tmp_path, "postponed_probe")
    assert second.f() == "changed"
    assert second.f.__annotations__["y"] == "elsewhere.Thing"

    # A torn cache file is compiled over, not trusted.
    cached[0].write_bytes(b"\x00garbage")
    third = _load(tmp_path, "postponed_probe")
    assert third.f() == "changed"


def test_no_cache_is_written_when_python_writes_no_bytecode(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    _module(tmp_path, "unwritten_probe", "def f(x: nowhere.Thing) -> int:\n    return 1\n")
    assert _load(tmp_path, "unwritten_probe").f(None) == 1
    assert not list(tmp_path.glob("**/*.pyc"))


def test_the_blocking_client_s_namespaces_run_only_when_used() -> None:
    code = textwrap.dedent(
        """
        import sys
        from daemon.sdk_import import SYNC_NAMESPACES, postpone_namespace_annotations
        postpone_namespace_annotations()
        import atproto_client
        module = sys.modules[SYNC_NAMESPACES]
        print(type(module).__name__)  # LazyLoader's stand-in until an attribute is read
        print(type(module.ComAtprotoRepoNamespace.create_record.__annotations__["data"]).__name__)
        print(type(module).__name__)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert done.stdout.split() == ["_LazyModule", "str", "module"]


def test_a_module_it_was_not_asked_for_is_left_to_the_usual_finders(tmp_path: Path) -> None:
    _module(tmp_path, "ordinary_probe", "X = 1\n")
    assert PostponedFinder(("something_else",)).find_spec("ordinary_probe", [str(tmp_path)]) is None
