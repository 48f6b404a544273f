"""The models a provider offers, for the page's picker (``GET /api/models``, SPEC §17).

A provider with a ``models`` list offers those. One without asks its ``GET /models``
(the OpenAI-compatible listing) with a short timeout, and the answer is kept for a
while, so opening the page does not wait on a provider each time; a provider that
does not answer offers the default model when it is the default's, else nothing.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import anyio
import httpx

from daemon.config import Config
from turns.settings import Provider
from turns.tls import model_tls_context

LIST_TIMEOUT = 3.0  # seconds a provider's /models may take
KEEP_SECONDS = 300.0  # an answer is reused this long
KEEP_FAILED_SECONDS = 30.0  # a provider that did not answer is asked again after this
MAX_LISTED = 500  # ids kept from one provider's answer (some list thousands)


class ProviderModels:
    """``/models`` answers per provider, cached."""

    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._cache: dict[str, tuple[float, list[str]]] = {}

    async def list(self, config: Config) -> list[dict[str, str]]:
        """One entry per (provider, model), in config order."""
        default_provider, _, default_id = config.default_model.partition(":")
        asked: dict[str, list[str]] = {}
        async with anyio.create_task_group() as tg:
            for provider in config.providers.values():
                if not provider.models:
                    tg.start_soon(self._ask, provider, asked)
        out: list[dict[str, str]] = []
        for name, provider in config.providers.items():
            ids = list(provider.models) or asked.get(name, [])
            if name == default_provider and default_id not in ids and not provider.models:
                ids = [default_id, *ids]
            label = provider.label or name
            for model_id in ids:
                out.append({"provider": name, "id": model_id, "label": f"{label} · {model_id}"})
        return out

    async def _ask(self, provider: Provider, into: dict[str, list[str]]) -> None:
        now = self._clock()
        cached = self._cache.get(provider.name)
        if cached is not None and cached[0] > now:
            into[provider.name] = cached[1]
            return
        ids = await fetch_ids(provider)
        keep = KEEP_SECONDS if ids is not None else KEEP_FAILED_SECONDS
        self._cache[provider.name] = (now + keep, ids or [])
        into[provider.name] = ids or []


async def fetch_ids(provider: Provider) -> list[str] | None:
    """The ids ``GET {base_url}/models`` answers, or None when it does not (no key shown)."""
    headers = {"Authorization": f"Bearer {provider.api_key}"} if provider.api_key else {}
    try:
        async with httpx.AsyncClient(timeout=LIST_TIMEOUT, verify=model_tls_context()) as http:
            response = await http.get(f"{provider.base_url}/models", headers=headers)
        if response.status_code != 200:
            return None
        data = response.json().get("data")
        ids = [str(m["id"]) for m in data if isinstance(m, dict) and m.get("id")]
    except (httpx.HTTPError, ValueError, TypeError, AttributeError, KeyError):
        return None
    return sorted(set(ids))[:MAX_LISTED]
