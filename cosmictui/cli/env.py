"""`cosmictui env set-relay`: put a relay key into the deployment's `.env`."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path
from typing import Any, TextIO

from cosmictui.cli.context import open_runner, runner_exit, settings_from
from cosmictui.cli.output import EXIT_CODES, FAILED, KEY_FIX, OK, UsageError, dump, fail
from cosmictui.cli.parser import FORMAT

ORDER = 30


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    """Add env to the parser."""
    e = sub.add_parser(
        "env", parents=[common], help="edit the deployment's .env", epilog=EXIT_CODES, formatter_class=FORMAT
    )
    esub = e.add_subparsers(dest="env_command", metavar="ACTION", required=True)
    sr = esub.add_parser(
        "set-relay",
        parents=[common],
        help="put a relay key into the relays variable",
        description="Set K8S_COMMON_CONFIG__interconnect__relays in the deployment's .env: merge the key "
        "into the existing array (default) or replace it. Prints the diff, writes a timestamped backup, "
        "keeps every other byte.",
        epilog=EXIT_CODES,
        formatter_class=FORMAT,
    )
    sr.add_argument("key", metavar="KEY", help="relay public key (z32 or hex)")
    sr.add_argument("--env", metavar="PATH", help=".env path (relative to the deployment)")
    sr.add_argument("--replace", action="store_true", help="replace the array instead of merging")
    sr.add_argument("--dry-run", action="store_true", help="print the diff, write nothing")
    sr.add_argument("--json", action="store_true", help="print the plan and what was written as a JSON object")
    sr.set_defaults(handler=cmd_env_set_relay)


def cmd_env_set_relay(args: argparse.Namespace, out: TextIO) -> int:
    settings = settings_from(args)
    if getattr(args, "deployment", None) is None and settings.deployment == "." and not args.env:
        # Nothing named the deployment: editing ./.env of wherever the command was typed
        # would quietly change some other file. Refuse, and say how to name it.
        here = Path.cwd() / settings.env_path
        raise UsageError(
            f"no deployment given, so this would edit {here} (the current directory's .env); nothing changed",
            "--deployment DIR (or ssh://user@host/path) of the deployment whose .env lists the relays, or "
            'deployment = "DIR" in the config, or --env PATH to edit exactly that file',
        )
    from cosmictui.ops.runner import RunnerError
    from cosmictui.ops.setup.envapply import apply_plan
    from cosmictui.ops.setup.envfile import EnvChanged, EnvFileError, decode_text, normalize_key, plan_relays

    try:
        key = normalize_key(args.key)
    except ValueError as e:
        raise UsageError(f"KEY: {e}", f"KEY must be {KEY_FIX}") from None
    env_path = args.env or settings.env_path

    async def go() -> int:
        try:
            runner = await open_runner(settings)
        except RunnerError as e:
            return fail(args, out, "env", e.what, runner_exit(e), e.fix)
        try:
            path = runner.resolve(env_path)
            data = await runner.read_file(path)
            plan = plan_relays(
                decode_text(data), key, mode="replace" if args.replace else "merge", var=settings.env_var, path=path
            )
            report: dict[str, Any] = {
                "path": path,
                "var": settings.env_var,
                "key": key,
                "mode": "replace" if args.replace else "merge",
                "old_relays": list(plan.old_keys),
                "new_relays": list(plan.new_keys),
                "changed": plan.changed,
                "dry_run": bool(args.dry_run),
                "written": False,
                "backup": None,
                "diff": plan.diff,
                "bom": plan.bom,
            }
            if args.json and (not plan.changed or args.dry_run):
                dump(report, out)
                return OK
            if not plan.changed:
                out.write(f"{path}: {settings.env_var} already holds {key}; nothing to change\n")
                return OK
            if plan.bom and not args.json:
                out.write(f"note: {path} starts with a UTF-8 byte order mark (BOM); it is kept as it was\n")
            if args.dry_run:
                out.write(_ending(plan.diff))
                out.write(f"dry run: {path} not written\n")
                return OK
            try:
                applied = await apply_plan(runner, path, plan, settings.env_var, key)  # with its read-back
            except (EnvFileError, RunnerError):
                if not args.json:
                    out.write(_ending(plan.diff))  # refused: still the change it would have made
                raise
            backup = applied.backup
            if problem := applied.problem():
                if not args.json:
                    out.write(_ending(plan.diff))  # what is on disk is not this change
                return fail(args, out, "env", problem, FAILED)
            # On disk now: the same change, labelled as a file that was written (as step 3 shows it).
            written = plan.written_diff()
            if args.json:
                doc = report | {"written": True, "backup": backup, "read_back": list(applied.keys), "diff": written}
                dump(doc, out)
                return OK
            out.write(_ending(written))
            out.write(f"wrote {path}" + (f" (backup {backup})" if backup else "") + "\n")
            out.write("next: apply the config and restart the worker (the wizard's step 4)\n")
            return OK
        except EnvChanged as e:  # another writer, not the operator's mistake: nothing written, exit 1
            return fail(args, out, "env", f"{e.path}: {e.problem}", FAILED, e.fix)
        except EnvFileError as e:
            raise UsageError(str(e), e.fix or f"--env PATH of a .env that sets {settings.env_var}") from None
        except RunnerError as e:
            return fail(args, out, "env", e.what, runner_exit(e), e.fix)
        finally:
            await runner.close()

    return asyncio.run(go())


def _ending(diff: str) -> str:
    """The diff as printed: ending in exactly one newline."""
    return diff if diff.endswith("\n") else diff + "\n"
