"""Model and effort resolution, and one OpenAI-compatible client per provider."""

from __future__ import annotations

import weakref
from collections.abc import Mapping
from typing import Any

import httpx2  # the HTTP client openai 3.x is built on
import openai
from openai._models import FinalRequestOptions  # the options `client.request` takes

from turns.efforts import EFFORTS, Effort  # noqa: F401 - re-exported, the names' old home
from turns.model_pool import ShardedTransport
from turns.one_send import model_transport, uses_env_proxy
from turns.provider_errors import NO_KEY
from turns.retries import ReportingOpenAI
from turns.settings import Provider
from turns.tls import model_tls_context

# OpenAI-compatible `reasoning_effort` names the others as they are; `high` is its highest.
_WIRE_EFFORT = {"max": "high"}


class ModelResolutionError(Exception):
    pass


def parse_model(ref: str) -> dict[str, str]:
    """``provider:id`` -> a modelRef. The id may itself contain colons."""
    provider, sep, model_id = ref.partition(":")
    if not sep or not provider or not model_id:
        raise ValueError(f"model {ref!r} must be written provider:id")
    return {"provider": provider, "id": model_id}


def choose_model(
    generation: Mapping[str, Any],
    branch: list[dict[str, Any]],
    preferences: Mapping[str, Any] | None,
    default: str,
) -> dict[str, str]:
    """Request, else the nearest completed reply up the branch, else preferences, else admin."""
    if _is_model_ref(generation.get("model")):
        return _ref(generation["model"])
    for value in reversed(branch):
        if value.get("role") == "assistant" and value.get("status") == "complete":
            if _is_model_ref(value.get("model")):
                return _ref(value["model"])
    if preferences and _is_model_ref(preferences.get("defaultModel")):
        return _ref(preferences["defaultModel"])
    return parse_model(default)


def choose_effort(generation: Mapping[str, Any], preferences: Mapping[str, Any] | None) -> str | None:
    effort = generation.get("effort")
    if isinstance(effort, str):
        return effort
    effort = (preferences or {}).get("defaultEffort")
    return effort if isinstance(effort, str) else None


def reasoning_effort(effort: str | None) -> str | None:
    return _WIRE_EFFORT.get(effort, effort) if effort in EFFORTS else None


def _is_model_ref(value: Any) -> bool:
    return isinstance(value, Mapping) and isinstance(value.get("provider"), str) and isinstance(
        value.get("id"), str
    )


def _ref(value: Mapping[str, Any]) -> dict[str, str]:
    return {"provider": value["provider"], "id": value["id"]}


# The SDK's platform headers describe the machine turnd runs on (OS, architecture, the
# Python and SDK versions, the async library, the retry count, the read timeout) to a
# third party. No provider needs them, the User-Agent still names the SDK, and the SDK and
# httpx2 built and merged them header by header on every request: 17 headers a chat call
# become 10, the SDK's request building 71 -> 55 µs (docs/performance-history.md).
_CLIENT_PLATFORM_HEADERS = (
    "X-Stainless-Lang",
    "X-Stainless-Package-Version",
    "X-Stainless-OS",
    "X-Stainless-Arch",
    "X-Stainless-Runtime",
    "X-Stainless-Runtime-Version",
    "X-Stainless-Async",
)
_PER_REQUEST_PLATFORM_HEADERS = ("X-Stainless-Retry-Count", "X-Stainless-Read-Timeout")
# The SDK drops a header whose value is its ``Omit``: these are the client's defaults.
NO_PLATFORM_HEADERS: dict[str, Any] = {name: openai.Omit() for name in _CLIENT_PLATFORM_HEADERS}

# What create() sends for a chat call: the bearer key only (never an admin key). Built
# once as the SDK's own request options: `client.post` constructs them on every call, a
# pydantic construct that resolves each field's default (~18 µs); a copy with the body is
# ~1.5 µs (README, issue 18).
_CHAT_CALL = FinalRequestOptions.construct(
    method="post",
    url="/chat/completions",
    security={"bearer_auth": True},
    # Per request, the SDK adds these two unless the call's own headers name them.
    headers={name: openai.Omit() for name in _PER_REQUEST_PLATFORM_HEADERS},
)
# The same options per client, with the chat URL joined to its base URL once: given a
# relative URL the SDK parses it and the base URL and joins them on every call (~30 µs);
# an absolute one it takes as it is. Kept while the client's base URL is the same object.
_chat_calls: weakref.WeakKeyDictionary[openai.AsyncOpenAI, tuple[httpx2.URL, FinalRequestOptions]] = (
    weakref.WeakKeyDictionary()
)


def _chat_call(client: openai.AsyncOpenAI) -> FinalRequestOptions:
    base = client.base_url
    known = _chat_calls.get(client)
    if known is None or known[0] is not base:
        url = str(client._prepare_url(_CHAT_CALL.url))  # the SDK's own join
        known = base, _CHAT_CALL.model_copy(update={"url": url})
        _chat_calls[client] = known
    return known[1]


async def post_chat(
    client: openai.AsyncOpenAI, body: dict[str, Any], cast_to: type[Any], *, stream: bool = False
) -> Any:
    """POST a chat body as ``client.post("/chat/completions", ...)`` would: the client's
    base URL, auth, retries and error types. The turn's steps (turns.generate) take the
    raw streamed response, the titles (turns.titles) the answer as JSON."""
    options = _chat_call(client).model_copy(update={"json_data": body})
    return await client.request(cast_to, options, stream=stream, stream_cls=None)


class Clients:
    """One ``AsyncOpenAI`` per provider, built on first use and kept for the process."""

    def __init__(self, providers: Mapping[str, Provider]) -> None:
        self._providers = providers
        self._clients: dict[tuple[str, int], openai.AsyncOpenAI] = {}

    def provider(self, ref: Mapping[str, str]) -> Provider:
        provider = self._providers.get(ref["provider"])
        if provider is None:
            raise ModelResolutionError(f"unknown provider {ref['provider']!r}")
        if provider.models and ref["id"] not in provider.models:
            raise ModelResolutionError(
                f"model {ref['id']!r} is not offered by provider {provider.name!r}"
            )
        return provider

    def client(self, provider: Provider, retries: int) -> openai.AsyncOpenAI:
        key = (provider.name, retries)
        client = self._clients.get(key)
        if client is None:
            # The SDK's client, with its retries reported to the turn (turns.retries).
            client = self._clients[key] = ReportingOpenAI(
                base_url=provider.base_url,
                # Local servers (Ollama, llama.cpp, the echo provider) take any key.
                api_key=provider.api_key or NO_KEY,
                max_retries=retries,
                # No overall read timeout: the turn's own timeout bounds it; a stall
                # between chunks is bounded by the read timeout instead.
                timeout=openai.Timeout(connect=10.0, read=120.0, write=30.0, pool=30.0),
                http_client=providers_http_client(),
                default_headers=NO_PLATFORM_HEADERS,
            )
        return client

    def warm(self, retries: int) -> None:
        """Build every provider's client now, so the first turn does not pay for it."""
        for provider in self._providers.values():
            # Touching the resource imports the SDK's lazily loaded modules.
            _ = self.client(provider, retries).chat.completions.with_streaming_response

    async def aclose(self) -> None:
        for client in self._clients.values():
            await client.close()
        self._clients.clear()


MAX_CONNECTIONS, MAX_KEEPALIVE, POOLS = 1000, 200, 8
# Requests a pool takes at once before the next pool is used (beyond POOLS * FILL, the
# least busy takes them). httpcore walks all of a pool's connections at each request and
# each close: 20 calls at a time cost 644 -> 605 µs of the client's CPU a streamed call
# with FILL 4 instead of the pool's keep-alive size, 25 (docs/performance-history.md).
FILL = 4


def providers_http_client(fill: int = FILL) -> httpx2.AsyncClient:
    """The HTTP client of the providers' SDK clients (``fill``: calls a pool takes at once)."""
    if uses_env_proxy():  # httpx's proxy transports, as the SDK would make them
        limits = httpx2.Limits(max_connections=MAX_CONNECTIONS, max_keepalive_connections=MAX_KEEPALIVE)
        return openai.DefaultAsyncHttpxClient(verify=model_tls_context(), limits=limits)
    # Each request's head and body in one send (turns.one_send), in several small pools
    # (turns.model_pool); the limits are the whole client's, shared out among them.
    limits = httpx2.Limits(max_connections=MAX_CONNECTIONS // POOLS,
                           max_keepalive_connections=MAX_KEEPALIVE // POOLS)
    verify = model_tls_context()
    pools = [model_transport(verify, limits) for _ in range(POOLS)]
    return openai.DefaultAsyncHttpxClient(transport=ShardedTransport(pools, fill=fill))
