"""The ``turnd`` command: argument parsing and ``serve`` (SPEC §7).

``init`` (:mod:`daemon.starter`), ``send`` (:mod:`daemon.send`) and ``check``
(:mod:`daemon.check`) are modules of their own.

Exit codes: 0 success (a bare ``turnd`` prints the help and exits 0); 1 a runtime
failure (a port taken, a check that failed, a reply that ended in ``error``, a daemon
that cannot be reached); 2 a bad config or bad command line, reported in one line
before anything starts.
"""

from __future__ import annotations

import argparse
import gc
import logging
import os
import shlex
import sys
import textwrap
from collections.abc import Sequence
from dataclasses import replace
from typing import NoReturn

import anyio

import daemon.lean  # noqa: F401 - first, before anything imports httpx
from daemon.accounts import CREDENTIALS_FILE, Account, ensure_credentials
from daemon.config import Config, load_config
from daemon.config_file import ConfigError
from daemon.echo import ECHO
from daemon.exits import EXIT_CONFIG, EXIT_OK, fail, leaf
from turns.efforts import EFFORTS


# Each subcommand's module is imported when it runs: ``turnd send`` must not pay for
# openai, the store and the HTTP app (SPEC §10: ≤ 0.5 s wall).
def cmd_check(args: argparse.Namespace) -> int:
    from daemon.check import cmd_check as run

    return run(args)


def cmd_send(args: argparse.Namespace) -> int:
    from daemon.send import cmd_send as run

    return run(args)


def cmd_init(args: argparse.Namespace) -> int:
    from daemon.starter import cmd_init as run

    return run(args)


def cmd_serve(args: argparse.Namespace) -> int:
    try:
        config = load_config(args.config)
        # Imported once the config loads: a config error is answered without paying for
        # the service's imports (the openai client's types alone take seconds of CPU).
        from daemon.service import Service, ServiceError
        created: Account | None = None
        if config.store_kind == "local" and not config.accounts:
            # First start without an account: make one, kept 0600 in the data dir.
            account, was_created = ensure_credentials(config.store_path)
            config = replace(config, accounts=[account], generated_account=True)
            created = account if was_created else None
        service = Service(config)
    except ConfigError as err:
        return fail(f"config error: {err}", EXIT_CONFIG)

    from daemon.logs import setup_logging

    setup_logging(args.log_format, secrets=config.secrets())
    for warning in config.warnings:
        print(f"turnd: warning: {warning}", file=sys.stderr, flush=True)
    if created is not None:
        print(
            f"turnd: created account {created.handle} ({created.did}) "
            f"password {created.password} token {created.token} "
            f"(shown once; kept in {config.store_path / CREDENTIALS_FILE}, mode 0600)",
            flush=True,
        )

    async def run() -> None:
        async with anyio.create_task_group() as tg:

            def ready(svc: Service) -> None:
                _collect_again()
                print(f"turnd: {_how_to_reach(svc.config, svc.port, created)}", flush=True)
                for line in _next_steps(svc.config, svc.port, created):
                    print(f"turnd: {line}", flush=True)
                tg.start_soon(warn_if_unreachable, svc.config)

            await service.run(on_ready=ready)
            tg.cancel_scope.cancel()  # a probe still waiting for its provider

    try:
        anyio.run(run)
    except BaseException as exc:  # noqa: BLE001 - unwrap anyio's groups for one line
        error = leaf(exc)
        if isinstance(error, ServiceError | ConfigError):
            return fail(str(error))
        if _interrupted(exc):
            return 130
        raise
    finally:
        if service.stopped_at_once:
            # "exiting now": a store query still on its worker thread would otherwise end
            # after the loop closed and print that thread's traceback during teardown.
            _exit_now(130)
    return EXIT_OK


def _interrupted(exc: BaseException) -> bool:
    """A Ctrl-C anywhere in anyio's groups: exit 130 without a traceback."""
    if isinstance(exc, KeyboardInterrupt):
        return True
    if isinstance(exc, BaseExceptionGroup):
        return any(_interrupted(e) for e in exc.exceptions)
    return False


PROBE_SECONDS = 5.0  # how long serve's start-up check of the default provider waits


async def warn_if_unreachable(config: Config) -> None:
    """Warn (once, at start) when the default model's provider does not answer."""
    from daemon.check import check_provider

    name = config.default_model.split(":", 1)[0]
    provider = config.providers[name]
    if name == ECHO:
        return  # served by this very process
    ok, _, detail = await check_provider(config, provider, within=PROBE_SECONDS)
    if not ok:
        print(
            f"turnd: warning: the default model's provider cannot be reached: {detail} "
            "(turns on it fail until it answers)",
            file=sys.stderr,
            flush=True,
        )


def _next_steps(config: Config, port: int | None, created: Account | None) -> list[str]:
    """The page's URL and, on the embedded defaults, the line that sets $TURND_ME_TOKEN."""
    lines = []
    if config.web:
        lines.append(f"the chat page: {config.http_url(port)}/ (sign in with the token)")
    if config.generated_account and config.accounts:
        account = config.accounts[0]
        var = f"TURND_{account.name.upper()}_TOKEN"
        if created is not None:
            value = account.token
        else:
            # Later starts do not print the secret again; the line reads it from the file.
            path = shlex.quote(str(config.store_path / CREDENTIALS_FILE))
            value = f"""$(sed -n 's/.*"token": "\\(.*\\)".*/\\1/p' {path})"""
        lines.append(f"for the README's curl examples: export {var}={value}")
    return lines


def _how_to_reach(config: Config, port: int | None, created: Account | None) -> str:
    url = config.http_url(port)
    account = config.accounts[0] if config.accounts else None
    if account is None:
        token = "no account configured"
    elif created is not None:
        token = f"token {created.token}"
    elif config.generated_account:
        token = f"token in {config.store_path / CREDENTIALS_FILE}"
    elif account.token_env:
        token = f"token in ${account.token_env}"  # the variable's name, never its value
    else:
        token = f"no token for {account.name}: set accounts.{account.name}.token_env"
    model = config.default_model
    provider = config.providers[model.split(":", 1)[0]]
    label = f" [{provider.label}]" if provider.label else ""
    return f'serving {url} ({token}; model {model}{label}); try: turnd send "hello"'


# -- argparse ----------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="turnd",
        description="A self-hostable daemon answering LLM chat turns stored as AT Protocol records.",
        epilog=textwrap.dedent(
            """\
            config: --config PATH, else $TURND_CONFIG, else ./turnd.toml; with none of
            them, `serve` runs on embedded defaults (local store in ./turnd-data, the
            built-in echo provider unless OPENAI_API_KEY or OPENROUTER_API_KEY is set).
            Any value can be overridden by TURND_<TABLE>_<KEY>, e.g. TURND_HTTP_LISTEN."""
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"turnd {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    def command(name: str, help_text: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.add_argument("--config", metavar="PATH", help="the config file (default: see turnd -h)")
        return p

    p = command("init", "write a commented starter config and create the local account")
    p.add_argument("--handle", default="me.test", help="the account's handle (default me.test)")
    p.add_argument("--name", default="me", help="the account's table name (default me)")
    p.add_argument("--listen", default="127.0.0.1:8787", help="host:port for [http] listen")
    p.add_argument("--force", action="store_true", help="overwrite an existing config")
    p.set_defaults(func=cmd_init)

    p = command("serve", "run everything: store, change feed, turns, HTTP")
    p.add_argument(
        "--log-format", choices=("text", "json"), default="text", help="log lines (stderr)"
    )
    p.set_defaults(func=cmd_serve)

    p = command(
        "send",
        "write a user message with the stock atproto client and print the reply as it streams "
        "(exit 1 when the reply ends in error or cancelled)",
    )
    p.add_argument("text", help="the message")
    p.add_argument("--conversation", metavar="SKEY", help="continue this conversation")
    p.add_argument("--model", metavar="PROVIDER:ID", help="the model for this turn")
    p.add_argument("--effort", choices=EFFORTS, help="reasoning effort")
    p.add_argument("--account", metavar="NAME", help="the account (default: the first)")
    p.add_argument(
        "--timeout", type=float, default=660, metavar="SECONDS", help="give up after (660)"
    )
    p.set_defaults(func=cmd_send)

    p = command("check", "validate the config and reach the store and each provider")
    p.set_defaults(func=cmd_check)

    from daemon import usage_cli

    usage_cli.add_parser(sub, "the config file (default: see turnd -h)")
    return parser


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("turnd")
    except PackageNotFoundError:  # run from a checkout that was never installed
        return "unknown"


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()  # a bare `turnd`: what it can do, exit 0
        return EXIT_OK
    as_command = argv is None  # run as the console script, not called from code
    if as_command:
        # The commands' imports build thousands of classes (openai's and atproto's
        # pydantic models), and each batch of them woke the cycle collector to walk
        # everything built so far: ~15 % of `turnd serve`'s start-up CPU. Nothing they
        # build is garbage; `serve` turns the collector back on once it is serving.
        gc.disable()
    code = int(args.func(args))
    if as_command:
        _exit_now(code)
    return code


# The cycle collector's youngest generation is collected once this many more container
# objects were made than freed (CPython's default: 700). A turn makes a few thousand that
# live only while it runs (parsed JSON, pydantic models, httpx2's headers): at 700 a
# collection fell inside nearly every request, walked what was alive and freed nothing
# (487 collections in 2000 short turns freed 306 objects; with the older generations
# ~0.11 ms of CPU a turn, `gc.callbacks`). At 20000: 2 collections in the same turns,
# CPU per turn -4 % (`python -m bench.ab`), RSS after 1000 turns within its noise
# (docs/performance-history.md).
YOUNG_GENERATION_THRESHOLD = 20_000


def _collect_again() -> None:
    """Once ``serve`` is up: what start-up built is kept out of every later collection
    (it lives as long as the process), and the collector runs again, on a server's
    schedule for its youngest generation."""
    if not gc.isenabled():
        gc.freeze()
        gc.set_threshold(YOUNG_GENERATION_THRESHOLD, *gc.get_threshold()[1:])
        gc.enable()


def _exit_now(code: int) -> NoReturn:
    """End a command without the interpreter's teardown.

    Freeing the module graph the atproto SDK and openai build (~700-800 pydantic model
    classes each) took longer than ``turnd send`` itself (0.8-1.2 s of a 2-3 s wall on a
    loaded 2-core machine) and ~0.35 s of CPU at the end of every ``turnd serve``.
    Everything a command owns is closed when it returns (``serve``: the store, the state,
    the render workers, the telemetry); the logs and streams are flushed here.
    """
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass  # a closed pipe: nothing more can be said there
    os._exit(code)


if __name__ == "__main__":
    sys.exit(main())
