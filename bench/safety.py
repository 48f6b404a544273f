"""``python -m bench.safety``: the HTTP-side probes of issue 12 (SPEC §12), measured.

Runs ``turnd serve`` (local store, default ``[http]`` limits) and repeats, at full
size, the probes that broke the first round: DNS rebinding (3), a pathological
``/api/render`` (4), slowloris and idle sockets under a 1,024-descriptor limit (5),
and 2,000 wrong passwords (8). Prints one line per figure; ``--json`` adds one JSON
line. Timings are figures to read, not asserted anywhere.
"""

from __future__ import annotations

import argparse
import re
import resource
import socket
import statistics
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from bench.figures import print_figures
from bench.procs import FakeModelProc, TurndProc
from turns.tls import tls_context

MESSAGE = "network.sharedcomputer.chat.message"


def rss_mb(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"VmRSS:\s+(\d+)", status).group(1)) / 1024  # type: ignore[union-attr]


def probe_rebinding(t: TurndProc) -> dict[str, Any]:
    path = f"/xrpc/com.atproto.repo.listRecords?repo=bench.test&collection={MESSAGE}"
    foreign = httpx.get(t.base_url + path, headers={"Host": f"attacker.example:{t.port}"}, verify=tls_context())
    anon = httpx.get(t.base_url + path, verify=tls_context())
    return {
        "rebinding_status": foreign.status_code,
        "rebinding_error": foreign.json().get("error"),
        "anonymous_read_status": anon.status_code,
    }


def _health_latencies(t: TurndProc, seconds: float) -> list[float]:
    out = []
    with httpx.Client(base_url=t.base_url, timeout=30, verify=tls_context()) as c:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            start = time.perf_counter()
            c.get("/healthz")
            out.append(time.perf_counter() - start)
            time.sleep(0.02)
    return out


def probe_render(t: TurndProc) -> dict[str, Any]:
    texts = ["[" * 500_000, "[" * 476_000]  # 976 KB, as in the probe
    baseline = _health_latencies(t, 3.0)  # the same polling with no render running
    health: list[float] = []
    done = threading.Event()

    def poll() -> None:
        with httpx.Client(base_url=t.base_url, timeout=30, verify=tls_context()) as c:
            while not done.is_set():
                start = time.perf_counter()
                c.get("/healthz")
                health.append(time.perf_counter() - start)
                time.sleep(0.02)

    poller = threading.Thread(target=poll)
    poller.start()
    start = time.perf_counter()
    r = httpx.post(
        t.base_url + "/api/render",
        json={"texts": texts},
        headers={"Authorization": f"Bearer {t.token}"},
        timeout=60, verify=tls_context(),
    )
    seconds = time.perf_counter() - start
    done.set()
    poller.join()
    return {
        "render_status": r.status_code,
        "render_error": r.json().get("error"),
        "render_seconds": round(seconds, 2),
        "healthz_during_render_median_ms": round(statistics.median(health) * 1000, 1),
        "healthz_during_render_max_ms": round(max(health) * 1000, 1),
        "healthz_without_render_median_ms": round(statistics.median(baseline) * 1000, 1),
        "healthz_without_render_max_ms": round(max(baseline) * 1000, 1),
    }


def probe_slowloris(t: TurndProc, conns: int = 300, wait: float = 15.0) -> dict[str, Any]:
    socks = []
    for _ in range(conns):
        s = socket.create_connection(("127.0.0.1", t.port))
        s.sendall(b"G")
        socks.append(s)
    start = time.monotonic()
    closed: set[int] = set()
    while time.monotonic() - start < wait:
        time.sleep(5)  # one header byte every 5 s, as in the probe
        for i, s in enumerate(socks):
            if i in closed:
                continue
            try:
                s.sendall(b"E")
                s.setblocking(False)
                try:
                    if s.recv(1) == b"":
                        closed.add(i)
                except BlockingIOError:
                    pass
                finally:
                    s.setblocking(True)
            except OSError:
                closed.add(i)
    for s in socks:
        s.close()
    return {"slowloris_conns": conns, "slowloris_closed_after_15s": len(closed)}


def probe_idle_fds(t: TurndProc, conns: int = 1200, window: float = 18.0) -> dict[str, Any]:
    resource.prlimit(t.pid, resource.RLIMIT_NOFILE, (1024, 1024))
    lines_before = _accept_lines(t)
    socks = []
    for _ in range(conns):
        s = socket.socket()
        s.setblocking(False)
        try:
            s.connect(("127.0.0.1", t.port))
        except BlockingIOError:
            pass
        socks.append(s)
    start = time.monotonic()
    samples: list[tuple[float, int | str, float]] = []
    while time.monotonic() - start < window:
        t0 = time.perf_counter()
        try:
            status: int | str = httpx.get(t.base_url + "/healthz", timeout=5, verify=tls_context()).status_code
        except httpx.HTTPError as err:
            status = type(err).__name__
        samples.append((round(time.monotonic() - start, 1), status, time.perf_counter() - t0))
        time.sleep(0.5)
    for s in socks:
        s.close()
    statuses: dict[str, int] = {}
    for _, status, _ in samples:
        statuses[str(status)] = statuses.get(str(status), 0) + 1
    first_200 = next((at for at, status, _ in samples if status == 200), None)
    return {
        "idle_sockets": conns,
        "healthz_statuses_over_18s": statuses,
        "healthz_first_200_after_s": first_200,
        "healthz_max_ms": round(max(s[2] for s in samples) * 1000, 1),
        "accept_error_log_lines_18s": _accept_lines(t) - lines_before,
    }


def _accept_lines(t: TurndProc) -> int:
    text = t.log_file.read_text(errors="replace")
    return sum(1 for line in text.splitlines() if "accept" in line.lower())


def probe_logins(t: TurndProc, n: int = 2000) -> dict[str, Any]:
    statuses: dict[int, int] = {}
    start = time.perf_counter()
    with httpx.Client(base_url=t.base_url, verify=tls_context()) as c:
        for _ in range(n):
            r = c.post(
                "/xrpc/com.atproto.server.createSession",
                json={"identifier": "bench.test", "password": "wrong"},
            )
            statuses[r.status_code] = statuses.get(r.status_code, 0) + 1
        right = c.post(
            "/xrpc/com.atproto.server.createSession",
            json={"identifier": "bench.test", "password": t.password},
        )
    return {
        "wrong_passwords": n,
        "login_statuses": statuses,
        "login_seconds": round(time.perf_counter() - start, 2),
        "right_password_then": right.status_code,
        "retry_after": right.headers.get("retry-after"),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    out: dict[str, Any] = {}
    with FakeModelProc() as fake, TurndProc({"fake": fake.base_url}) as t:
        out["rss_mb_start"] = round(rss_mb(t.pid), 1)
        out.update(probe_rebinding(t))
        out.update(probe_render(t))
        out.update(probe_slowloris(t))
        out.update(probe_idle_fds(t))
        out.update(probe_logins(t))
        out["rss_mb_end"] = round(rss_mb(t.pid), 1)
    print_figures(out, as_json=args.json, width=34)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
