"""`cosmictui apply`: the wizard's step 4, headless: apply the config and restart the worker."""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any, TextIO

from cosmictui.cli.context import runner_exit, session_from, settings_from
from cosmictui.cli.output import EXIT_CODES, FAILED, OK, dump, fail
from cosmictui.cli.parser import FORMAT

ORDER = 44

DESCRIPTION = """\
Run [commands] apply, then [commands] restart, on the deployment, output streamed, stopping at
the first failure (the wizard's step 4). The .env is read first: when it does not list the relay
set up for this deployment (step 2, `cosmictui relay start`, --relay-key or --storage), nothing
runs unless --force, and both keys are named. The restart is recorded (when it began, whether it
finished, which keys it applied) for `cosmictui verify` and the wizard."""


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    """Add apply to the parser."""
    a = sub.add_parser(
        "apply",
        parents=[common],
        help="apply the config and restart the worker (the wizard's step 4)",
        description=DESCRIPTION,
        epilog=EXIT_CODES,
        formatter_class=FORMAT,
    )
    add_apply_flags(a)
    a.add_argument("--json", action="store_true", help="print what ran as one JSON object (output included)")
    a.set_defaults(handler=cmd_apply)


def add_apply_flags(a: argparse.ArgumentParser) -> None:
    a.add_argument("--force", action="store_true", help="apply even when the .env does not list the relay")
    if not any("--relay-key" in act.option_strings for act in a._actions):
        a.add_argument("--relay-key", metavar="KEY", help="the relay the .env must list (default: the one set up)")
    if not any("--storage" in act.option_strings for act in a._actions):
        a.add_argument("--storage", metavar="DIR", help="relay storage directory (default: the one set up, config)")


def cmd_apply(args: argparse.Namespace, out: TextIO) -> int:
    settings = settings_from(args)
    ctx = session_from(args, settings)

    async def go() -> int:
        try:
            return await run_apply(ctx, args, out, doc, quiet=args.json)
        finally:
            await ctx.close()

    doc: dict[str, Any] = {}
    try:
        rc = asyncio.run(go())
    except KeyboardInterrupt:
        return fail(args, out, "apply", "interrupted: the worker may be half restarted; apply again", FAILED)
    if args.json:
        dump(doc | {"exit_code": rc}, out)
    return rc


async def run_apply(ctx: Any, args: argparse.Namespace, out: TextIO, doc: dict[str, Any], quiet: bool) -> int:
    """Read the .env, refuse a mismatch unless --force, then apply and restart; fills `doc`."""
    from cosmictui.ops.runner import RunnerError
    from cosmictui.ops.setup.apply import ApplyDone, CommandBegan, CommandEnded, CommandOutput, env_mismatch

    def say(text: str) -> None:
        if not quiet:
            out.write(text)
            out.flush()

    keys = await ctx.read_env_relays()
    doc |= {"relay_key": ctx.relay_key, "env_relays": list(keys) if keys is not None else None, "commands": []}
    doc |= {"ok": False, "restarted_at": None, "error": None, "fix": None}
    if keys is None:
        try:
            runner = await ctx.deployment()
            await runner.read_file(runner.resolve(ctx.settings.env_path))
        except RunnerError as e:
            doc |= {"error": e.what, "fix": e.fix or None}
            print(f"cosmictui apply: {e.what}" + (f"\n  fix: {e.fix}" if e.fix else ""), file=sys.stderr)
            return runner_exit(e)
    warning = env_mismatch(keys, ctx.relay_key)
    doc["env_mismatch"] = warning
    if warning and not args.force:
        fix = (
            f"cosmictui env set-relay {ctx.relay_key} (the wizard's step 3), then apply again; or --force to "
            "apply the .env as it is"
        )
        doc |= {"error": warning + " Nothing ran.", "fix": fix}
        print(f"cosmictui apply: {warning} Nothing ran.\n  fix: {fix}", file=sys.stderr)
        return FAILED
    if warning:
        say(f"warning  {warning}\n")
    rc = FAILED
    async for ev in ctx.apply_and_restart(keys):
        if isinstance(ev, CommandBegan):
            doc["commands"].append({"command": ev.cmd, "exit_code": None, "output": ""})
            say(f"$ {ev.cmd}\n")
        elif isinstance(ev, CommandOutput):
            text = ev.text if ev.text.endswith("\n") else ev.text + "\n"
            doc["commands"][-1]["output"] += text
            say(text)
        elif isinstance(ev, CommandEnded):
            doc["commands"][-1]["exit_code"] = ev.exit_code
        elif isinstance(ev, ApplyDone):
            if ev.ok:
                rc = OK
                doc |= {"ok": True, "restarted_at": ctx.restarted_at}
                say(f"{ev.message}\n")
                if not getattr(args, "in_setup", False):
                    say("next: cosmictui verify (a new job must leave Creating through the relay)\n")
            else:
                doc |= {"error": ev.message, "fix": ev.fix or None, "restarted_at": ctx.restarted_at}
                print(f"cosmictui apply: {ev.message}", file=sys.stderr)
    return rc
