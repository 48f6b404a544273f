"""The docs run as written (SPEC §17): every fenced block of ``README.md`` and
``lexicons/README.md``, extracted from the Markdown, is run, checked or visibly marked.

- ``sh`` blocks run in one bash per file, in document order (as a reader pasting them
  into one terminal would), against a real ``turnd serve`` on its embedded defaults (no
  config file, the built-in echo provider), in the directory it was started in, with the
  venv's ``bin`` first on ``PATH`` and ``.venv`` there (as in a checkout). A block that
  cannot run in a test says so on its first line, visibly:
  ``# not run by tests/test_docs.py: <why>``.
- ``toml`` blocks are configs turnd accepts: a block with a ``[store]`` table on its own,
  any other added to the ``turnd.toml`` that ``turnd init`` writes (its tables edited, as a
  reader pasting the block would), given the values the README exports for the variables
  it names (dummies for the others).
- ``json`` blocks are a record (``lexicons/README.md``: valid against the lexicons) or an
  API answer (``README.md``: the shape the live route answers).
- ``python`` blocks: the direct-write example runs verbatim, twice in a row; the approval
  example runs in ``tests/test_tools.py``, where a call waits for approval.
- ``text`` blocks are output, diagrams or templates, not commands; the ``turnd usage``
  table is what ``turnd usage`` prints.
- Inline commands in the prose (`` `turnd usage [--account NAME]` ``, `` `python -m bench
  --quick` ``, `` `pip install 'turnd[otel]'` ``) name commands, modules, options and
  extras that exist.

The only inputs the examples take from outside are the ones they document: the
``export TURND_ME_TOKEN=…`` line ``turnd serve`` prints (pasted as printed) and
``TURND_URL`` (the daemon's address: the examples default to 127.0.0.1:8787, which a shared
test machine cannot promise to have free; ``TURND_HTTP_LISTEN`` tells ``turnd send`` the same).
"""

from __future__ import annotations

import copy
import json
import os
import re
import shlex
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import pytest

from testbed.ports import free_port
from testbed.processes import stop
from tests.support.cli import TURND, Served, clean_env, wait_healthy

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
LEXICONS = ROOT / "lexicons" / "README.md"
BIN = Path(sys.executable).parent
NOT_RUN = re.compile(r"\A# not run by tests/test_docs\.py: (\S.*)$", re.M)
LANGUAGES = {"sh", "toml", "json", "python", "text", "nginx"}


@dataclass(frozen=True)
class Block:
    file: Path
    line: int  # of the opening fence
    language: str
    text: str
    heading: str  # the nearest heading above it

    @property
    def not_run(self) -> str | None:
        found = NOT_RUN.match(self.text)
        return found.group(1) if found else None

    def __str__(self) -> str:
        return f"{self.file.relative_to(ROOT)}:{self.line} ({self.language}, {self.heading!r})"


def blocks(markdown: Path, language: str | None = None) -> list[Block]:
    """The fenced blocks, in order, each with the heading it is under (headings inside a
    block — a shell comment — are not headings)."""
    out: list[Block] = []
    heading, opened, body = "", None, []
    for number, line in enumerate(markdown.read_text().splitlines(keepends=True), 1):
        if opened is None:
            if line.startswith("```"):
                opened, body = (number, line[3:].strip()), []
            elif found := re.match(r"#+ (.*)$", line):
                heading = found.group(1)
        elif line.rstrip("\n") == "```":
            out.append(Block(markdown, opened[0], opened[1], "".join(body), heading))
            opened = None
        else:
            body.append(line)
    assert opened is None, f"{markdown}:{opened}: a fence that never closes"
    return [b for b in out if language is None or b.language == language]


def fenced_block(markdown: Path, heading: str, language: str) -> str:
    """The first ```language block after ``heading``, exactly as the file has it."""
    found = [b for b in blocks(markdown, language) if b.heading == heading.lstrip("# ")]
    assert found, f"no {language} block after {heading!r} in {markdown}"
    return found[0].text


# -- every block is run, checked or marked ----------------------------------------------------

# Blocks run by another test, where what they need is set up: (file, heading) -> that test.
ELSEWHERE = {
    (LEXICONS, "Approving a tool call"): (
        ROOT / "tests" / "test_tools.py",
        "test_the_lexicons_readme_approval_example_runs_against_a_live_daemon",
    ),
}


def test_every_block_is_run_checked_or_marked_not_run() -> None:
    unknown = []
    for block in blocks(README) + blocks(LEXICONS):
        if block.language not in LANGUAGES:
            unknown.append(f"{block}: no fence language (sh, toml, json, python or text)")
        elif block.language == "nginx" and not block.not_run:
            unknown.append(f"{block}: nothing runs nginx: mark it not run")
        elif block.language == "python" and (block.file, block.heading) not in ELSEWHERE:
            if block.heading != "Example: the Python `atproto` SDK":
                unknown.append(f"{block}: a Python example nothing runs")
    assert not unknown, "\n".join(unknown)
    for test_file, name in ELSEWHERE.values():
        assert f"def {name}(" in test_file.read_text() or f"async def {name}(" in (
            test_file.read_text()
        ), name
    # The blocks marked not run, each with its reason: exactly the README's short list
    # ("What the CLI says"), so a new one is a decision, not a default.
    marked = [b for b in blocks(README) + blocks(LEXICONS) if b.not_run]
    assert all(b.language in ("sh", "nginx") for b in marked), marked
    assert sorted((b.file.name, b.heading) for b in marked) == sorted(NOT_RUN_LISTED), marked


# (file, heading) of each block marked not run; the README's list says why.
NOT_RUN_LISTED = [
    ("README.md", "turnd"),  # installing from the package registry
    ("README.md", "turnd"),  # the whole test suite
    ("README.md", "Tools"),  # three tool servers
    ("README.md", "Approval"),  # a call waiting for approval
    ("README.md", "Your own PDS"),
    ("README.md", "Running several instances"),  # Redis and three configs
    ("README.md", "Running several instances"),  # nginx
]


# -- a live daemon on the embedded defaults ----------------------------------------------------


class Docs:
    def __init__(self, served: Served, work: Path, export_line: str, password: str) -> None:
        self.served = served
        self.work = work
        self.export_line = export_line
        self.password = password
        listen = served.url[len("http://") :]
        self.env = clean_env(
            TURND_URL=served.url, TURND_HTTP_LISTEN=listen,
            PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', os.defpath)}",
        )


@pytest.fixture(scope="module")
def docs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Docs]:
    work = tmp_path_factory.mktemp("docs")
    (work / ".venv").symlink_to(sys.prefix)  # `.venv/bin/turnd` as in a checkout
    listen = f"127.0.0.1:{free_port()}"
    out, err = work / "serve.out", work / "serve.err"
    with out.open("wb") as o, err.open("wb") as e:
        proc = subprocess.Popen(
            [TURND, "serve"], cwd=work, env=clean_env(TURND_HTTP_LISTEN=listen), stdout=o, stderr=e
        )
    served = Served(proc, out, err, f"http://{listen}")
    try:
        export = served.wait_for(r"(?m)^turnd: for the README's curl examples: (export .*)$", 30)
        created = served.wait_for(r"created account me\.test .* password (\S+) token ")
        wait_healthy(served.url, timeout=15)
        yield Docs(served, work, export.group(1), created.group(1))
    finally:
        stop(proc, 40)


SEPARATOR = "::docs-block::"
# Every failing command is reported (a stream ended by its own `-m N` exits 28: that is
# how the README's stream examples end).
TRAP = (
    "trap 'rc=$?; case \"$BASH_COMMAND\" in *\" -m \"*) [ \"$rc\" = 28 ] && rc=0;; esac; "
    "[ \"$rc\" = 0 ] || echo \"docs-test: exit $rc: $BASH_COMMAND\" >&2' ERR"
)


def run_shell(docs: Docs, runnable: list[Block], prelude: str = "") -> list[str]:
    """The blocks in one bash, in order; each block's output."""
    script = ["set -Eu -o pipefail", TRAP, prelude]
    for block in runnable:
        script += [f"printf '\\n%s\\n' '{SEPARATOR}'", block.text]
    ran = subprocess.run(
        ["bash", "-c", "\n".join(script)], cwd=docs.work, env=docs.env,
        capture_output=True, text=True, timeout=240,
    )
    assert ran.returncode == 0 and "docs-test: exit" not in ran.stderr, ran.stdout + ran.stderr
    outputs = ran.stdout.split(f"\n{SEPARATOR}\n")[1:]
    assert len(outputs) == len(runnable), ran.stdout
    return outputs


def _events(text: str) -> list[tuple[str, dict[str, Any]]]:
    return [(e, json.loads(d)) for e, d in re.findall(r"^event: (\S+)\ndata: (.*)$", text, re.M)]


def _json_values(text: str) -> list[Any]:
    """The JSON objects in ``text`` outside event lines (curl prints answers back to back)."""
    decoder, found, at = json.JSONDecoder(), [], 0
    while (at := text.find("{", at)) >= 0:
        if text.rfind("data: ", 0, at) == at - len("data: "):
            at += 1
            continue
        try:
            value, at = decoder.raw_decode(text, at)
            found.append(value)
        except json.JSONDecodeError:
            at += 1
    return found


def test_the_readme_shell_blocks_run_as_written(docs: Docs) -> None:
    sh = blocks(README, "sh")
    runnable = [b for b in sh if not b.not_run]
    # The export line exactly as `turnd serve` printed it, then the README's commands.
    ran = run_shell(docs, runnable, docs.export_line)
    outputs = dict(zip([b.heading for b in runnable], ran, strict=True))
    assert set(outputs) == {"turnd", "From a web UI (HTTP + SSE)", "Managing conversations"}, (
        list(outputs)
    )

    # The first steps: `turnd send "hello"`, from the directory `serve` runs in.
    assert outputs["turnd"].strip() == "Echo: hello"

    # The curl flow: the stream, then regenerate's and cancel's answers, in that order.
    out = outputs["From a web UI (HTTP + SSE)"]
    events = _events(out)
    assert events[0][0] == "step" and events[-1][0] == "status", out
    assert events[-1][1]["status"] == "complete", out
    assert "".join(d["text"] for e, d in events if e == "delta") == "Echo: hi"
    regenerated = re.search(r"\{\"replyKey\":\"(\w+)\.r1\",\"turn\":\"claimed\"\}", out)
    assert regenerated, out
    assert re.search(r'\{"cancelled":(true|false)\}\s*$', out), out

    # Managing conversations, on the conversation the curl flow made ($S).
    out = outputs["Managing conversations"]
    decoder = json.JSONDecoder()
    listed, at = decoder.raw_decode(out)
    first = [c for c in listed["conversations"] if c["title"] == "First chat"]
    assert len(first) == 1 and listed["cursor"] is None, out
    skey = first[0]["skey"]
    patched, at = decoder.raw_decode(out, at)
    assert patched["info"]["title"] == "Lyon, May" and patched["info"]["titleSource"] == "user"
    events = _events(out[at:])
    assert ("title", {"title": "Lyon, May", "titleSource": "user"}) in events, out
    assert any(e == "record" and d["collection"].endswith(".message") for e, d in events), out
    assert ("conversation", {"action": "update", "skey": skey, "title": "Lyon, May"}) in events
    answers = [v for v in _json_values(out[at:]) if set(v) == {"preferences"}]
    assert len(answers) == 2 and answers[-1]["preferences"]["generateTitles"] is False, out
    assert out.rstrip().endswith("204"), out
    assert docs.served.proc.poll() is None


def test_the_lexicons_shell_block_runs_the_python_example_as_written(docs: Docs) -> None:
    (sh,) = blocks(LEXICONS, "sh")
    (docs.work / "hello.py").write_text(
        fenced_block(LEXICONS, "## Example: the Python `atproto` SDK", "python")
    )
    outputs = run_shell(docs, [sh, sh])  # twice: fresh keys each run
    assert outputs == ["complete None ['Echo: hello']\n"] * 2, outputs


def test_the_lexicons_python_example_runs_verbatim_twice(docs: Docs, tmp_path: Path) -> None:
    code = fenced_block(LEXICONS, "## Example: the Python `atproto` SDK", "python")
    script = tmp_path / "hello.py"
    script.write_text(code)
    env = {**docs.env, "TURND_ME_PASSWORD": docs.password}
    outputs = []
    for _ in range(2):  # fresh keys each run: the second must not collide with the first
        ran = subprocess.run(
            [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=90
        )
        assert ran.returncode == 0, ran.stdout + ran.stderr
        outputs.append(ran.stdout)
    assert outputs == ["complete None ['Echo: hello']\n"] * 2, outputs


# -- configs, records, answers, outputs --------------------------------------------------------


def _merge(into: dict[str, Any], table: dict[str, Any]) -> dict[str, Any]:
    for key, value in table.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = value
    return into


def test_the_readme_toml_blocks_are_configs_turnd_accepts(tmp_path: Path) -> None:
    from daemon.config import build_config
    from daemon.config_file import ConfigError

    text = README.read_text()
    # The values the README itself exports (`export NAME=value …` lines of its sh blocks).
    exported = dict(re.findall(r"(?:export |\s)([A-Z][A-Z0-9_]*)=(\S+)", "\n".join(
        line for b in blocks(README, "sh") for line in b.text.splitlines()
        if line.startswith("export ")
    )))
    env = clean_env(OPENAI_API_KEY="sk-docs-test-key", PATH=f"{BIN}{os.pathsep}{os.defpath}")
    started = subprocess.run(
        [TURND, "init", "--config", str(tmp_path / "turnd.toml")], cwd=tmp_path, env=env,
        capture_output=True, text=True, timeout=60,
    )
    assert started.returncode == 0, started.stderr
    env.update(re.findall(r"^([A-Z_]+)=(\S+)$", (tmp_path / "turnd.env").read_text(), re.M))
    starter = tomllib.loads((tmp_path / "turnd.toml").read_text())
    toml_blocks = blocks(README, "toml")
    assert len(toml_blocks) >= 9 and text.count("```toml") == len(toml_blocks)
    for block in toml_blocks:
        table = tomllib.loads(block.text)
        data = table if "store" in table else _merge(copy.deepcopy(starter), table)
        named = re.findall(r'"([A-Z][A-Z0-9_]+)"', block.text)
        block_env = {**env, **{n: exported.get(n, "docs-test-value") for n in named}}
        try:
            config = build_config(data, env=block_env, path=tmp_path / "turnd.toml",
                                  base_dir=tmp_path)
        except ConfigError as err:
            pytest.fail(f"{block}: {err}")
        assert config.providers, block


def test_the_lexicons_json_examples_are_valid_records() -> None:
    from recordstore.lexicon import validate_record

    examples = blocks(LEXICONS, "json")
    assert len(examples) == 2
    for block in examples:
        record = json.loads(block.text)
        validate_record(record["$type"], record)


def test_the_readme_json_answers_have_the_live_routes_shape(docs: Docs) -> None:
    import httpx

    from turns.tls import tls_context

    token = re.search(r"TURND_ME_TOKEN=(\S+)", docs.export_line).group(1)  # type: ignore[union-attr]
    api = httpx.Client(base_url=docs.served.url, headers={"Authorization": f"Bearer {token}"},
                       timeout=30, verify=tls_context())
    skey = api.post("/api/conversations", json={}).json()["skey"]
    posted = api.post(f"/api/conversations/{skey}/messages", json={
        "parts": [{"$type": "network.sharedcomputer.chat.defs#textPart", "text": "hi"}],
        "generation": {},
    }).json()
    api.get(f"/api/conversations/{skey}/messages/{posted['replyKey']}/stream").read()
    live = {
        "replies": api.get(f"/api/conversations/{skey}/usage").json(),
        "from": api.get("/api/usage").json(),
    }
    optional = {"cost", "quota"}  # absent without a price, without a quota (as documented)
    answers = blocks(README, "json")
    assert {next(iter(json.loads(b.text))) for b in answers} == set(live), answers
    for block in answers:
        example = json.loads(block.text)
        answer = live[next(iter(example))]
        assert set(example) - optional <= set(answer) <= set(example), (block, answer)
        if "replies" in example:
            (shown,), (got,) = example["replies"].values(), answer["replies"].values()
        else:
            (shown,), got = example["rows"], answer["rows"][0]
        assert set(shown) - optional <= set(got) <= set(shown), (block, got)


def test_the_readme_usage_table_is_what_turnd_usage_prints(docs: Docs) -> None:
    (table,) = [b for b in blocks(README, "text") if b.text.startswith("usage of ")]
    printed = subprocess.run(
        [TURND, "usage"], cwd=docs.work, env=docs.env, capture_output=True, text=True, timeout=60
    )
    assert printed.returncode == 0, printed.stderr
    shown, got = table.text.splitlines(), printed.stdout.splitlines()
    assert got[:2] == shown[:2], printed.stdout
    assert re.match(r"today \d{4}-\d\d-\d\d +\d+", got[2]) and got[3].startswith("month "), got


# -- inline commands in the prose --------------------------------------------------------------

INLINE = re.compile(r"`((?:turnd|python -m|pip install) [^`]*|turnd)`")


def inline_commands() -> list[str]:
    text = README.read_text() + LEXICONS.read_text()
    # Fenced blocks are checked above; only the prose's inline code here.
    prose = re.sub(r"^```.*?^```$", "", text, flags=re.S | re.M)
    return sorted(set(INLINE.findall(prose)))


def test_the_inline_commands_name_commands_and_options_that_exist() -> None:
    from daemon.cli import build_parser

    commands = inline_commands()
    assert "turnd usage [--account NAME]" in commands and "turnd --version" in commands
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    for command in commands:
        words = shlex.split(command)
        if words[0] != "pip":  # `[--flag]`: an optional flag, in a usage line
            words = shlex.split(command.replace("[", "").replace("]", ""))
        if words[0] == "turnd":
            if any(w in ("<version>", "…") for w in words):
                continue  # what --version prints, not a command
            args = words[1:]
            if len(args) == 1 and not args[0].startswith("-"):
                args.append("--help")  # a command named in passing (`turnd send`): it exists
            try:
                build_parser().parse_args(args)
            except SystemExit as stop:  # --version and --help exit 0
                assert stop.code == 0, command
        elif words[0] == "pip":
            extra = re.fullmatch(r"turnd\[(\w+)\]", words[2])
            assert extra and extra.group(1) in pyproject["project"]["optional-dependencies"]
        else:
            module = words[2]
            spec = find_spec(module)
            if spec is not None and spec.submodule_search_locations:  # a package: its __main__
                spec = find_spec(f"{module}.__main__")
            assert spec is not None and spec.origin, command
            source = Path(spec.origin).read_text()
            for flag in (w for w in words[3:] if w.startswith("--")):
                assert f'"{flag}"' in source, f"{command}: {module} takes no {flag}"
