"""`cosmictui` entry point: the wizard by default, subcommands for the monitor and for scripts.

Every headless subcommand prints for people by default and for programs with `--json`, and
ends with an exit code scripts can branch on (see `EXIT_CODES`). The work itself lives in
`cosmictui.ops`; this module only parses flags, calls it, prints and picks the exit code.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, is_dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

OK, FAILED, USAGE, NOT_CONFIRMED = 0, 1, 2, 3

EXIT_CODES = """\
exit codes:
  0  ok (checks passed, relay up, .env written or already right, jobs listed)
  1  a check failed, the relay is down or not running, a command on the deployment failed
  2  usage or configuration error (bad flag, unreadable config, invalid key, missing deployment
     directory or .env, .env not editable; jobs recover: no known create command and no
     --delete-only, or a --create-command with {fields} the jobs list does not fill)
  3  jobs recover without --yes: the plan was printed, nothing was saved or deleted"""


class UsageError(Exception):
    """Bad input from the operator: exit 2 with the message."""


class _ParseError(Exception):
    def __init__(self, parser: argparse.ArgumentParser, message: str) -> None:
        super().__init__(message)
        self.parser = parser


class _Parser(argparse.ArgumentParser):
    """argparse that raises instead of exiting, so a bad flag under `--json` is JSON too."""

    def error(self, message: str) -> Any:
        raise _ParseError(self, message)


# -- parser ---------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    common = _Parser(add_help=False)
    common.add_argument("--config", metavar="PATH", default=argparse.SUPPRESS, help="TOML config file")
    common.add_argument(
        "--deployment",
        metavar="SPEC",
        default=argparse.SUPPRESS,
        help="deployment directory or ssh://user@host[:port]/path",
    )

    fmt = argparse.RawDescriptionHelpFormatter
    p = _Parser(
        prog="cosmictui",
        description="Set up a CosmicAC blind relay and watch it. Without a subcommand: the setup wizard.",
        epilog=EXIT_CODES,
        formatter_class=fmt,
        parents=[common],
    )
    p.add_argument("--demo", action="store_true", help="run the wizard against a built-in sandbox deployment")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    m = sub.add_parser(
        "monitor",
        parents=[common],
        help="live monitor of one or more relays",
        description="Live monitor of one or more relays (memory, CPU, traffic, pairings, DHT, log). "
        "Without --storage/--metrics/--relay-key: the configured relay storage, else the default metrics "
        "address. A relay without metrics (--relay-key, or a local relay started with --metrics off) is "
        "probed over the DHT instead: its graph is the probe's round trip over time.",
        epilog="keys: +/- refresh interval, p pause, r refresh now, t light/dark theme, l log, q quit\n\n" + EXIT_CODES,
        formatter_class=fmt,
    )
    m.add_argument("--storage", metavar="DIR", action="append", default=[], help="relay storage dir (repeatable)")
    m.add_argument(
        "--metrics", metavar="URL", action="append", type=_metrics_addr, default=[], help="HOST:PORT or URL (repeat)"
    )
    m.add_argument("--interval", metavar="S", type=_interval, default=1.0, help="refresh interval in seconds (1)")
    m.add_argument(
        "--timeout",
        metavar="S",
        type=_timeout,
        default=None,
        help="give up on a relay's scrape after S seconds and show it DOWN (default: the interval, 2-5 s)",
    )
    m.add_argument(
        "--relay-key",
        metavar="KEY",
        action="append",
        default=[],
        help="watch a relay known only by its key (e.g. npm blind-relay-service) by probing it (repeatable)",
    )
    m.add_argument(
        "--bootstrap",
        metavar="HOST:PORT,…",
        help="DHT bootstrap nodes for the probes (default: the config's [relay] bootstrap, else the public nodes)",
    )
    m.add_argument(
        "--probe-interval", metavar="S", type=_interval, default=None, help="seconds between probe echoes (5)"
    )

    c = sub.add_parser(
        "check",
        parents=[common],
        help="run the wizard's prerequisite checks",
        description="Run the prerequisite checks (the wizard's first step). Warnings do not fail.",
        epilog=EXIT_CODES,
        formatter_class=fmt,
    )
    c.add_argument("--json", action="store_true", help="print a JSON array of results")
    c.add_argument("--storage", metavar="DIR", help="relay storage directory to check")
    c.add_argument("--port", type=_port, help="relay UDP port to check (1-65535)")
    c.add_argument(
        "--relay-key",
        metavar="KEY",
        help="also probe this relay (default: the relay running on the storage, when there is one)",
    )
    c.add_argument("--no-probe", action="store_true", help="skip the relayed-connection probe")

    e = sub.add_parser(
        "env", parents=[common], help="edit the deployment's .env", epilog=EXIT_CODES, formatter_class=fmt
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
        formatter_class=fmt,
    )
    sr.add_argument("key", metavar="KEY", help="relay public key (z32 or hex)")
    sr.add_argument("--env", metavar="PATH", help=".env path (relative to the deployment)")
    sr.add_argument("--replace", action="store_true", help="replace the array instead of merging")
    sr.add_argument("--dry-run", action="store_true", help="print the diff, write nothing")
    sr.add_argument("--json", action="store_true", help="print the plan and what was written as a JSON object")

    j = sub.add_parser(
        "jobs",
        parents=[common],
        help="list CosmicAC jobs and which look stuck",
        description="Run the list command (default `cosmicac jobs list`) on the deployment and show jobs "
        "with status, age and why they look stuck. `jobs recover` deletes and recreates stuck ones.",
        epilog=EXIT_CODES,
        formatter_class=fmt,
    )
    j.add_argument("--json", action="store_true", help="print JSON (one object per line with --watch)")
    j.add_argument("--watch", action="store_true", help="list again every --interval seconds until Ctrl-C")
    j.add_argument("--interval", metavar="S", type=_interval, default=None, help="seconds between lists (config)")
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
        formatter_class=fmt,
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

    r = sub.add_parser(
        "relay", parents=[common], help="the relay on this machine", epilog=EXIT_CODES, formatter_class=fmt
    )
    rsub = r.add_subparsers(dest="relay_command", metavar="ACTION", required=True)
    rs = rsub.add_parser(
        "status",
        parents=[common],
        help="is the relay running and answering",
        description="Read <storage>/relay-runtime.json and the relay's /stats.",
        epilog=EXIT_CODES,
        formatter_class=fmt,
    )
    rs.add_argument("--json", action="store_true", help="print a JSON object")
    rs.add_argument("--storage", metavar="DIR", help="relay storage directory (config)")
    rs.add_argument(
        "--metrics", metavar="URL", type=_metrics_addr, help="ask this metrics address instead of the runtime file's"
    )
    rs.add_argument(
        "--timeout", metavar="S", type=_timeout, default=3.0, help="seconds to wait for the relay's answer (3)"
    )
    rp = rsub.add_parser(
        "probe",
        parents=[common],
        help="prove a relay carries a connection (two peers meet through it)",
        description="Two Python peers on this host, punching off, connect through the relay by its key and "
        "echo: key found on the DHT, handshake with the relay, pairing matched, first echo, bytes and round "
        "trip. Works for any blind relay (this one or blind-relay-service). Exit 0: the echo came back "
        "relayed; 1: a stage failed (which and why); 2: usage.",
        epilog=EXIT_CODES,
        formatter_class=fmt,
    )
    rp.add_argument("key", metavar="KEY", nargs="?", help="relay public key (default: the configured/running relay)")
    rp.add_argument(
        "--bootstrap", metavar="HOST:PORT[,...]", help="DHT bootstrap nodes (default: config, else the public DHT)"
    )
    rp.add_argument("--timeout", metavar="S", type=_interval, default=30.0, help="bound for the whole probe (30)")
    rp.add_argument("--storage", metavar="DIR", help="relay storage directory to take the key from (config)")
    rp.add_argument("--json", action="store_true", help="print a JSON object with every stage")
    rp.add_argument(
        "--watch", action="store_true", help="then echo every --interval seconds: round trip over time (Ctrl-C ends)"
    )
    rp.add_argument("--interval", metavar="S", type=_interval, default=5.0, help="seconds between echoes (5)")
    rp.add_argument("--count", type=int, default=None, help=argparse.SUPPRESS)  # bounded --watch, for tests
    return p


def _metrics_addr(text: str) -> str:
    """Checked while parsing, so a typo is one usage line (exit 2), never a traceback later."""
    from cosmictui.ops.metrics.client import normalize_url

    try:
        normalize_url(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


def _port(text: str) -> int:
    """1-65535 at parse time: 70000 is a usage error, not a traceback; 0 is not a port to check."""
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 1 <= v <= 65535:
        raise argparse.ArgumentTypeError(f"port must be 1-65535, got {v}")
    return v


def _timeout(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not 0.1 <= v <= 3600:
        raise argparse.ArgumentTypeError("timeout must be between 0.1 and 3600 seconds")
    return v


def _interval(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not 0.2 <= v <= 3600:
        raise argparse.ArgumentTypeError("interval must be between 0.2 and 3600 seconds")
    return v


# -- helpers --------------------------------------------------------------------------------------


def _settings(args: argparse.Namespace, **overrides: Any) -> Any:
    from cosmictui.ops.config import ConfigError, load_settings

    if getattr(args, "deployment", None) is not None:
        overrides["deployment"] = args.deployment
    try:
        settings = load_settings(getattr(args, "config", None), **overrides)
    except ConfigError as e:
        raise UsageError(str(e)) from None
    from cosmictui.ops.runner import RunnerError, parse_deployment

    try:
        parse_deployment(settings.deployment)
    except RunnerError as e:  # ftp://x, ssh:// without a host or with a bad port: configuration
        raise UsageError(f"--deployment: {e.what}" + (f" ({e.fix})" if e.fix else "")) from None
    return settings


def _plain(obj: Any) -> Any:
    """Dataclasses, paths and datetimes as JSON-ready values."""
    if is_dataclass(obj) and not isinstance(obj, type):
        return _plain(asdict(obj))
    if isinstance(obj, dict):
        return {str(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_plain(v) for v in obj]
    if isinstance(obj, datetime):
        return obj.isoformat()
    if isinstance(obj, Path):
        return str(obj)
    return obj


def _dump(obj: Any, out: TextIO, stream: bool = False) -> None:
    """Pretty on a terminal's stdout; `stream` (watch modes): always one object per line (NDJSON).

    Always strict JSON: remote values (a relay's /stats) may hold NaN or Infinity, which
    `json.dumps` would print as bare words no JSON parser takes; they become null."""
    from cosmictui.ops.metrics.client import strict_json

    pretty = out is sys.stdout and not stream
    out.write(json.dumps(strict_json(_plain(obj)), indent=2 if pretty else None, allow_nan=False) + "\n")


def _fail(args: argparse.Namespace, out: TextIO, command: str, error: str, code: int, fix: str = "") -> int:
    """An error for people on stderr and, with --json, for programs on stdout; returns `code`."""
    print(f"cosmictui {command}: {error}" + (f"\n  fix: {fix}" if fix else ""), file=sys.stderr)
    if getattr(args, "json", False):
        _dump({"error": error, "fix": fix or None, "exit_code": code}, out)
    return code


async def _open_runner(settings: Any) -> Any:
    from cosmictui.ops.runner import open_deployment

    return await open_deployment(
        settings.deployment,
        env=settings.command_env,
        known_hosts=settings.ssh_known_hosts,
        client_keys=list(settings.ssh_identity) or None,
        connect_timeout=settings.ssh_connect_timeout,
    )


def _runner_exit(e: Exception) -> int:
    """A deployment or file that does not exist is the operator's configuration (2); a host that
    does not answer, refuses us or fails a command is a failure (1)."""
    return USAGE if getattr(e, "kind", "") in ("missing-file", "missing-directory", "not-a-file") else FAILED


# -- subcommands ----------------------------------------------------------------------------------


def cmd_wizard(args: argparse.Namespace, out: TextIO) -> int:
    try:
        from cosmictui.app import main_wizard  # type: ignore[attr-defined]
    except ImportError as e:
        print(f"cosmictui: the setup wizard is not available in this build ({e}).", file=sys.stderr)
        print("The monitor and the headless commands work: see `cosmictui --help`.", file=sys.stderr)
        return FAILED
    rc = main_wizard(getattr(args, "deployment", None), args.demo, getattr(args, "config", None))
    return int(rc or 0)


def monitor_targets(args: argparse.Namespace, settings: Any) -> list[Any]:
    """--storage/--metrics as given; neither: the configured storage if a relay runs there,
    else the configured metrics address."""
    from cosmictui.ops.metrics.client import Target, normalize_url, unique_targets
    from cosmictui.ops.relayproc import read_runtime

    targets: list[Target] = [Target(storage=Path(s).expanduser().absolute()) for s in args.storage]
    for url in args.metrics:
        try:
            normalize_url(url)
        except ValueError as e:
            raise UsageError(f"--metrics {url}: {e}") from None
        targets.append(Target(metrics=url))
    for key in getattr(args, "relay_key", None) or []:
        from cosmictui.ops.metrics.probe import ProbeUsageError, parse_relay_key

        try:
            parse_relay_key(key)
        except ProbeUsageError as e:
            raise UsageError(f"--relay-key: {e}") from None
        targets.append(Target(relay_key=key))
    if not targets:
        storage = Path(settings.relay_storage).expanduser().absolute()
        if read_runtime(str(storage)) is not None or settings.metrics_url is None:
            targets.append(Target(storage=storage))
        else:
            targets.append(Target(metrics=settings.metrics_url))
    return unique_targets(targets)


def cmd_monitor(args: argparse.Namespace, out: TextIO) -> int:
    settings = _settings(args)
    targets = monitor_targets(args, settings)
    from cosmictui.monitor_app import MonitorApp

    # the probes join the DHT the configured relay joins, unless told otherwise
    bootstrap = list(getattr(settings, "relay_bootstrap", ()) or ()) or None
    if args.bootstrap:
        from cosmictui.ops.metrics.probe import ProbeUsageError, parse_bootstrap

        try:
            bootstrap = parse_bootstrap([b.strip() for b in args.bootstrap.split(",") if b.strip()])
        except ProbeUsageError as e:
            raise UsageError(f"--bootstrap: {e}") from None
    app = MonitorApp(
        targets,
        interval=args.interval,
        scrape_timeout=args.timeout,
        bootstrap=bootstrap,
        probe_interval=args.probe_interval,
    )
    app.run()
    # a crash inside the app (Textual prints the traceback) must not look like success to scripts
    return FAILED if app.return_code else OK


STATUS_WORD = {"ok": "[ OK ]", "warn": "[WARN]", "fail": "[FAIL]"}


def cmd_check(args: argparse.Namespace, out: TextIO) -> int:
    overrides: dict[str, Any] = {}
    if args.storage:
        overrides["relay_storage"] = args.storage
    if args.port is not None:
        overrides["relay_port"] = args.port
    settings = _settings(args, **overrides)
    from cosmictui.ops.setup.checks import run_checks
    from cosmictui.ops.setup.steps import gather_checks

    async def go() -> list[Any]:
        if getattr(args, "deployment", None) is None and settings.deployment == ".":
            return await run_checks(settings, None)  # no deployment: the local checks only
        opened: list[Any] = []

        async def connect() -> Any:
            runner = await _open_runner(settings)
            opened.append(runner)
            return runner

        # the wizard's own step 1: local checks always, the unreachable host as one more failed
        # check ("Deployment host reachable"), relay-from-host a warning until the relay runs
        try:
            return await gather_checks(settings, connect)
        finally:
            for runner in opened:
                await runner.close()

    from cosmictui.ops.metrics.probe import ProbeUsageError, parse_relay_key, probe_check, run_probe

    if args.relay_key:
        try:
            parse_relay_key(args.relay_key)  # a typo is a usage error before any check runs
        except ProbeUsageError as e:
            raise UsageError(f"--relay-key: {e}") from None

    async def probe() -> list[Any]:
        """With a relay key known: two peers must meet through it (`relay probe`)."""
        from cosmictui.ops.relayproc import attach

        rt = attach(settings.relay_storage)
        key = args.relay_key or (rt.key if rt is not None else None)
        if not key or args.no_probe:
            return []
        try:
            return [probe_check(await run_probe(key, list(settings.relay_bootstrap) or None, 20.0))]
        except ProbeUsageError as e:
            raise UsageError(f"--relay-key: {e}") from None

    results = asyncio.run(go())
    results += asyncio.run(probe())
    if args.json:
        _dump([{"name": r.name, "status": r.status, "detail": r.detail, "fix": r.fix} for r in results], out)
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


def cmd_env_set_relay(args: argparse.Namespace, out: TextIO) -> int:
    settings = _settings(args)
    from cosmictui.ops.runner import RunnerError
    from cosmictui.ops.setup.envapply import apply_plan
    from cosmictui.ops.setup.envfile import EnvChanged, EnvFileError, decode_text, normalize_key, plan_relays

    try:
        key = normalize_key(args.key)
    except ValueError as e:
        raise UsageError(f"KEY: {e}") from None
    env_path = args.env or settings.env_path

    async def go() -> int:
        try:
            runner = await _open_runner(settings)
        except RunnerError as e:
            return _fail(args, out, "env", e.what, _runner_exit(e), e.fix)
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
                _dump(report, out)
                return OK
            if not plan.changed:
                out.write(f"{path}: {settings.env_var} already holds {key}; nothing to change\n")
                return OK
            if plan.bom and not args.json:
                out.write(f"note: {path} starts with a UTF-8 byte order mark (BOM); it is kept as it was\n")
            if not args.json:
                out.write(plan.diff if plan.diff.endswith("\n") else plan.diff + "\n")
            if args.dry_run:
                out.write(f"dry run: {path} not written\n")
                return OK
            applied = await apply_plan(runner, path, plan, settings.env_var, key)  # with its read-back
            backup = applied.backup
            if problem := applied.problem():
                return _fail(args, out, "env", problem, FAILED)
            if args.json:
                _dump(report | {"written": True, "backup": backup, "read_back": list(applied.keys)}, out)
                return OK
            out.write(f"wrote {path}" + (f" (backup {backup})" if backup else "") + "\n")
            out.write("next: apply the config and restart the worker (the wizard's step 4)\n")
            return OK
        except EnvChanged as e:  # another writer, not the operator's mistake: nothing written, exit 1
            return _fail(args, out, "env", f"{e.path}: {e.problem}", FAILED, e.fix)
        except EnvFileError as e:
            raise UsageError(str(e)) from None
        except RunnerError as e:
            return _fail(args, out, "env", e.what, _runner_exit(e), e.fix)
        finally:
            await runner.close()

    return asyncio.run(go())


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
    settings = _settings(args)
    from cosmictui.ops.jobs.evidence import name_case, new_job_left_creating, new_jobs, relay_evidence
    from cosmictui.ops.jobs.listing import list_jobs
    from cosmictui.ops.progress import load_progress
    from cosmictui.ops.relayproc import attach
    from cosmictui.ops.runner import RunnerError

    interval = args.interval or settings.poll_interval
    restart_at = worker_restart_time(settings.deployment)
    baseline = load_progress(settings.deployment).data.get("relay_at_restart")
    runtime = attach(settings.relay_storage)
    metrics = runtime.metrics if runtime is not None and runtime.metrics else settings.metrics_url
    if metrics and "://" not in metrics:
        metrics = f"http://{metrics}"

    async def once(runner: Any) -> tuple[int, Any]:
        # The same use case (and error wording) as the wizard's steps 5 and 6.
        listing = await list_jobs(runner.run, settings, datetime.now(UTC), restart_at)
        if not listing.ok:
            return FAILED, {"error": listing.error, "output": listing.raw or ""}
        evidence = await relay_evidence(metrics, baseline if isinstance(baseline, dict) else None, restart_at)
        if restart_at is None:
            kind = "unknown"
            case = "No worker restart is recorded (the wizard's step 4 records it): which jobs are new is not known."
        else:
            left = new_job_left_creating(listing.views, restart_at, settings.statuses)
            kind, case = name_case(left, evidence, new_job=bool(new_jobs(listing.views, restart_at)))
        return OK, (listing.views, evidence, kind, case)

    def show(rc: int, res: Any) -> None:
        if rc != OK:
            if args.json:
                _dump(res, out, stream=args.watch)
            else:
                print(f"cosmictui jobs: {res['error']}\n{res['output']}", file=sys.stderr)
            return
        views, evidence, kind, case = res
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
            doc = {"at": datetime.now(UTC), "jobs": payload, "relay": evidence.as_json(), "case": kind, "verdict": case}
            _dump(doc, out, stream=args.watch)
        else:
            if args.watch:
                out.write(f"-- {datetime.now().strftime('%H:%M:%S')} --\n")
            out.write(_jobs_table(views))
            out.write(f"{evidence.line()}\n{case}\n")
        out.flush()

    async def go() -> int:
        try:
            runner = await _open_runner(settings)
        except RunnerError as e:
            return _fail(args, out, "jobs", e.what, _runner_exit(e), e.fix)
        try:
            n = 0
            while True:
                try:
                    rc, res = await once(runner)
                except RunnerError as e:
                    rc, res = FAILED, {"error": str(e), "output": ""}
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
    settings = _settings(args)
    from cosmictui.ops.jobs.listing import list_jobs
    from cosmictui.ops.jobs.recover import RecoveryRefused, draft_create, plan_jobs, recover, recovery_dir, save_record
    from cosmictui.ops.runner import RunnerError

    name = "jobs recover"
    if args.create_command is not None and not args.create_command.strip():
        raise UsageError("--create-command is empty")
    relay_down = _recover_relay_problem(settings)
    if relay_down and args.yes and not args.no_relay_check:
        return _fail(
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
            runner = await _open_runner(settings)
        except RunnerError as e:
            return _fail(args, out, name, e.what + " Nothing deleted.", _runner_exit(e), e.fix)
        try:
            listing = await list_jobs(runner.run, settings, datetime.now(UTC))
            if not listing.ok:
                raw = f"\n{listing.raw}" if listing.raw else ""
                return _fail(args, out, name, f"{listing.error} Nothing deleted.{raw}", FAILED)
            try:
                plans = plan_jobs(listing.jobs, args.ids, settings, args.create_command, args.delete_only)
            except RecoveryRefused as e:
                return _fail(args, out, name, e.what, FAILED if e.kind == "unknown-job" else USAGE, e.fix)
            folder = recovery_dir(settings.deployment)
            doc: dict[str, Any] = {"jobs": [plan_doc(p) for p in plans], "record_dir": folder, "confirmed": args.yes}
            doc |= {"results": [], "error": None, "fix": None, "relay_problem": relay_down}
            if not args.yes:
                if args.json:
                    _dump(doc | {"exit_code": NOT_CONFIRMED}, out)
                else:
                    show_plan(plans, folder)
                    out.write("not confirmed: nothing saved or deleted; run again with --yes to do it\n")
                return NOT_CONFIRMED
            rc = OK
            for plan in plans:
                try:  # the record first: without it on disk, nothing is deleted
                    record = save_record(plan, settings, draft_create(plan.job, settings))
                except OSError as e:
                    doc["error"] = f"could not save job {plan.job.id}'s record in {folder}: {e}; job not deleted"
                    doc["fix"] = "make the state directory writable (XDG_STATE_HOME), then run again"
                    rc = FAILED
                    break
                if not args.json:
                    out.write(f"saved job {plan.job.id} (every field, recreate command) to {record}\n")
                    out.flush()
                result = await recover(runner.run, plan, record)
                doc["results"].append(
                    {
                        "id": result.job_id,
                        "outcome": result.outcome,
                        "message": result.message,
                        "record": result.record,
                        "command": result.command,
                        "output": result.output,
                    }
                )
                if result.outcome in ("delete-failed", "create-failed"):
                    doc["error"] = result.message + " Stopped here."
                    if result.output.strip():
                        doc["fix"] = f"the command printed: {result.output.strip()[-500:]}"
                    rc = FAILED
                    break
                if not args.json:
                    out.write(result.message + "\n")
            if rc == OK and not args.json and any(r["outcome"] == "recreated" for r in doc["results"]):
                out.write("watch the recreated job(s) leave Creating: cosmictui jobs --watch\n")
            if args.json:
                _dump(doc | {"exit_code": rc}, out)
            elif doc["error"]:
                fix = f"\n  {doc['fix']}" if doc["fix"] else ""
                print(f"cosmictui {name}: {doc['error']}{fix}", file=sys.stderr)
            return rc
        finally:
            await runner.close()

    try:
        return asyncio.run(go())
    except KeyboardInterrupt:  # maybe between a delete and its create: say where the records are
        folder = recovery_dir(settings.deployment)
        return _fail(
            args,
            out,
            name,
            f"interrupted: a job may be deleted and not recreated; every job's record is in {folder}",
            FAILED,
            "check with `cosmictui jobs` and recreate any missing job with its record's recreate_command",
        )


def relay_status_report(storage: str | None, metrics: str | None, timeout: float = 3.0) -> dict[str, Any]:
    """What `relay status` prints: runtime file, process liveness, /stats, and a verdict."""
    from cosmictui.ops import relayproc
    from cosmictui.ops.metrics.client import BadData, MetricsError, fetch

    report: dict[str, Any] = {"state": "not running", "storage": storage, "runtime": None, "stats": None}
    report |= {"metrics": metrics, "error": None, "fix": None, "key": None}
    if storage is not None:
        st = relayproc.relay_status(storage)
        report["storage"] = st.storage
        report["log"] = st.log_path
        report["runtime"] = _plain(st.runtime) if st.runtime else None
        report["key"] = st.runtime.key if st.runtime else None
        if st.runtime is None:
            report["error"] = f"no relay is running with storage {st.storage}"
            report["fix"] = f"start it: blind-relay --storage {st.storage}"
        elif not st.running or st.stale_runtime:
            report["error"] = f"pid {st.runtime.pid} from {relayproc.RUNTIME_FILE} is gone"
            report["fix"] = f"start it again: blind-relay --storage {st.storage} (and see its log {st.log_path})"
        elif metrics is None:
            metrics = st.runtime.metrics
            report["metrics"] = metrics
            if metrics is None:
                report["state"] = "up"
                report["error"] = "running with metrics off: no /stats to read"
                return report
        if report["error"] is not None and metrics is None:
            return report
    if metrics is None:
        report["error"] = report["error"] or "no metrics address"
        return report
    try:
        s = fetch(metrics, timeout=timeout)
    except BadData as e:  # it answers, with numbers no relay has: nothing of it is shown
        report["state"] = "bad data"
        report["error"], report["fix"], report["bad_field"] = e.reason, e.fix, e.field
        return report
    except MetricsError as e:
        report["state"] = "down"
        report["error"], report["fix"] = e.reason, e.fix or None
        return report
    report["state"] = "up"
    report["error"] = None
    report["stats"] = s.stats
    if isinstance(s.stat("key"), str):
        report["key"] = s.stat("key")
    report["rss_bytes"] = s.rss_bytes
    return report


def cmd_relay_status(args: argparse.Namespace, out: TextIO) -> int:
    from cosmictui.ops.metrics.client import by_cause, human_bytes, human_duration

    settings = _settings(args)
    storage = args.storage if args.storage is not None else (None if args.metrics else settings.relay_storage)
    rep = relay_status_report(storage, args.metrics, timeout=args.timeout)
    if args.json:
        _dump(rep, out)
        return OK if rep["state"] == "up" else FAILED
    badge = {"up": "▲ UP", "down": "✖ DOWN", "not running": "■ NOT RUNNING", "bad data": "✖ BAD DATA"}[rep["state"]]
    stats = rep["stats"] or {}
    rt = rep["runtime"] or {}
    key = stats.get("key") or rt.get("key") or "–"
    out.write(f"relay    {badge}   key {key}\n")
    if rep.get("storage"):
        out.write(f"storage  {rep['storage']}\n")
    if rt:
        out.write(f"process  pid {rt.get('pid')}  udp {rt.get('host')}:{rt.get('port')}  version {rt.get('version')}\n")
    if rep.get("metrics"):
        out.write(f"metrics  {rep['metrics']}\n")
    if stats:
        sessions, pairings, streams = stats.get("sessions", {}), stats.get("pairings", {}), stats.get("streams", {})
        out.write(f"uptime   {human_duration(stats.get('uptime_seconds'))}   rss {human_bytes(rep.get('rss_bytes'))}\n")
        out.write(
            f"sessions {sessions.get('opened', 0) - sessions.get('closed', 0)} open   "
            f"pairings {pairings.get('active', 0)} active, {pairings.get('pending', 0)} pending, "
            f"{pairings.get('matched', 0)} matched   stream errors {streams.get('errors', 0)}\n"
        )
        dht = stats.get("dht", {})
        pub = f"{dht.get('public_host')}:{dht.get('public_port')}" if dht.get("public_host") else "unknown"
        ann = dht.get("last_announce")
        ago = f"{human_duration(time.time() - ann)} ago" if isinstance(ann, int | float) else "never"
        joined = dht.get("bootstrapped")
        out.write(
            f"dht      bootstrapped {'yes' if joined else 'NO'}   "
            f"firewalled {'YES' if dht.get('firewalled') else 'no'}   public {pub}   last announce {ago}\n"
        )
        if joined is False:
            out.write("         not joined to the DHT yet — retrying\n")
        for block in ("dropped", "shed"):
            if block in stats:
                out.write(f"{block:<8} {by_cause(stats[block], top=8)}\n")
    if rep["error"]:
        out.write(f"note     {rep['error']}\n")
    if rep.get("fix"):
        out.write(f"next     {rep['fix']}\n")
    return OK if rep["state"] == "up" else FAILED


def probe_key(key: str | None, storage: str | None, *, explicit_storage: bool = False) -> str:
    """KEY as given, else the relay running on (or the key held by) the storage; with no
    --storage given, the one relay running on this machine if there is exactly one."""
    if key:
        return key
    from cosmictui.ops import relayproc

    if storage:
        found = relayproc.read_key(storage) or relayproc.storage_key(storage)
        if found:
            return found
    if not explicit_storage:
        running = relayproc.running_relays()
        if len(running) == 1:
            return running[0].key
    where = f"storage {storage}" if storage else "the configured storage"
    raise UsageError(f"no KEY given and no relay key in {where}; pass the relay's key")


def cmd_relay_probe(args: argparse.Namespace, out: TextIO) -> int:
    from cosmictui.ops.metrics.probe import ProbeUsageError, run_probe

    settings = _settings(args)
    storage = args.storage if args.storage is not None else settings.relay_storage
    key = probe_key(args.key, storage, explicit_storage=args.storage is not None)
    boot = [b.strip() for b in args.bootstrap.split(",") if b.strip()] if args.bootstrap else None
    if args.watch:
        return _relay_probe_watch(args, out, key, boot or list(settings.relay_bootstrap) or None)
    try:
        res = asyncio.run(run_probe(key, boot or list(settings.relay_bootstrap) or None, args.timeout))
    except ProbeUsageError as e:
        raise UsageError(str(e)) from None
    if args.json:
        _dump(res.as_dict(), out)
        return OK if res.ok else FAILED
    out.write(f"probe    relay {res.relay_key}\n")
    for st in res.stages:
        mark = "✔" if st.ok else "✖"
        out.write(f"  {mark} {st.name:<26} {st.seconds:7.2f} s  {st.detail}\n")
    if res.ok:
        out.write(f"result   ✔ relayed echo through {res.relay_address}, round trip {res.rtt_ms} ms\n")
        return OK
    out.write(f"result   ✖ failed at {res.error} (after {res.seconds:.1f} s)\n")
    return FAILED


def _relay_probe_watch(args: argparse.Namespace, out: TextIO, key: str, boot: list[str] | None) -> int:
    """`relay probe --watch`: one line (NDJSON with --json) per echo through the relay."""
    from cosmictui.ops.metrics.probe import ProbeUsageError, watch_probe

    last_ok = False

    async def go() -> None:
        nonlocal last_ok
        async for p in watch_probe(key, boot, args.interval, args.timeout, args.count):
            last_ok = p.ok
            if args.json:
                _dump(p, out, stream=True)
            else:
                when = datetime.fromtimestamp(p.at).strftime("%H:%M:%S")
                rtt = f"round trip {p.rtt_ms:7.2f} ms" if p.rtt_ms is not None else "no echo          "
                out.write(f"{when}  {'✔' if p.ok else '✖'} {rtt}  via {p.relay_address or '–'}  {p.detail}\n")
            out.flush()

    try:
        asyncio.run(go())
    except ProbeUsageError as e:
        raise UsageError(str(e)) from None
    except KeyboardInterrupt:
        return OK
    return OK if last_ok else FAILED


# -- main -----------------------------------------------------------------------------------------


def main(argv: list[str] | None = None, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except _ParseError as e:
        e.parser.print_usage(sys.stderr)
        print(f"{e.parser.prog}: error: {e}", file=sys.stderr)
        if "--json" in (sys.argv[1:] if argv is None else argv):
            _dump({"error": str(e), "fix": f"see `{e.parser.prog} --help`", "exit_code": USAGE}, out)
        raise SystemExit(USAGE) from None  # as argparse itself does: callers and tests expect it
    handlers = {
        None: cmd_wizard,
        "monitor": cmd_monitor,
        "check": cmd_check,
        "jobs": cmd_jobs,
    }
    try:
        if args.command == "env":
            return cmd_env_set_relay(args, out)
        if args.command == "relay":
            if args.relay_command == "probe":
                return cmd_relay_probe(args, out)
            return cmd_relay_status(args, out)
        return handlers[args.command](args, out)
    except UsageError as e:
        print(f"cosmictui: {e}", file=sys.stderr)
        if getattr(args, "json", False):
            _dump({"error": str(e), "fix": None, "exit_code": USAGE}, out)
        return USAGE
    except NotImplementedError:
        print(f"cosmictui {args.command}: not available in this build yet", file=sys.stderr)
        return FAILED
