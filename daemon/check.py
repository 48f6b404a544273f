"""``turnd check``: validate the config, then reach the store and each provider."""

from __future__ import annotations

import argparse
from typing import Any

import anyio
import httpx

from daemon.config import Config, load_config
from daemon.config_file import ConfigError
from daemon.echo import ECHO
from daemon.exits import EXIT_CONFIG, EXIT_FAIL, EXIT_OK, fail, short
from turns.settings import Provider
from turns.tls import model_tls_context


def cmd_check(args: argparse.Namespace) -> int:
    try:
        config = load_config(args.config)
        # Imported once the config loads: a config error is answered without the engine's imports.
        from daemon.engine_parts import load_plugins

        load_plugins(config.plugins)
    except ConfigError as err:
        return fail(f"config error: {err}", EXIT_CONFIG)
    where = str(config.path) if config.path else "embedded defaults (no turnd.toml)"
    print(f"ok    config    {where}")
    for warning in config.warnings:
        print(f"warn  config    {warning}")
    results = anyio.run(_checks, config)
    for ok, what, detail in results:
        label = ok if isinstance(ok, str) else "ok" if ok else "FAIL"
        print(f"{label:<5} {what:<9} {detail}")
    # A degraded tool source is reported, not failed: turnd serve runs without it (SPEC §14).
    return EXIT_OK if all(ok for ok, _, _ in results) else EXIT_FAIL


async def _checks(config: Config) -> list[tuple[bool | str, str, str]]:
    from daemon.cluster_check import check_cluster

    results: list[tuple[bool | str, str, str]] = [await _check_store(config)]
    for provider in config.providers.values():
        results.append(await check_provider(config, provider))
    from daemon.tools_check import check_tools

    results += await check_tools(config)
    cluster = await check_cluster(config)  # [cluster]: Redis answers and runs scripts
    if cluster is not None:
        results.append(cluster)
    return results


async def _check_store(config: Config) -> tuple[bool, str, str]:
    try:
        if config.store_kind == "local":
            from recordstore.local import LocalStore

            async with LocalStore.open(config.store_path):
                pass
            return True, "store", f"local {config.store_path}"
        from atproto import AsyncClient

        for account in config.accounts:
            client = AsyncClient(base_url=config.store_service)
            await client.login(account.handle, account.password, fetch_bsky_profile=False)
        return True, "store", f"pds {config.store_service} ({len(config.accounts)} accounts)"
    except Exception as err:  # noqa: BLE001 - reported, not raised
        return False, "store", f"{config.store_kind}: {short(err, config.secrets())}"


LISTED_AT_MOST = 20  # model ids printed for a provider without a `models` list


async def check_provider(
    config: Config, provider: Provider, *, within: float = 10
) -> tuple[bool, str, str]:
    """(ok, "provider", one line naming the provider): its /models, never its key."""
    import openai

    from turns.models import NO_PLATFORM_HEADERS

    name = f"{provider.name} [{provider.label}]" if provider.label else provider.name
    where = provider.base_url
    if provider.name != ECHO:
        http_client: Any = openai.DefaultAsyncHttpxClient(verify=model_tls_context())
    else:
        # The echo is served by `turnd serve`; check the same code in-process so this
        # works whether or not the daemon is running.
        from fastapi import FastAPI

        from daemon.echo import router

        app = FastAPI()
        app.include_router(router())
        http_client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app))
        where = f"{provider.base_url} (checked in-process)"
    client = openai.AsyncOpenAI(
        base_url=provider.base_url if provider.name != ECHO else "http://echo/echo/v1",
        api_key=provider.api_key or "none",
        max_retries=0,
        timeout=within,
        http_client=http_client,
        default_headers=NO_PLATFORM_HEADERS,  # as `serve` asks (turns.models)
    )
    try:
        ids = [m.id async for m in client.models.list()]
    except Exception as err:  # noqa: BLE001 - reported, not raised; the key is never shown
        return False, "provider", f"{name} {where}: {short(err, config.secrets())}"
    finally:
        await client.close()
    missing = [m for m in provider.models if m not in ids]
    note = f"; not listed: {', '.join(missing)}" if missing else ""
    count = f"{len(ids)} model" + ("" if len(ids) == 1 else "s")
    if not provider.models and ids:
        # No `models` list: the page offers what /models answers, so show it here too.
        shown = ", ".join(ids[:LISTED_AT_MOST])
        more = f", … {len(ids) - LISTED_AT_MOST} more" if len(ids) > LISTED_AT_MOST else ""
        count += f" ({shown}{more})"
    return True, "provider", f"{name} {where}: {count}{note}"
