"""`cosmictui check`: the wizard's prerequisite checks, headless."""

from __future__ import annotations

import argparse
import asyncio
from typing import Any, TextIO

from cosmictui.cli.context import open_runner, runner_exit, settings_from
from cosmictui.cli.output import EXIT_CODES, FAILED, KEY_FIX, OK, USAGE, UsageError, dump
from cosmictui.cli.parser import FORMAT, port_number

ORDER = 20


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    """Add check to the parser."""
    c = sub.add_parser(
        "check",
        parents=[common],
        help="run the wizard's prerequisite checks",
        description="Run the prerequisite checks (the wizard's first step). Warnings do not fail.",
        epilog=EXIT_CODES,
        formatter_class=FORMAT,
    )
    c.add_argument("--json", action="store_true", help="print a JSON array of results")
    c.add_argument("--storage", metavar="DIR", help="relay storage directory to check")
    c.add_argument("--port", type=port_number, help="relay UDP port to check (1-65535)")
    c.add_argument(
        "--relay-key",
        metavar="KEY",
        help="also probe this relay (default: the relay running on the storage, when there is one)",
    )
    c.add_argument("--no-probe", action="store_true", help="skip the relayed-connection probe")
    c.set_defaults(handler=cmd_check)


STATUS_WORD = {"ok": "[ OK ]", "warn": "[WARN]", "fail": "[FAIL]"}


def cmd_check(args: argparse.Namespace, out: TextIO) -> int:
    overrides: dict[str, Any] = {}
    if args.storage:
        overrides["relay_storage"] = args.storage
    if args.port is not None:
        overrides["relay_port"] = args.port
    settings = settings_from(args, **overrides)
    from cosmictui.ops.runner import RunnerError
    from cosmictui.ops.setup.checks import run_checks
    from cosmictui.ops.setup.steps import gather_checks

    async def go() -> list[Any]:
        if getattr(args, "deployment", None) is None and settings.deployment == ".":
            return await run_checks(settings, None)  # no deployment: the local checks only
        opened: list[Any] = []

        async def connect() -> Any:
            try:
                runner = await open_runner(settings)
            except RunnerError as e:
                if runner_exit(e) == USAGE:  # a deployment that does not exist: bad input, not a failed check
                    raise UsageError(e.what, e.fix) from None
                raise
            opened.append(runner)
            return runner

        # the wizard's own step 1: local checks always, the unreachable host as one more failed
        # check ("Deployment host reachable"), relay-from-host a warning until the relay runs
        try:
            return await gather_checks(settings, connect)
        finally:
            for runner in opened:
                await runner.close()

    from cosmictui.ops.metrics.probe import PROBE_TIMEOUT, ProbeUsageError, parse_relay_key
    from cosmictui.ops.setup.relayup import prove_relay

    if args.relay_key:
        try:
            parse_relay_key(args.relay_key)  # a typo is a usage error before any check runs
        except ProbeUsageError as e:
            raise UsageError(f"--relay-key: {e}", f"--relay-key KEY with {KEY_FIX}") from None

    async def probe() -> list[Any]:
        """With a relay key known: two peers must meet through it (`relay probe`)."""
        from cosmictui.ops.relayproc import attach

        rt = attach(settings.relay_storage)
        key = args.relay_key or (rt.key if rt is not None else None)
        if not key or args.no_probe:
            return []
        try:  # step 2's proof (ops.setup.relayup), from this machine, with its timeout
            local, _ = await prove_relay(settings, key, None, PROBE_TIMEOUT)
            return [local]
        except ProbeUsageError as e:
            raise UsageError(f"--relay-key: {e}", f"--relay-key KEY with {KEY_FIX}") from None

    results = asyncio.run(go())
    results += asyncio.run(probe())
    if args.json:
        dump([{"name": r.name, "status": r.status, "detail": r.detail, "fix": r.fix} for r in results], out)
    else:
        width = max((len(r.name) for r in results), default=0)
        for r in results:
            out.write(f"{STATUS_WORD.get(r.status, r.status)} {r.name:<{width}}  {r.detail}\n")
            if r.fix and r.status != "ok":
                out.write(f"       {'':<{width}}  fix: {r.fix}\n")
        fails = sum(r.status == "fail" for r in results)
        warns = sum(r.status == "warn" for r in results)
        out.write(f"{len(results)} checks: {fails} failed, {warns} warnings\n")
    return FAILED if any(r.status == "fail" for r in results) else OK
