"""`cosmictui setup --yes`: the wizard's steps 1–5 headless, in order, stopping at the first failure."""

from __future__ import annotations

import argparse
import asyncio
import io
import sys
from typing import Any, TextIO

from cosmictui.cli.context import settings_from
from cosmictui.cli.output import EXIT_CODES, FAILED, NOT_CONFIRMED, OK, USAGE, dump, fail
from cosmictui.cli.parser import FORMAT, port_number, timeout_seconds

ORDER = 15

STEPS = ("check", "relay", "env", "apply", "verify")
DESCRIPTION = """\
Run the wizard's steps 1 to 5 on the deployment, in order, and stop at the first that fails:
check (the prerequisites), relay (start it, check it, prove it: `relay start`), env (merge its key
into the .env's relays: `env set-relay`), apply (apply the config and restart the worker: `apply`),
verify (create the test job and prove its own connection went through the relay: `verify`). Each
step records what it did as the wizard does, so the wizard resumes after it. Without --yes the
plan is printed and nothing runs (exit 3). --json prints one object per step, one per line.
Exit 0: every step passed and verify proved it; 1: a step failed (it names which, and its fix)."""


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    """Add setup to the parser."""
    s = sub.add_parser(
        "setup",
        parents=[common],
        help="the wizard's steps 1-5 headless, stopping at the first failure",
        description=DESCRIPTION,
        epilog=EXIT_CODES,
        formatter_class=FORMAT,
    )
    s.add_argument("--yes", action="store_true", help="run the steps (default: print the plan)")
    s.add_argument("--storage", metavar="DIR", help="relay storage directory (config)")
    s.add_argument("--port", type=port_number, help="relay UDP port (config)")
    s.add_argument(
        "--relay-timeout", metavar="S", type=timeout_seconds, default=120.0, help="bound for the relay step (120)"
    )
    s.add_argument(
        "--timeout", metavar="S", type=timeout_seconds, default=600.0, help="how long verify waits for the job (600)"
    )
    s.add_argument("--json", action="store_true", help="one JSON object per step, one per line")
    s.set_defaults(handler=cmd_setup)


def cmd_setup(args: argparse.Namespace, out: TextIO) -> int:
    settings = settings_from(args)
    if args.storage:
        settings = settings.with_overrides(relay_storage=args.storage)
    if not settings.test_job_command.strip():
        return fail(
            args,
            out,
            "setup",
            "no test job is configured: the verify step could not prove anything",
            USAGE,
            "set [commands] test_job in the config (your small `cosmicac jobs create ...`); or run the steps "
            "one by one and `cosmictui verify --job ID` with a job you create",
        )
    if not args.yes:
        return _plan(args, out, settings)
    from cosmictui.ops.session import WizardContext

    ctx = WizardContext(settings)

    async def go() -> int:
        try:
            for name in STEPS:
                doc: dict[str, Any] = {"step": name}
                if not args.json:
                    out.write(f"== {name}\n")
                    out.flush()
                rc = await _STEP[name](ctx, args, out, doc)
                if args.json:
                    dump(doc | {"exit_code": rc}, out, stream=True)
                if rc != OK:
                    if not args.json:
                        out.write(f"stopped at {name}: the steps after it did not run\n")
                    return rc
            return OK
        finally:
            await ctx.close()

    try:
        return asyncio.run(go())
    except KeyboardInterrupt:
        return fail(args, out, "setup", "interrupted; run it again: each step starts from what is true now", FAILED)


def _plan(args: argparse.Namespace, out: TextIO, settings: Any) -> int:
    lines = [
        "check    the prerequisites (this machine and the deployment host)",
        f"relay    start the relay with storage {settings.relay_storage}, UDP port {args.port or settings.relay_port}, "
        "check it and probe it",
        f"env      merge its key into {settings.env_path} ({settings.env_var}), with a backup",
        f"apply    {settings.apply_command}; {settings.restart_command}",
        f"verify   {settings.test_job_command}; wait up to {args.timeout:g} s for its own pairing",
    ]
    if args.json:
        dump({"plan": lines, "confirmed": False, "exit_code": NOT_CONFIRMED}, out)
    else:
        out.write("".join(f"{line}\n" for line in lines))
        out.write("not confirmed: nothing ran; run again with --yes to do it\n")
    return NOT_CONFIRMED


def _sub(args: argparse.Namespace, **kw: Any) -> argparse.Namespace:
    """The step command's flags as setup runs it (no "next:" hints: setup runs the next step)."""
    return argparse.Namespace(**{**vars(args), "in_setup": True, **kw})


async def _check(ctx: Any, args: argparse.Namespace, out: TextIO, doc: dict[str, Any]) -> int:
    from cosmictui.ops.setup.steps import gather_checks

    results = await gather_checks(ctx.settings, ctx.logged_deployment, args.storage)
    doc["checks"] = [{"name": r.name, "status": r.status, "detail": r.detail, "fix": r.fix} for r in results]
    failed = [r for r in results if r.status == "fail"]
    if not args.json:
        mark = {"ok": "✔", "warn": "!", "fail": "✘"}
        for r in results:
            fix = f"\n    fix: {r.fix}" if r.fix and r.status != "ok" else ""
            out.write(f"  {mark.get(r.status, '?')} {r.name}: {r.detail}{fix}\n")
    if failed:
        doc |= {"error": "; ".join(f"{r.name}: {r.detail}" for r in failed), "fix": failed[0].fix or None}
        return FAILED
    ctx.set_done("prereqs", True)
    return OK


async def _relay(ctx: Any, args: argparse.Namespace, out: TextIO, doc: dict[str, Any]) -> int:
    from cosmictui.cli._relay_start import run_relay_start

    sub = _sub(args, yes=True, timeout=args.relay_timeout)
    return await run_relay_start(ctx, sub, out, doc, quiet=args.json)


async def _env(ctx: Any, args: argparse.Namespace, out: TextIO, doc: dict[str, Any]) -> int:
    from cosmictui.cli.context import runner_exit
    from cosmictui.ops.runner import RunnerError
    from cosmictui.ops.setup.envapply import apply_plan
    from cosmictui.ops.setup.envfile import EnvFileError, decode_text, plan_relays

    key = ctx.relay_key
    try:
        runner = await ctx.deployment()
        path = runner.resolve(ctx.settings.env_path)
        plan = plan_relays(decode_text(await runner.read_file(path)), key, "merge", var=ctx.settings.env_var, path=path)
        doc |= {"path": path, "key": key, "old_relays": list(plan.old_keys), "new_relays": list(plan.new_keys)}
        doc |= {"changed": plan.changed, "backup": None}
        if plan.changed:
            applied = await apply_plan(runner, path, plan, ctx.settings.env_var, key)
            doc["backup"] = applied.backup
            if problem := applied.problem():
                doc |= {"error": problem, "fix": f"check {path}"}
                print(f"cosmictui setup: {problem}", file=sys.stderr)
                return FAILED
            ctx.env_backup = applied.backup
            ctx.env_written(tuple(applied.keys))
            if not args.json:
                out.write(f"  wrote {path}" + (f" (backup {applied.backup})" if applied.backup else "") + "\n")
        else:
            ctx.env_relays = tuple(plan.old_keys)
            if not args.json:
                out.write(f"  {path} already lists {key}\n")
    except (EnvFileError, RunnerError) as e:
        what = str(e) if isinstance(e, EnvFileError) else e.what
        doc |= {"error": what, "fix": getattr(e, "fix", "") or None}
        print(f"cosmictui setup: {what}", file=sys.stderr)
        return runner_exit(e) if isinstance(e, RunnerError) else FAILED
    ctx.set_done("env", True)
    ctx.save_progress(3)
    return OK


async def _apply(ctx: Any, args: argparse.Namespace, out: TextIO, doc: dict[str, Any]) -> int:
    from cosmictui.cli.apply import run_apply

    sink = io.StringIO() if args.json else out
    return await run_apply(ctx, _sub(args, force=False), sink, doc, quiet=args.json)


async def _verify(ctx: Any, args: argparse.Namespace, out: TextIO, doc: dict[str, Any]) -> int:
    from cosmictui.cli.verify import run_verify

    return await run_verify(ctx, _sub(args, job=None), out, doc, quiet=args.json)


_STEP = {"check": _check, "relay": _relay, "env": _env, "apply": _apply, "verify": _verify}
