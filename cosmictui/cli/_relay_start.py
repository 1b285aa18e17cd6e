"""`cosmictui relay start`: the wizard's step 2, headless: start the relay (or attach to the one
running on the storage, or restart it with the wizard's flags), check it from the deployment host
and prove it carries a connection, within one --timeout."""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any, TextIO

from cosmictui.cli.output import EXIT_CODES, FAILED, NOT_CONFIRMED, OK, dump, fail
from cosmictui.cli.parser import FORMAT, port_number, timeout_seconds

DESCRIPTION = """\
Start the relay detached on this machine with the storage and port of the config (or --storage,
--port); attach to it when it already runs with them, or restart it with these flags when it runs
with others (same storage, same key). Then check what jobs need: the relay joined the DHT, its UDP
port answers from the deployment host, and two peers (punching off) meet through it, from here and,
where cosmictui is installed there, from the deployment host. Records the relay for the deployment
(as the wizard's step 2), so `cosmictui apply` and `verify` know it.
Without --yes nothing starts when that would change the relay key or restart a running relay:
the plan is printed, exit 3. Exit 0: up and proven; 1: not (which check, and its fix)."""


def add_start(rsub: Any, common: argparse.ArgumentParser) -> None:
    st = rsub.add_parser(
        "start",
        parents=[common],
        help="start (or attach to) the relay, check it and prove it (the wizard's step 2)",
        description=DESCRIPTION,
        epilog=EXIT_CODES,
        formatter_class=FORMAT,
    )
    add_start_flags(st)
    st.add_argument("--yes", action="store_true", help="go ahead even when the key would change or a relay restarts")
    st.add_argument("--json", action="store_true", help="print the outcome as one JSON object")
    st.set_defaults(handler=cmd_relay_start)


def add_start_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--storage", metavar="DIR", help="relay storage directory (config)")
    p.add_argument("--port", type=port_number, help="relay UDP port (config)")
    p.add_argument(
        "--timeout", metavar="S", type=timeout_seconds, default=120.0, help="bound for start, checks and probes (120)"
    )


def cmd_relay_start(args: argparse.Namespace, out: TextIO) -> int:
    from cosmictui.cli.context import settings_from
    from cosmictui.ops.session import WizardContext

    settings = settings_from(args)
    ctx = WizardContext(settings)
    doc: dict[str, Any] = {}

    async def go() -> int:
        try:
            return await run_relay_start(ctx, args, out, doc, quiet=args.json)
        finally:
            await ctx.close()

    try:
        rc = asyncio.run(go())
    except KeyboardInterrupt:
        return fail(args, out, "relay start", "interrupted: the relay may still be starting on its own", FAILED)
    if args.json:
        dump(doc | {"exit_code": rc}, out)
    return rc


async def run_relay_start(ctx: Any, args: argparse.Namespace, out: TextIO, doc: dict[str, Any], quiet: bool) -> int:
    """Plan, refuse what needs --yes, then bring the relay up; fills `doc` (the --json object)."""
    from cosmictui.ops.setup.relayup import LocalCommand, RelayOutcome, RelayRunning

    def say(text: str) -> None:
        if not quiet:
            out.write(text + "\n")
            out.flush()

    storage = args.storage or ctx.relay_storage or ctx.settings.relay_storage
    port = args.port or ctx.settings.relay_port
    plan = await ctx.plan_relay(storage, port, "start")
    doc |= {
        "action": plan.action,
        "storage": storage,
        "port": port,
        "commands": list(plan.commands),
        "key_warning": plan.key_warning,
        "key": None,
        "pid": None,
        "checks": [],
        "blocking": None,
        "unproven": None,
        "error": plan.error,
        "fix": plan.fix or None,
    }
    if plan.error is not None:
        print(f"cosmictui relay start: {plan.error}" + (f"\n  fix: {plan.fix}" if plan.fix else ""), file=sys.stderr)
        return FAILED
    if plan.needs_yes and not args.yes:
        why = (
            plan.key_warning
            or f"a relay runs on {storage} (pid {plan.running.pid if plan.running else '?'}) "
            f"with other flags: {plan.other_flags}; it would be restarted (same key)"
        )
        doc |= {"error": f"not confirmed: {why}", "fix": "run again with --yes to do it"}
        say(f"plan     {plan.action} the relay with storage {storage}, UDP port {port}")
        for cmd in plan.commands:
            say(f"  $ {cmd}")
        say(f"warning  {why}")
        say("not confirmed: nothing started or stopped; run again with --yes to do it")
        return NOT_CONFIRMED
    rc = FAILED
    async for ev in ctx.bring_up_relay(plan, args.timeout):
        if isinstance(ev, LocalCommand) and not ev.ended:
            say(f"$ {ev.cmd}")
        elif isinstance(ev, RelayRunning):
            doc |= {"key": ev.runtime.key, "pid": ev.runtime.pid, "storage": ev.runtime.storage}
            say(f"relay    {ev.verb.lower()} pid {ev.runtime.pid}, UDP {ev.runtime.host}:{ev.runtime.port}")
            say(f"key      {ev.runtime.key}")
        elif isinstance(ev, RelayOutcome):
            doc |= {
                "checks": [{"name": r.name, "status": r.status, "detail": r.detail, "fix": r.fix} for r in ev.checks],
                "blocking": ev.blocking,
                "unproven": ev.unproven,
            }
            mark = {"ok": "✔", "warn": "!", "fail": "✘"}
            for r in ev.checks:
                say(
                    f"  {mark.get(r.status, '?')} {r.name}: {r.detail}"
                    + (f"\n    fix: {r.fix}" if r.fix and r.status != "ok" else "")
                )
            if ev.error is not None:
                doc |= {"error": ev.error, "fix": ev.fix or None, "log_tail": ev.log_tail or None}
                print(f"cosmictui relay start: {ev.error}" + (f"\n  fix: {ev.fix}" if ev.fix else ""), file=sys.stderr)
                if ev.log_tail and not quiet:
                    print(f"last log lines:\n{ev.log_tail}", file=sys.stderr)
            elif ev.blocking:
                doc["error"] = ev.blocking
                print(f"cosmictui relay start: jobs cannot use it: {ev.blocking}", file=sys.stderr)
            elif ev.unproven:
                doc["error"] = f"the probe {ev.unproven}"
                print(f"cosmictui relay start: not proven: the probe {ev.unproven}", file=sys.stderr)
            else:
                rc = OK
                say("result   ✔ the relay runs and two peers met through it")
                if not getattr(args, "in_setup", False):
                    say(f"next     cosmictui env set-relay {ev.key} (the wizard's step 3)")
    return rc
