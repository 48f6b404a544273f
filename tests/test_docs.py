"""The docs run as written (SPEC §17): the README's curl flow and the Python example of
``lexicons/README.md``, each extracted verbatim from the Markdown and run against a real
``turnd serve`` on its embedded defaults (no config file, the built-in echo provider).

The only inputs the examples take from outside are the ones they document: the
``export TURND_ME_TOKEN=…`` line ``turnd serve`` prints (pasted as printed),
``TURND_ME_PASSWORD`` (the password the first start printed) and ``TURND_URL`` (the
daemon's address: the examples default to 127.0.0.1:8787, which a shared test machine
cannot promise to have free).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from testbed.ports import free_port
from testbed.processes import stop
from tests.support.cli import TURND, Served, clean_env, wait_healthy

ROOT = Path(__file__).resolve().parent.parent


def fenced_block(markdown: Path, heading: str, language: str) -> str:
    """The first ```language block after ``heading``, exactly as the file has it."""
    text = markdown.read_text()
    at = text.index(heading)
    found = re.compile(rf"^```{language}\n(.*?)^```$", re.S | re.M).search(text, at)
    assert found, f"no {language} block after {heading!r} in {markdown}"
    return found.group(1)


class Docs:
    def __init__(self, served: Served, export_line: str, password: str) -> None:
        self.served = served
        self.export_line = export_line
        self.password = password
        self.env = clean_env(TURND_URL=served.url, TURND_HTTP_LISTEN=served.url[len("http://") :])


@pytest.fixture(scope="module")
def docs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Docs]:
    work = tmp_path_factory.mktemp("docs")
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
        yield Docs(served, export.group(1), created.group(1))
    finally:
        stop(proc, 40)


def test_the_readme_curl_flow_runs_as_written(docs: Docs) -> None:
    block = fenced_block(ROOT / "README.md", "### From a web UI (HTTP + SSE)", "sh")
    # The export line exactly as `turnd serve` printed it, then the README's commands.
    script = f"set -eu -o pipefail\n{docs.export_line}\n{block}"
    ran = subprocess.run(
        ["bash", "-c", script], env=docs.env, capture_output=True, text=True, timeout=60
    )
    assert ran.returncode == 0, ran.stdout + ran.stderr
    out = ran.stdout
    # The stream, then regenerate's and cancel's answers, in that order.
    events = re.findall(r"^event: (\S+)$", out, re.M)
    assert events[0] == "step" and events[-1] == "status" and "delta" in events, out
    status = json.loads(re.findall(r"^data: (.*)$", out, re.M)[-1])
    assert status["status"] == "complete", out
    deltas = [
        json.loads(d)["text"]
        for e, d in re.findall(r"^event: (\S+)\ndata: (.*)$", out, re.M)
        if e == "delta"
    ]
    assert "".join(deltas) == "Echo: hi"
    regenerated = re.search(r"\{\"replyKey\":\"(\w+)\.r1\",\"turn\":\"claimed\"\}", out)
    assert regenerated, out
    assert re.search(r'\{"cancelled":(true|false)\}\s*$', out), out
    assert docs.served.proc.poll() is None


def test_the_lexicons_python_example_runs_verbatim_twice(docs: Docs, tmp_path: Path) -> None:
    code = fenced_block(
        ROOT / "lexicons" / "README.md", "## Example: the Python `atproto` SDK", "python"
    )
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
