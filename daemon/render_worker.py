"""The render worker process: ``python -m daemon.render_worker`` (see daemon.render).

Once imported it writes one byte (:data:`READY`); then it reads requests from
stdin and answers on stdout, each an 8-byte big-endian length and a JSON body: a
list of Markdown texts in, a list of HTML strings out. It imports nothing of the
server, so it starts in a fraction of a second, and it ends when its stdin closes
(the daemon went away).
"""

from __future__ import annotations

import json
import os
import signal
import sys

READY = b"R"  # the one byte a started worker writes before it reads any request


def _read(stream: object, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = stream.read(n - len(data))  # type: ignore[attr-defined]
        if not chunk:
            return b""
        data += chunk
    return data


def main() -> int:
    # Below the daemon's priority: a long render takes the CPU the server leaves, so
    # other requests are not slowed by it (on a machine with few cores).
    os.nice(10)
    # A terminal's Ctrl-C reaches the whole process group: the daemon decides when a
    # worker ends (it closes stdin or kills it), so the worker prints no traceback.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    # Imported here, not at the top: the daemon imports this module for READY, and
    # markdown-it with Pygments cost every daemon start ~0.1 s of CPU it never used.
    from daemon.markdown import render_many

    # Imported: ready. The daemon starts a render's clock only after this byte, so a
    # worker slow to start on a loaded machine is not taken for a text too complex.
    stdout.write(READY)
    stdout.flush()
    while True:
        header = _read(stdin, 8)
        if not header:
            return 0
        texts = json.loads(_read(stdin, int.from_bytes(header, "big")))
        body = json.dumps(render_many(texts)).encode()
        stdout.write(len(body).to_bytes(8, "big") + body)
        stdout.flush()


if __name__ == "__main__":
    raise SystemExit(main())
