"""A LiteLLM proxy (1 worker) in front of the fake model, for the side-by-side figure.

LiteLLM is never a dependency of turnd: it is installed on first use into the bench's
own virtual environment, cached under ``~/.cache/turnd-bench/litellm-venv`` (override
with ``$TURND_BENCH_CACHE``). When the install is impossible the figure is reported as
null with the reason.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from bench.procs import wait_ready
from testbed.processes import stop

LITELLM_SPEC = os.environ.get("TURND_BENCH_LITELLM", "litellm[proxy]==1.106.12")
INSTALL_TIMEOUT = 900.0


def cache_dir() -> Path:
    root = os.environ.get("TURND_BENCH_CACHE") or os.path.expanduser("~/.cache/turnd-bench")
    return Path(root)


def venv_dir() -> Path:
    return cache_dir() / "litellm-venv"


def _marker() -> Path:
    return venv_dir() / ".installed"


def litellm_bin() -> Path:
    return venv_dir() / "bin" / "litellm"


def ensure_installed(log: object = None) -> tuple[Path | None, str | None]:
    """(path of the ``litellm`` CLI, None) or (None, why it cannot be had)."""
    venv = venv_dir()
    if _marker().exists() and _marker().read_text().strip() == LITELLM_SPEC and litellm_bin().exists():
        return litellm_bin(), None
    _say(log, f"installing {LITELLM_SPEC} into {venv} (first use; cached afterwards)")
    started = time.monotonic()
    try:
        venv.parent.mkdir(parents=True, exist_ok=True)
        if not (venv / "bin" / "python").exists():
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True,
                           capture_output=True, timeout=120)
        out = subprocess.run(
            [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet",
             "--disable-pip-version-check", LITELLM_SPEC],
            capture_output=True, text=True, timeout=INSTALL_TIMEOUT,
        )
    except (OSError, subprocess.SubprocessError) as err:
        return None, f"cannot install {LITELLM_SPEC}: {err}"
    if out.returncode != 0:
        tail = (out.stderr or out.stdout).strip().splitlines()[-1:] or ["pip failed"]
        return None, f"cannot install {LITELLM_SPEC}: {tail[0][:300]}"
    if not litellm_bin().exists():
        return None, f"{LITELLM_SPEC} installed no litellm command"
    _marker().write_text(LITELLM_SPEC + "\n")
    _say(log, f"installed LiteLLM in {time.monotonic() - started:.0f}s")
    return litellm_bin(), None


def _say(log: object, message: str) -> None:
    if callable(log):
        log(message)
    else:
        print(message, file=sys.stderr, flush=True)


class LiteLLMProxy:
    """``litellm --config ... --num_workers 1`` on a free loopback port, in front of
    ``upstream`` (an OpenAI-compatible base URL), serving the model ``fake-model``."""

    def __init__(self, binary: Path, upstream: str, workdir: Path) -> None:
        self.binary = binary
        self.upstream = upstream
        self.workdir = workdir
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def __enter__(self) -> LiteLLMProxy:
        from bench.procs import free_port

        self.port = free_port()
        config = self.workdir / "litellm.yaml"
        config.write_text(
            "model_list:\n"
            "  - model_name: fake-model\n"
            "    litellm_params:\n"
            "      model: openai/fake-model\n"
            f"      api_base: {self.upstream}\n"
            "      api_key: sk-bench-fake\n"
            "general_settings:\n"
            "  master_key: sk-bench-fake\n"
            "litellm_settings:\n"
            "  telemetry: false\n"
            "  drop_params: true\n"
        )
        env = {
            **os.environ,
            # Loopback only: no cost map download, no telemetry.
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",
            "LITELLM_TELEMETRY": "False",
            "LITELLM_LOG": "ERROR",
            "DISABLE_ADMIN_UI": "True",
            "NO_DOCS": "True",
        }
        env.pop("DATABASE_URL", None)
        self._log = (self.workdir / "litellm.log").open("wb")
        self.proc = subprocess.Popen(
            [str(self.binary), "--config", str(config), "--host", "127.0.0.1",
             "--port", str(self.port), "--num_workers", "1"],
            stdout=self._log, stderr=subprocess.STDOUT, env=env, cwd=self.workdir,
        )
        url = f"http://127.0.0.1:{self.port}/health/liveliness"
        wait_ready(self.proc, url, "litellm", self.log_tail, 120.0, interval=0.2,
                   on_failure=self.__exit__)
        return self

    def log_tail(self, lines: int = 3) -> str:
        try:
            text = (self.workdir / "litellm.log").read_text(errors="replace")
        except OSError:
            return ""
        return " | ".join(text.splitlines()[-lines:])

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            stop(self.proc, 15, 5)
        if getattr(self, "_log", None) is not None:
            self._log.close()


async def ttft(proxy_url: str, fake_url: str, runs: int, samples: int, log: object) -> list[dict[str, float]]:
    """The bare client's time to first chunk through the proxy, against the same client
    straight at the fake server, interleaved one for one."""
    import statistics

    from bench import client as c
    from bench.measure import ms, pct

    out = []
    async with c.bare_client(proxy_url) as via, c.bare_client(fake_url) as direct:
        for _ in range(5):
            await c.bare_stream(via)
            await c.bare_stream(direct)
        for run in range(runs):
            proxied, model = [], []
            for _ in range(samples):
                model.append((await c.bare_stream(direct)).ttft)
                proxied.append((await c.bare_stream(via)).ttft)
            base = statistics.median(model)
            fig = {
                "litellm_ttft_overhead_ms_p50": ms(statistics.median(proxied) - base),
                "litellm_ttft_overhead_ms_p99": ms(pct(proxied, 99) - base),
            }
            _say(log, f"  litellm run {run + 1}/{runs}: overhead p50 "
                      f"{fig['litellm_ttft_overhead_ms_p50']:.2f} ms, p99 {fig['litellm_ttft_overhead_ms_p99']:.2f} ms")
            out.append(fig)
    return out
