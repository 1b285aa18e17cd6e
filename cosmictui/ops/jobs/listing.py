"""Listing jobs: one use case for the wizard's steps and `cosmictui jobs`, with one wording.

Runs the configured list command, parses it (`parse_jobs`), and turns every way it can go
wrong into one sentence an operator can act on. The caller passes how to run a command, so
the wizard's logged runner and the CLI's plain one share it.
"""

from __future__ import annotations

import shlex
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime

from cosmictui.ops.config import Settings
from cosmictui.ops.jobs.model import Job, JobsFormatError, JobView, parse_jobs, view_jobs
from cosmictui.ops.runner import CommandResult, RunnerError

RunCommand = Callable[[str], Awaitable[CommandResult]]


def runner_problem(e: Exception, doing: str) -> str:
    """A RunnerError (or any I/O error) as sentences an operator can act on."""
    from cosmictui.ops.wording import sentences

    what = getattr(e, "what", None) or str(e)
    host = getattr(e, "host", None)
    fix = getattr(e, "fix", "")
    where = f" on {host}" if host else ""
    return sentences(f"Could not {doing}{where}: {what.rstrip('.')}", f"Fix: {fix}" if fix else None)


@dataclass(frozen=True)
class JobListing:
    """One run of the list command: the jobs, or why there are none to show."""

    cmd: str
    jobs: list[Job] = field(default_factory=list)
    views: list[JobView] = field(default_factory=list)
    error: str | None = None
    #: What the command printed when it could not be read (shown so the operator sees why).
    raw: str | None = None
    exit_code: int | None = None
    runner_error: RunnerError | None = None
    #: How to fix what went wrong (a config key or command to change), "" when listed.
    fix: str = ""

    @property
    def ok(self) -> bool:
        return self.error is None


async def list_jobs(
    run: RunCommand, settings: Settings, now: datetime, restart_at: datetime | None = None
) -> JobListing:
    """Run `[commands] list` through `run` and read its output; never raises for a bad answer."""
    from cosmictui.ops.wording import command_failure_hint

    cmd = settings.list_command
    try:
        result = await run(cmd)
    except RunnerError as e:
        return JobListing(cmd, error=runner_problem(e, "list the jobs"), runner_error=e, fix=e.fix)
    if result.exit_code != 0:
        hint = command_failure_hint(cmd, result.exit_code, result.output)
        return JobListing(
            cmd,
            error=f"{cmd} exited {result.exit_code}. {hint}",
            raw=result.output,
            exit_code=result.exit_code,
            fix=f"{hint} The list command is [commands] list in the config.",
        )
    try:
        jobs = parse_jobs(result.output, now)
    except JobsFormatError as e:
        prog = (shlex.split(cmd) or [cmd])[0]
        return JobListing(
            cmd,
            error=f"Cannot read the jobs list ({e.reason}). If `{prog}` can print JSON, set [commands] list in "
            "the config to that command.",
            raw=e.raw,
            exit_code=0,
            fix=f"set [commands] list in the config to a command that prints the jobs as JSON ({prog} ... --json)",
        )
    views = view_jobs(jobs, now, restart_at, settings.stuck_after, settings.stale_after, settings.statuses)
    return JobListing(cmd, jobs, views, exit_code=0)
