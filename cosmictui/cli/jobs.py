"""`cosmictui jobs` and `jobs recover`: list jobs, which look stuck, and recover them."""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

from cosmictui.cli.context import open_runner, require_deployment, runner_exit, settings_from
from cosmictui.cli.output import EXIT_CODES, FAILED, NOT_CONFIRMED, OK, USAGE, UsageError, dump, error_doc, fail
from cosmictui.cli.parser import FORMAT, interval_seconds

ORDER = 40


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    """Add jobs to the parser."""
    j = sub.add_parser(
        "jobs",
        parents=[common],
        help="list CosmicAC jobs and which look stuck",
        description="Run the list command (default `cosmicac jobs list`) on the deployment and show jobs "
        "with status, age and why they look stuck. `jobs recover` deletes and recreates stuck ones.",
        epilog=EXIT_CODES,
        formatter_class=FORMAT,
    )
    j.add_argument("--json", action="store_true", help="print JSON (one object per line with --watch)")
    j.add_argument("--watch", action="store_true", help="list again every --interval seconds until Ctrl-C")
    j.add_argument(
        "--interval", metavar="S", type=interval_seconds, default=None, help="seconds between lists (config)"
    )
    j.add_argument("--count", type=int, default=None, help=argparse.SUPPRESS)  # bounded --watch, for tests
    jsub = j.add_subparsers(dest="jobs_command", metavar="ACTION")
    jr = jsub.add_parser(
        "recover",
        parents=[common],
        help="delete stuck jobs and recreate them (the wizard's step 6, headless)",
        description="Recover jobs the way the wizard's step 6 does: list the jobs, find each JOB_ID, save "
        "its every field and the recreate command to a new file (its path is printed) BEFORE any delete, "
        "then delete it and create it again. The create command is --create-command (yours, reviewed; "
        "{field}s are filled from the job's columns) or the configured [commands] create template. With "
        "neither, the job is deleted only with --delete-only, and you recreate it from the saved file. "
        "Without --yes: print the plan (the exact commands), delete nothing, exit 3.",
        epilog=EXIT_CODES,
        formatter_class=FORMAT,
    )
    jr.add_argument("ids", metavar="JOB_ID", nargs="+", help="id of a job to recover (as the list shows it)")
    jr.add_argument(
        "--create-command",
        metavar="CMD",
        help="your reviewed create command; {name}, {gpu_model} or any column is filled from the job",
    )
    jr.add_argument(
        "--delete-only",
        action="store_true",
        help="jobs with no known create command are deleted only (you recreate them from the saved file)",
    )
    jr.add_argument("--yes", action="store_true", help="really delete and recreate (default: print the plan)")
    jr.add_argument(
        "--no-relay-check",
        action="store_true",
        help="recover even though the relay the wizard set up on this machine is not running",
    )
    jr.add_argument("--json", action="store_true", help="print the plan and each result as one JSON object")
    j.set_defaults(handler=cmd_jobs)
    jr.set_defaults(handler=cmd_jobs_recover)


def _jobs_table(views: Sequence[Any]) -> str:
    from cosmictui.ops.jobs.model import format_age

    rows = [("ID", "STATUS", "AGE", "NOTE")]
    for v in views:
        note = v.stuck or ("created before the restart" if v.before_restart else "")
        rows.append((v.job.id, v.job.status.strip() or "unknown", format_age(v.age), note))
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    return "".join(
        f"{r[0]:<{widths[0]}}  {r[1]:<{widths[1]}}  {r[2]:>{widths[2]}}  {r[3]}".rstrip() + "\n" for r in rows
    )


def worker_restart_time(deployment: str) -> datetime | None:
    """When the wizard last restarted this deployment's worker (its progress file), if it did."""
    from cosmictui.ops.progress import load_progress

    at = load_progress(deployment).restarted_at
    return datetime.fromtimestamp(at, UTC) if isinstance(at, int | float) else None


def cmd_jobs(args: argparse.Namespace, out: TextIO) -> int:
    if getattr(args, "jobs_command", None) == "recover":
        return cmd_jobs_recover(args, out)
    settings = settings_from(args)
    require_deployment(args, settings, f"run `{settings.list_command}`")
    from cosmictui.ops.jobs.listing import list_jobs
    from cosmictui.ops.jobs.verify import one_list_verdict
    from cosmictui.ops.runner import RunnerError
    from cosmictui.ops.session import WizardContext

    interval = args.interval or settings.poll_interval
    session = WizardContext(settings)  # what the wizard (or apply, relay start) recorded for it
    key_since = session.key_since()
    restart_at = datetime.fromtimestamp(key_since, UTC) if key_since is not None else None

    async def once(runner: Any) -> tuple[int, Any]:
        # The same use cases (and wording) as the wizard's steps 5 and 6.
        listing = await list_jobs(runner.run, settings, datetime.now(UTC), restart_at)
        if not listing.ok:
            return FAILED, error_doc(listing.error or "", listing.fix, FAILED, output=listing.raw or "")
        inputs = session.verify_session().inputs
        inputs.run = runner.run
        kind, case, attribution = await one_list_verdict(inputs, listing.jobs)
        return OK, (listing.views, attribution, kind, case)

    def show(rc: int, res: Any) -> None:
        if rc != OK:
            if args.json:
                dump(res, out, stream=args.watch)
            else:
                fix = f"\n  fix: {res['fix']}" if res["fix"] else ""
                raw = f"\n{res['output']}" if res["output"] else ""
                print(f"cosmictui jobs: {res['error']}{fix}{raw}", file=sys.stderr)
            return
        views, attribution, kind, case = res
        if args.json:
            payload = [
                {
                    "id": v.job.id,
                    "status": v.job.status,
                    "status_class": settings.statuses.classify(v.job.status),
                    "created": v.job.created,
                    "updated": v.job.updated,
                    "age_seconds": v.age,
                    # unknown (null), not false, when no wizard run recorded a worker restart
                    "before_restart": v.before_restart if restart_at is not None else None,
                    "stuck": v.stuck,
                    "fields": v.job.fields,
                }
                for v in views
            ]
            relay = attribution.as_json() if attribution is not None else None
            doc = {"at": datetime.now(UTC), "jobs": payload, "relay": relay, "case": kind, "verdict": case}
            dump(doc, out, stream=args.watch)
        else:
            if args.watch:
                out.write(f"-- {datetime.now().strftime('%H:%M:%S')} --\n")
            out.write(_jobs_table(views))
            out.write(f"{case}\n")
            for line in attribution.lines if attribution is not None else ():
                if line not in case:
                    out.write(f"  {line}\n")
        out.flush()

    async def go() -> int:
        try:
            runner = await open_runner(settings)
        except RunnerError as e:
            return fail(args, out, "jobs", e.what, runner_exit(e), e.fix)
        try:
            n = 0
            while True:
                try:
                    rc, res = await once(runner)
                except RunnerError as e:
                    rc, res = FAILED, error_doc(e.what, e.fix, FAILED, output="")
                show(rc, res)
                n += 1
                if not args.watch or (args.count is not None and n >= args.count):
                    return rc
                await asyncio.sleep(interval)
        finally:
            await runner.close()

    try:
        return asyncio.run(go())
    except KeyboardInterrupt:
        return OK


def _recover_relay_problem(settings: Any) -> str | None:
    """The wizard's guard for step 6, headless: the relay its step 2 set up on this machine must run.

    Known only from the wizard's progress for this deployment; a relay attached by key runs
    elsewhere (nothing local to check) and a deployment never set up has nothing to compare.
    """
    from cosmictui.ops import progress as progress_mod
    from cosmictui.ops import relayproc

    p = progress_mod.load_progress(settings.deployment)
    if not p.relay_key or p.relay_external:
        return None
    return relayproc.relay_problem(p.relay_storage or settings.relay_storage, p.relay_key)


def cmd_jobs_recover(args: argparse.Namespace, out: TextIO) -> int:
    """`jobs recover`: the wizard's step 6 use case (ops/recover), confirmed by --yes instead of a dialog."""
    settings = settings_from(args)
    from cosmictui.ops.jobs.listing import list_jobs
    from cosmictui.ops.jobs.recover import (
        RecordSaved,
        RecoveryRefused,
        RecoveryStopped,
        plan_jobs,
        recover_jobs,
        recovery_dir,
    )
    from cosmictui.ops.runner import RunnerError

    name = "jobs recover"
    require_deployment(args, settings, f"run `{settings.list_command}` and recover jobs from that list")
    if args.create_command is not None and not args.create_command.strip():
        raise UsageError(
            "--create-command is empty",
            "--create-command 'cosmicac jobs create ...' (your reviewed command), or --delete-only",
        )
    relay_down = _recover_relay_problem(settings)
    if relay_down and args.yes and not args.no_relay_check:
        return fail(
            args,
            out,
            name,
            f"{relay_down} A recreated job would wait for it and stay in Creating. Nothing deleted.",
            FAILED,
            "start the relay again (the wizard's step 2, or blind-relay --storage with the same storage), "
            "then run this again; --no-relay-check if it now runs elsewhere",
        )

    def plan_doc(p: Any) -> dict[str, Any]:
        return {
            "id": p.job.id,
            "status": p.job.status,
            "fields": p.job.fields,
            "delete_command": p.delete,
            "create_command": p.create,
            "create_source": p.create_source,
        }

    def show_plan(plans: list[Any], folder: Path) -> None:
        for p in plans:
            out.write(f"job {p.job.id} ({p.job.status.strip() or 'unknown'})\n")
            out.write(f"  delete  {p.delete}\n")
            if p.create is None:
                out.write("  create  none known: deleted only; you recreate it (web UI or CLI) from the saved file\n")
            else:
                source = "your --create-command" if p.create_source == "operator" else "[commands] create"
                out.write(f"  create  {p.create}   ({source})\n")
        out.write(f"record   every field and these commands go to a new file in {folder}/ before the delete\n")
        if relay_down:
            out.write(f"relay    {relay_down} --yes will refuse until it runs (or --no-relay-check)\n")

    async def go() -> int:
        try:
            runner = await open_runner(settings)
        except RunnerError as e:
            return fail(args, out, name, e.what + " Nothing deleted.", runner_exit(e), e.fix)
        try:
            listing = await list_jobs(runner.run, settings, datetime.now(UTC))
            if not listing.ok:
                raw = f"\n{listing.raw}" if listing.raw else ""
                return fail(args, out, name, f"{listing.error} Nothing deleted.{raw}", FAILED)
            try:
                plans = plan_jobs(listing.jobs, args.ids, settings, args.create_command, args.delete_only)
            except RecoveryRefused as e:
                return fail(args, out, name, e.what, FAILED if e.kind == "unknown-job" else USAGE, e.fix)
            folder = recovery_dir(settings.deployment)
            doc: dict[str, Any] = {"jobs": [plan_doc(p) for p in plans], "record_dir": folder, "confirmed": args.yes}
            doc |= {"results": [], "error": None, "fix": None, "relay_problem": relay_down}
            if not args.yes:
                if args.json:
                    dump(doc | {"exit_code": NOT_CONFIRMED}, out)
                else:
                    show_plan(plans, folder)
                    out.write("not confirmed: nothing saved or deleted; run again with --yes to do it\n")
                return NOT_CONFIRMED
            rc = OK
            listed = [j.id for j in listing.jobs]  # so the job each create made is told apart
            async for event in recover_jobs(runner.run, plans, settings, listed):  # the wizard's step 6 loop
                if isinstance(event, RecordSaved):
                    if not args.json:
                        out.write(f"saved job {event.job_id} (every field, recreate command) to {event.record}\n")
                        out.flush()
                    continue
                result = event.result
                if result is not None:
                    doc["results"].append(
                        {
                            "id": result.job_id,
                            "outcome": result.outcome,
                            "message": result.message,
                            "record": result.record,
                            "command": result.command,
                            "output": result.output,
                            "new_job_id": result.new_job_id,
                        }
                    )
                if isinstance(event, RecoveryStopped):
                    doc["error"] = event.message + " Stopped here."
                    doc["fix"] = event.fix or None
                    rc = FAILED
                elif not args.json and result is not None:
                    out.write(result.message + "\n")
            if rc == OK and not args.json and any(r["outcome"] == "recreated" for r in doc["results"]):
                out.write("watch the recreated job(s) leave Creating: cosmictui jobs --watch\n")
            if args.json:
                dump(doc | {"exit_code": rc}, out)
            elif doc["error"]:
                fix = f"\n  fix: {doc['fix']}" if doc["fix"] else ""
                print(f"cosmictui {name}: {doc['error']}{fix}", file=sys.stderr)
            return rc
        finally:
            await runner.close()

    try:
        return asyncio.run(go())
    except KeyboardInterrupt:  # maybe between a delete and its create: say where the records are
        folder = recovery_dir(settings.deployment)
        return fail(
            args,
            out,
            name,
            f"interrupted: a job may be deleted and not recreated; every job's record is in {folder}",
            FAILED,
            "check with `cosmictui jobs` and recreate any missing job with its record's recreate_command",
        )
