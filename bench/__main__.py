"""``python -m bench``: turnd against the SPEC §10 targets, side by side in one run.

The fake model server and ``turnd serve`` each run in their own process on loopback;
this process is the client (and the "other process" of a direct write). Every figure
is measured over several runs; the table shows the median with min and max, beside
its target and beside LiteLLM's. ``--json`` ends the output with one JSON line.

    python -m bench --quick          # about a minute (plus LiteLLM's install, once)
    python -m bench                  # the full run (100 samples a run, 5 runs)
    python -m bench --smoke --json   # a few seconds: checks the bench itself, not turnd
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio

from bench import litellm_proxy, measure
from bench.procs import FakeModelProc, TurndProc


@dataclass(frozen=True)
class Sizes:
    runs: int  # runs per figure (the median over them is reported)
    samples: int  # turns per run for latencies
    streams: int  # concurrent turns for the streaming ratio
    stream_tokens: int  # tokens per streamed reply in that phase
    stream_runs: int
    rss_runs: int
    rss_first: int
    rss_total: int
    rss_concurrency: int
    litellm_samples: int
    short_turns: int  # turns per run for CPU per turn (5 tokens each, 20 at a time)
    big_streams: int  # the many-streams run (0: skipped)


SIZES = {
    "smoke": Sizes(1, 3, 5, 20, 1, 1, 5, 10, 4, 3, 10, 10),
    "quick": Sizes(3, 20, 200, 50, 3, 1, 100, 1000, 20, 20, 300, 1000),
    "full": Sizes(5, 100, 200, 200, 5, 3, 100, 1000, 20, 100, 1000, 1000),
}

@dataclass(frozen=True)
class Target:
    """SPEC §10's "now" column for one figure: the text shown, and the check on the
    medians of the run (None: the figure has no target; the check answers None when
    the run cannot tell, e.g. LiteLLM was skipped)."""

    text: str = ""
    ok: Callable[[float, dict[str, float]], bool | None] | None = None
    peer: str | None = None  # LiteLLM's figure key, or a text shown in its column


def _vs_litellm(v: float, medians: dict[str, float]) -> bool | None:
    peer = medians.get("litellm_ttft_overhead_ms_p50")
    if v > 3:
        return False
    return None if peer is None else v <= 0.35 * peer


def targets(sizes: Sizes) -> dict[str, Target]:
    """Every figure of the table, with SPEC §10's "now" target where it names one."""
    long = sizes.stream_tokens >= 200  # the full run: >= 1.3 at 200 tokens a turn
    ratio = 1.3 if long else 1.0
    return {
        "ttft_overhead_ms_p50": Target("<= 3 ms and <= 0.35 x LiteLLM", _vs_litellm,
                                       "litellm_ttft_overhead_ms_p50"),
        "ttft_overhead_ms_p99": Target(peer="litellm_ttft_overhead_ms_p99"),
        "stream_ratio": Target(f">= {ratio} ({sizes.stream_tokens} tokens a turn)",
                               lambda v, _: v >= ratio, "0.18 (SPEC §10)"),
        "claim_latency_ms_p50": Target("<= 3 ms", lambda v, _: v <= 3),
        # The bench's own client building each of those writes, before their clock starts.
        "xrpc_request_build_ms_p50": Target(),
        "rss_growth_pct": Target("<= 5 %", lambda v, _: v <= 5),
        "per_token_overhead_us": Target(),
        "turnd_cpu_ms_per_turn": Target("<= 3 ms", lambda v, _: v <= 3),
        "turns_per_s": Target(">= 300 (one core)", lambda v, _: v >= 300),
        "send_wall_s": Target("<= 0.5 s", lambda v, _: v <= 0.5),
        "stream_ratio_1000": Target(">= 0.8", lambda v, _: v >= 0.8),
        "stream_1000_events_missing": Target("0 (every event delivered)", lambda v, _: v == 0),
        "stream_1000_incomplete": Target("0", lambda v, _: v == 0),
        "turnd_cpu_us_per_token": Target(peer="1450 (SPEC §10)"),
        "relay_cpu_us_per_token": Target(),
        "xrpc_write_to_first_delta_ms_p50": Target(),
        "claim_to_first_delta_ms_p50": Target(),
        "model_ttft_ms_p50": Target(),
        "litellm_ttft_overhead_ms_p50": Target(),
        # [cluster] (SPEC §18, bench/cluster.py): with Redis vs without, in the same run.
        "cluster_ttft_added_ms_p50": Target("<= +1 ms", lambda v, _: v <= 1),
        "cluster_remote_ttft_ms_p50": Target(),
        "cluster_delivery_ms_p50": Target("<= 2 ms", lambda v, _: v <= 2),
        "cluster_delivery_ms_p99": Target(),
        "cluster_stream_ratio": Target(),
    }


def verdicts(sizes: Sizes, details: dict[str, dict[str, Any]]) -> dict[str, bool | None]:
    """Per figure with a target: met (True), missed (False), cannot tell or not
    measured (None)."""
    medians = {k: d["median"] for k, d in details.items()}
    out: dict[str, bool | None] = {}
    for key, t in targets(sizes).items():
        if t.ok is not None:
            out[key] = t.ok(medians[key], medians) if key in medians else None
    return out


MAIN_KEYS = [
    "ttft_overhead_ms_p50", "ttft_overhead_ms_p99", "stream_ratio", "claim_latency_ms_p50",
    "rss_growth_pct", "litellm_ttft_overhead_ms_p50",
]


_T0 = time.monotonic()


def log(message: str) -> None:
    print(f"[{time.monotonic() - _T0:6.1f}s] {message}", file=sys.stderr, flush=True)


def machine() -> dict[str, Any]:
    model = ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {
        "date": _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d"),
        "cores": os.cpu_count(),
        "cpu": model,
        "python": platform.python_version(),
        "platform": platform.platform(terse=True),
        # Other work on the machine skews every figure: the load when the run started.
        "loadavg_at_start": round(os.getloadavg()[0], 2),
    }


def summarize(runs: list[dict[str, float]]) -> dict[str, dict[str, Any]]:
    """Per figure: the median over runs, min, max and the per-run values."""
    out: dict[str, dict[str, Any]] = {}
    for key in runs[0] if runs else ():
        values = [r[key] for r in runs if key in r and math.isfinite(r[key])]
        if values:
            out[key] = {"median": statistics.median(values), "min": min(values),
                        "max": max(values), "runs": [round(v, 4) for v in values]}
    return out


PHASES = ("ttft", "claims", "streaming", "short", "send", "many", "memory", "litellm", "cluster")


async def _run(mode: str, sizes: Sizes, phases: frozenset[str]) -> dict[str, Any]:
    details: dict[str, dict[str, Any]] = {}
    notes: dict[str, str] = {}
    with (
        FakeModelProc(tokens=200, ttft_ms=20) as fake,
        FakeModelProc(tokens=sizes.stream_tokens, ttft_ms=0) as stream_fake,
        FakeModelProc(tokens=20, ttft_ms=0) as short_fake,
        FakeModelProc(tokens=5, ttft_ms=0) as tiny_fake,
        FakeModelProc(tokens=200, ttft_ms=0) as big_fake,
    ):
        log(f"fake model servers: pids {fake.pid}, {stream_fake.pid}, {short_fake.pid}")
        # The many-streams run holds ~1000 SSE connections open, and the POSTs beside them.
        with TurndProc({"fake": fake.base_url, "stream": stream_fake.base_url,
                        "tiny": tiny_fake.base_url, "big": big_fake.base_url},
                       max_connections=max(1000, 2 * sizes.big_streams + 100)) as turnd:
            log(f"turnd serve: pid {turnd.pid} at {turnd.base_url}")
            if "ttft" in phases:
                log("time to first token (POST -> first delta at a subscriber, vs the bare client):")
                details |= summarize(await measure.ttft(turnd, fake, sizes.runs, sizes.samples, log))
            if "claims" in phases:
                log("direct writes through XRPC (claim, first delta):")
                details |= summarize(await measure.claims(turnd, sizes.runs, sizes.samples, log))
            if "streaming" in phases:
                log(f"streaming: {sizes.streams} concurrent turns x {sizes.stream_tokens} tokens:")
                details |= summarize(await measure.streaming(
                    turnd, stream_fake, sizes.stream_runs, sizes.streams, log, provider="stream"))
            if "short" in phases:
                log(f"CPU per turn: {sizes.short_turns} turns x 5 tokens, 20 at a time, each "
                    f"run beside {sizes.short_turns} of {sizes.stream_tokens} tokens for the relay's "
                    "CPU a token, which is subtracted:")
                details |= summarize(await measure.short_turns(
                    turnd, sizes.stream_runs, sizes.short_turns, 20, 5, log,
                    provider="tiny", long=("stream", sizes.stream_tokens)))
            if "send" in phases:
                log('turnd send "hello" (echo provider), wall:')
                details |= summarize(measure.send_wall(turnd, sizes.runs, log))
            if sizes.big_streams and "many" in phases:
                log(f"{sizes.big_streams} concurrent streams x 200 tokens:")
                big = await measure.streaming(turnd, big_fake, 1, sizes.big_streams, log, provider="big")
                details |= summarize([{
                    "stream_ratio_1000": r["stream_ratio"],
                    "stream_1000_events_missing": r["stream_events_missing"],
                    "stream_1000_incomplete": r["stream_incomplete"],
                    "stream_1000_tokens_per_s": r["turnd_tokens_per_s"],
                    "stream_1000_resubscribed": r["stream_resubscribed"],
                } for r in big])
        if "memory" in phases:
            log(f"memory: RSS after {sizes.rss_first} and {sizes.rss_total} turns "
                "(fresh turnd each run):")
            details |= summarize(await measure.memory(
                short_fake, sizes.rss_runs, sizes.rss_first, sizes.rss_total,
                sizes.rss_concurrency, log))
        if "litellm" in phases:
            log("LiteLLM proxy (1 worker) in front of the same fake server:")
            binary, why = litellm_proxy.ensure_installed(log)
            if binary is None:
                notes["litellm"] = why or "not installed"
            else:
                try:
                    with (
                        tempfile.TemporaryDirectory(prefix="turnd-bench-litellm-") as tmp,
                        litellm_proxy.LiteLLMProxy(binary, fake.base_url, Path(tmp)) as proxy,
                    ):
                        details |= summarize(await litellm_proxy.ttft(
                            proxy.base_url, fake.base_url, sizes.runs, sizes.litellm_samples, log))
                except Exception as err:  # noqa: BLE001 - the figure is null with the reason
                    notes["litellm"] = f"LiteLLM proxy failed: {str(err)[:300]}"
        else:
            notes["litellm"] = "skipped (--no-litellm, --only)"
    if "cluster" in phases:
        from bench import cluster

        rows, why = await cluster.run_all(sizes, log)
        if why:
            notes["cluster"] = why
        details |= summarize(rows)
    else:
        notes["cluster"] = "skipped (--no-cluster, --only)"
    return {"details": details, "notes": notes}


def _fmt(v: float | None) -> str:
    if v is None:
        return "-"
    if abs(v) >= 100:
        return f"{v:.0f}"
    if abs(v) >= 10:
        return f"{v:.1f}"
    return f"{v:.2f}" if abs(v) >= 1 else f"{v:.3f}"


def table(sizes: Sizes, details: dict[str, dict[str, Any]], notes: dict[str, str]) -> str:
    rows = [("figure", "median", "min", "max", "target (SPEC §10)", "LiteLLM")]
    met = verdicts(sizes, details)
    for key, t in targets(sizes).items():
        d = details.get(key)
        if d is None:
            rows.append((key, "null", "-", "-", t.text, notes.get("litellm", "") if key.startswith("litellm") else ""))
            continue
        mark = {None: "", True: " ok", False: " MISS"}[met.get(key)]
        if key in met and met[key] is None:
            mark = " ?"  # the run cannot tell (LiteLLM's figure missing)
        peer_text = ""
        if t.peer is not None:
            peer_text = _fmt(details[t.peer]["median"]) if t.peer in details else (
                t.peer if not t.peer.startswith("litellm") else "null")
        rows.append((key, _fmt(d["median"]), _fmt(d["min"]), _fmt(d["max"]), t.text + mark, peer_text))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    size = p.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="about a minute")
    size.add_argument("--smoke", action="store_true",
                      help="a few seconds at minimal sizes: checks the bench code, not turnd")
    p.add_argument("--json", action="store_true", help="end with one JSON object on one line")
    p.add_argument("--no-litellm", action="store_true", help="skip the LiteLLM proxy figure")
    p.add_argument("--no-cluster", action="store_true",
                   help="skip the [cluster] figures (they need redis-server)")
    p.add_argument("--only", metavar="PHASES",
                   help=f"comma-separated phases to run, of: {', '.join(PHASES)}")
    args = p.parse_args(argv)
    mode = "smoke" if args.smoke else "quick" if args.quick else "full"
    sizes = SIZES[mode]
    phases = set(PHASES)
    if args.only:
        phases = {x.strip() for x in args.only.split(",") if x.strip()}
        unknown = phases - set(PHASES)
        if unknown:
            p.error(f"--only: unknown phase(s) {', '.join(sorted(unknown))}")
    if args.no_litellm:
        phases.discard("litellm")
    if args.no_cluster:
        phases.discard("cluster")
    started = time.monotonic()
    info = machine()
    log(f"turnd bench ({mode}) on {info['cores']} cores, {info['cpu']}, Python {info['python']}, "
        f"load average {info['loadavg_at_start']}")
    result = anyio.run(_run, mode, sizes, frozenset(phases))
    details, notes = result["details"], result["notes"]
    print(table(sizes, details, notes))
    for key, why in notes.items():
        print(f"note: {key}: {why}")
    elapsed = time.monotonic() - started
    print(f"({mode} run, {elapsed:.0f} s)")
    if args.json:
        out: dict[str, Any] = {k: None for k in MAIN_KEYS}
        for key, d in details.items():
            out[key] = round(d["median"], 4)
        out["litellm_error"] = notes.get("litellm") if "litellm_ttft_overhead_ms_p50" not in details else None
        met = verdicts(sizes, details)
        out["targets"] = {k: {"target": targets(sizes)[k].text, "met": v} for k, v in met.items()}
        # Issue 18's "done when": every target of §10's "now" column met in this run.
        out["all_targets_met"] = bool(met) and all(v is True for v in met.values())
        out["mode"] = mode
        out["seconds"] = round(elapsed, 1)
        out["machine"] = info
        out["sizes"] = sizes.__dict__
        out["details"] = details
        print(json.dumps(out, separators=(",", ":")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
