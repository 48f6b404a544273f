"""``turnd usage``: an account's sums for today and this month (UTC), as a small table.

It reads the state file directly (SQLite in WAL mode: safe beside a running daemon),
so it works whether or not the daemon is running, and shows the account's quota.
"""

from __future__ import annotations

import argparse
import sqlite3
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

import anyio

from daemon.accounts import Account
from daemon.config import Config, load_config
from daemon.config_file import ConfigError

if TYPE_CHECKING:
    from turns.state import UsageSum

EXIT_OK, EXIT_FAIL, EXIT_CONFIG = 0, 1, 2
COLUMNS = ("period", "turns", "steps", "input", "output", "reasoning", "cached", "cost USD")


def add_parser(sub: argparse._SubParsersAction, config_help: str) -> None:
    p = sub.add_parser(
        "usage",
        help="print an account's tokens and cost for today and this month (UTC)",
        description="print an account's tokens and cost for today and this month (UTC)",
    )
    p.add_argument("--config", metavar="PATH", help=config_help)
    p.add_argument("--account", metavar="NAME", help="the account (default: the first)")
    p.set_defaults(func=cmd_usage)


def cmd_usage(args: argparse.Namespace) -> int:
    import sys

    try:
        config = load_config(args.config)
    except ConfigError as err:
        print(f"turnd: config error: {err}", file=sys.stderr)
        return EXIT_CONFIG
    account = _account(config, args.account)
    if isinstance(account, str):
        print(f"turnd: {account}", file=sys.stderr)
        return EXIT_CONFIG
    try:
        print(anyio.run(_report, config, account, datetime.now(UTC)))
    except (OSError, sqlite3.Error, ValueError) as err:
        print(f"turnd: cannot read the state file {config.state_path}: {err}", file=sys.stderr)
        return EXIT_FAIL
    return EXIT_OK


def _account(config: Config, name: str | None) -> Account | str:
    accounts = [a for a in config.accounts if a.did]
    if not accounts:
        return "no account is configured (run `turnd init`, or start `turnd serve` once)"
    if name is None:
        return accounts[0]
    for account in accounts:
        if account.name == name or account.handle == name:
            return account
    return f"no account {name!r} (known: {', '.join(a.name for a in accounts)})"


async def _report(config: Config, account: Account, now: datetime) -> str:
    # Imported here: `turnd --help` and `turnd send` must not load the state and model code.
    from turns.quota import LocalQuotaCounter, QuotaGate, day_window, month_window
    from turns.state import StateDB

    assert account.did is not None
    day, tomorrow = day_window(now)
    month, next_month = month_window(now)
    path = Path(config.state_path)
    sums: list[UsageSum | None] = [None, None]
    quota: dict | None = None
    # No state file yet: nothing was used, and nothing is created.
    if await anyio.Path(path).exists():
        state = await StateDB.open(path)
        try:
            for i, (start, end) in enumerate(((day, tomorrow), (month, next_month))):
                rows = await state.usage_sums(
                    account.did, start.timestamp(), end.timestamp(), "total"
                )
                sums[i] = rows[0] if rows else None
            gate = QuotaGate(lambda did: account.quota, LocalQuotaCounter(state), lambda: now)
            quota = await gate.status(account.did)
        finally:
            await state.aclose()
    labels = (f"today {day:%Y-%m-%d}", f"month {month:%Y-%m}")
    rows = [COLUMNS] + [_row(label, s) for label, s in zip(labels, sums, strict=True)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(COLUMNS))]
    lines = [f"usage of {account.name} ({account.handle}), UTC days"]
    for r in rows:
        cells = [r[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(r[1:], widths[1:], strict=True)]
        lines.append("  ".join(cells))
    for name, q in (quota or {}).items():
        unit = "tokens" if name == "tokensPerDay" else "USD"
        lines.append(f"quota {name}: {q['used']:g} of {q['limit']:g} {unit}, resets at {q['resetsAt']}")
    return "\n".join(lines)


def _row(label: str, s: UsageSum | None) -> tuple[str, ...]:
    if s is None:
        return (label, "0", "0", "0", "0", "0", "0", "0")
    return (
        label, str(s.turns), str(s.steps), str(s.input_tokens), str(s.output_tokens),
        str(s.reasoning_tokens), str(s.cached_tokens), f"{s.cost:.4f}",
    )
