"""`cosmictui verify`: the wizard's step 5, headless. Exit 0 only when the relay carried the job's own
connection (the verdict rule in `ops.jobs.evidence`)."""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any, TextIO

from cosmictui.cli.context import session_from, settings_from
from cosmictui.cli.output import EXIT_CODES, FAILED, OK, UsageError, dump, fail
from cosmictui.cli.parser import FORMAT, interval_seconds, metrics_addr, timeout_seconds

ORDER = 46

DESCRIPTION = """\
Create the small test job ([commands] test_job), or watch --job ID, until it leaves Creating and
keeps updating, and read the relay's record of its pairings: the relay works only when a pairing
opened after the job's create started (and after the last worker restart), with no peer key of
this machine's probes, and a peer key the relay first saw after the job was created. A relay
restarted meanwhile, or a record that cannot be read or overflowed, is "cannot tell". Stops at
the first verdict that more waiting does not change, or after --timeout.
Exit 0: proven; 1: anything else (which case, and what to check); 2: usage."""


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    """Add verify to the parser."""
    v = sub.add_parser(
        "verify",
        parents=[common],
        help="prove a new job's connection goes through the relay (the wizard's step 5)",
        description=DESCRIPTION,
        epilog=EXIT_CODES,
        formatter_class=FORMAT,
    )
    add_verify_flags(v)
    v.set_defaults(handler=cmd_verify)


def add_verify_flags(v: argparse.ArgumentParser, *, with_json: bool = True) -> None:
    v.add_argument("--job", metavar="ID", help="watch this job (one you created) instead of creating the test job")
    v.add_argument(
        "--timeout", metavar="S", type=timeout_seconds, default=600.0, help="give up after this many seconds (600)"
    )
    v.add_argument(
        "--interval", metavar="S", type=interval_seconds, default=None, help="seconds between lists (config)"
    )
    v.add_argument("--storage", metavar="DIR", help="relay storage directory (default: the one step 2 used, config)")
    v.add_argument(
        "--metrics", metavar="URL", type=metrics_addr, help="the relay's metrics address (default: its runtime file)"
    )
    v.add_argument("--relay-key", metavar="KEY", help="the relay the job must go through (default: the one set up)")
    if with_json:
        v.add_argument("--json", action="store_true", help="print the verdict as one JSON object")


def cmd_verify(args: argparse.Namespace, out: TextIO) -> int:
    settings = settings_from(args)
    if args.interval is not None:
        settings = settings.with_overrides(poll_interval=args.interval)
    if not args.job and not settings.test_job_command.strip():
        raise UsageError(
            "no test job is configured, and no --job ID given",
            "set [commands] test_job in the config (your small `cosmicac jobs create ...`), or create a job "
            "yourself and pass --job ID",
        )
    ctx = session_from(args, settings)
    if ctx.relay_key is None:
        raise UsageError(
            "no relay to verify: none was set up for this deployment, none runs on the storage, and no --relay-key",
            "cosmictui relay start (or the wizard's step 2), or --relay-key KEY / --storage DIR",
        )
    result: dict[str, Any] = {}

    async def go() -> int:
        try:
            rc = await run_verify(ctx, args, out, result, quiet=args.json)
        finally:
            await ctx.close()
        return rc

    try:
        rc = asyncio.run(go())
    except KeyboardInterrupt:
        return fail(args, out, "verify", "interrupted: nothing proven", FAILED)
    if args.json:
        dump(result | {"exit_code": rc}, out)
    return rc


async def run_verify(ctx: Any, args: argparse.Namespace, out: TextIO, result: dict[str, Any], quiet: bool) -> int:
    """Create (or watch) the job and wait for a settled verdict; fills `result` (the --json object)."""
    from cosmictui.ops.jobs.verify import SETTLED, Judged, TestJobCreated, TestJobFailed

    session = ctx.verify_session(job_id=args.job)
    result |= {"relay_key": ctx.relay_key, "job": args.job, "created": None, "verdict": None, "proven": False}
    restart = ctx.restarted_at

    def say(text: str) -> None:
        if not quiet:
            out.write(text + "\n")
            out.flush()

    say(f"relay    {ctx.relay_key}")
    if restart is None:
        say("restart  none recorded (cosmictui apply or the wizard's step 4 records it)")
    else:
        from cosmictui.ops.jobs.evidence import clock

        say(f"restart  worker restarted at {clock(restart)}")
    if not args.job:
        async for ev in session.create_test_job():
            if isinstance(ev, TestJobFailed):
                result |= {"verdict": "create-failed", "message": ev.message, "check": ev.fix or None}
                print(f"cosmictui verify: {ev.message}" + (f"\n  fix: {ev.fix}" if ev.fix else ""), file=sys.stderr)
                return FAILED
            if isinstance(ev, TestJobCreated):
                result["created"] = {"command": ev.cmd, "at": ev.at, "output": ev.output.strip()}
                say(f"created  {ev.cmd}")
                for line in ev.output.strip().splitlines()[-3:]:
                    say(f"         {line}")
            if isinstance(ev, Judged) and ev.verdict.kind == "list-failed":
                result |= ev.verdict.as_json()
                say(f"verdict  ✘ {ev.verdict.message}")
                return FAILED
    last = ""
    async for ev in session.run(timeout=args.timeout, until_settled=True):
        if isinstance(ev, Judged):
            v = ev.verdict
            ctx.note_verdict(v)
            if v.message != last:
                mark = {"ok": "✔", "warn": "!", "error": "✘"}.get(v.level, "…")
                say(f"{'verdict' if v.kind in SETTLED else 'status':<8} {mark} {v.message}")
                for line in v.lines:
                    say(f"         {line}")
                if v.check:
                    say(f"check    {v.check.removeprefix('What to check: ')}")
                last = v.message
    v = session.verdict
    if v is None:
        result["verdict"] = "no-verdict"
        return FAILED
    result |= v.as_json()
    if v.kind not in SETTLED:
        result["timed_out"] = True
        say(f"result   ✘ not proven within {args.timeout:g} s ({v.kind})")
    return OK if v.proven else FAILED
