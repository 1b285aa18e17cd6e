"""Decisions the wizard's steps make that are not drawing: failure hints, the new-job watch,
and how a deleted job is recreated. Kept here, UI-free, so they are tested without Textual.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Literal

from cosmictui.ops.config import Settings
from cosmictui.ops.jobs.model import FAILED_STATUSES, STUCK_STATUSES, Job, JobView, StatusSets, format_age
from cosmictui.ops.relayproc import RelayRuntime, attach
from cosmictui.ops.runner import Runner, RunnerError
from cosmictui.ops.setup.checks import (
    CheckResult,
    check_dht,
    check_relay_from_deployment,
    fetch_stats,
    ping_command,
    relay_address,
    run_checks,
)
from cosmictui.ops.wording import command_failure_hint, sentence, sentences

__all__ = [
    "FAILED_STATUSES",
    "STUCK_STATUSES",
    "JobWatch",
    "command_failure_hint",
    "format_age",
    "recoverable",
    "sentence",
    "sentences",
]
RELAY_REACH_PREFIX = "Relay answers from"


_PING_PREFIX = ping_command("", 0).rsplit(" ", 3)[0]  # the program, without host, port and timeout


def is_ping_command(cmd: str) -> bool:
    """Whether `cmd` is the reachability PING that `check_relay_from_deployment` runs."""
    return cmd.startswith(_PING_PREFIX)


async def gather_checks(
    settings: Settings, connect: Callable[[], Awaitable[Runner]], storage: str | None = None
) -> list[CheckResult]:
    """All prerequisite checks; a deployment host we cannot reach is a failed check, not an error.

    Before step 2 the relay does not run yet, so "the relay answers from the deployment host"
    cannot pass; it is shown as a warning then and checked for real once the relay runs.
    """
    if storage:
        settings = replace(settings, relay_storage=storage)
    unreachable: CheckResult | None = None
    runner: Runner | None
    relay_runs = attach(settings.relay_storage) is not None
    try:
        runner = await connect()
    except RunnerError as e:
        runner = None
        unreachable = CheckResult("Deployment host reachable", "fail", f"{e.host}: {e.what}", e.fix)
    expecting = getattr(runner, "expecting", None)
    if not relay_runs and expecting is not None:
        # The PING cannot be answered yet: its exit 1 is expected, not a failure to alarm anyone.
        runner = expecting(is_ping_command, "the relay is not running yet")
    # Without a running relay the PING from the deployment host cannot be answered: don't wait long.
    results = await run_checks(settings, runner, ping_timeout=3.0 if relay_runs else 0.5)
    if unreachable is not None:
        results.append(unreachable)
    results = [_port_choosable(r) for r in results]
    if not relay_runs:
        results = [
            CheckResult(r.name, "warn", "not yet: the relay is not running (step 2 starts it and checks this)", "")
            if r.name.startswith(RELAY_REACH_PREFIX) and r.status == "fail"
            else r
            for r in results
        ]
    return results


def _port_choosable(r: CheckResult) -> CheckResult:
    """A UDP port another process holds (often another relay) is no dead end in step 1: step 2 has
    the port field. So it warns, naming the holder, instead of refusing Next."""
    if not r.name.startswith("UDP port ") or r.status != "fail" or "already in use" not in r.detail:
        return r
    return CheckResult(
        r.name,
        "warn",
        r.detail,
        "choose another port in step 2 (UDP port; [relay] port in the config) and open it in the firewall, "
        "or stop that process",
    )


async def relay_reach_checks(settings: Settings, runner: Runner, runtime: RelayRuntime) -> list[CheckResult]:
    """Once the relay runs: does it see the DHT, and does its UDP port answer from the deployment host."""
    url = runtime.metrics or settings.metrics_url
    stats = await fetch_stats(url) if url else None
    results = [check_dht(stats, runtime)]
    address = relay_address(settings, runner, stats)
    if address is None:
        results.append(
            CheckResult(
                f"{RELAY_REACH_PREFIX} {runner.label}",
                "warn",
                "the relay's address as seen from the deployment host is not known",
                "set [relay] address in the config (the relay host's IP or name)",
            )
        )
    else:
        results.append(await check_relay_from_deployment(runner, address, runtime.port))
    return results


@dataclass
class _Seen:
    kinds: list[str] = field(default_factory=list)  # StatusClass per snapshot, or "gone"
    statuses: list[str] = field(default_factory=list)
    updates: list[datetime | None] = field(default_factory=list)


WatchState = Literal["waiting", "creating", "unknown", "left", "confirmed", "failed", "withdrawn"]


@dataclass(frozen=True)
class WatchVerdict:
    state: WatchState
    job: Job | None
    message: str


class JobWatch:
    """Watches `jobs list` snapshots for a job made after `since` leaving Creating and updating.

    A job counts as new when its id is not in `exclude` (when given), else when its created time
    is after `since`, or (when the CLI prints no creation time) when its id was not in the first
    snapshot. It is confirmed while it is in a *done* status (`StatusSets`) in the last two
    snapshots and its status or update time moved meanwhile ("its status keeps updating" on the
    operator page); without update times, two snapshots in a done status do. An unknown or empty
    status never counts as having left Creating. The verdict is derived again from every
    snapshot: a confirmed job that goes back to Creating, disappears or fails withdraws it.
    """

    def __init__(self, since: datetime | None, exclude: set[str] | None = None, statuses: StatusSets | None = None):
        self.since = since
        self.baseline: set[str] | None = set(exclude) if exclude is not None else None
        self.by_id = exclude is not None
        self.statuses = statuses or StatusSets()
        self.seen: dict[str, _Seen] = {}
        self.confirmed: Job | None = None
        #: Why an earlier confirmation was taken back; said with every verdict until one holds again.
        self.withdrawn: str | None = None

    def is_new(self, job: Job) -> bool:
        if self.by_id:
            # The caller knows which jobs existed: creation times printed to the second cannot
            # tell a job made just now from one made a moment before, ids can.
            return self.baseline is not None and job.id not in self.baseline
        if self.baseline is not None and job.id in self.baseline:
            return False
        if job.created is not None and self.since is not None:
            return job.created > self.since
        return self.baseline is not None

    def _confirms(self, s: _Seen) -> bool:
        if len(s.kinds) < 2 or s.kinds[-1] != "done" or s.kinds[-2] != "done":
            return False
        ups, sts = s.updates[-2:], s.statuses[-2:]
        return all(u is None for u in ups) or ups[0] != ups[1] or sts[0] != sts[1]

    def observe(self, jobs: list[Job]) -> WatchVerdict:
        if self.baseline is None:
            # First snapshot: jobs without a creation time seen now are not new.
            self.baseline = {j.id for j in jobs if j.created is None or self.since is None}
        new = [j for j in jobs if self.is_new(j)]
        present = {j.id for j in new}
        for j in new:
            s = self.seen.setdefault(j.id, _Seen())
            s.kinds.append(self.statuses.classify(j.status))
            s.statuses.append(j.status.strip())
            s.updates.append(j.updated)
        for jid, s in self.seen.items():
            if jid not in present:
                s.kinds.append("gone")
                s.statuses.append("")
                s.updates.append(None)
        previous, self.confirmed = self.confirmed, None
        for j in new:
            # A confirmed job still in a done status holds: a list that shows it unchanged (two lists
            # within the second its update time is printed to, or a CLI that stamps only status
            # changes) is no evidence against it; going back, failing or vanishing is.
            held = previous is not None and j.id == previous.id and self.seen[j.id].kinds[-1] == "done"
            if held or self._confirms(self.seen[j.id]):
                self.confirmed = j
                self.withdrawn = None
                how = "keeps updating" if j.updated is not None else "stayed there in two lists in a row"
                return WatchVerdict("confirmed", j, f"Job {j.id} left Creating ({j.status}) and {how}.")
        if previous is not None:
            v = self._withdrawn(previous, next((j for j in new if j.id == previous.id), None))
            self.withdrawn = v.message.removesuffix(" Watching …")
            return v
        if not new:
            v = WatchVerdict("waiting", None, "No job created after the restart yet: create one now.")
            return self._noted(v)
        order = {"failed": 0, "left": 1, "unknown": 2, "creating": 3}
        best: WatchVerdict | None = None
        for j in new:
            v = self._verdict(j)
            if best is None or order[v.state] > order[best.state]:
                best = v
        assert best is not None
        return self._noted(best)

    def _noted(self, v: WatchVerdict) -> WatchVerdict:
        return replace(v, message=f"{self.withdrawn} {v.message}") if self.withdrawn else v

    def _verdict(self, j: Job) -> WatchVerdict:
        kind = self.seen[j.id].kinds[-1]
        if kind == "failed":
            return WatchVerdict("failed", j, f"Job {j.id} is {j.status}: it left Creating but failed.")
        if kind == "stuck":
            return WatchVerdict("creating", j, f"Job {j.id} is {j.status}; waiting for it to leave Creating …")
        if kind == "done":
            return WatchVerdict("left", j, f"Job {j.id} is {j.status}; checking that its status keeps updating …")
        printed = f"status {j.status!r}" if j.status.strip() else "no status"
        return WatchVerdict(
            "unknown",
            j,
            f"Job {j.id} has {printed}, which is not a known status, so it does not count as having left "
            "Creating. If it means the job runs, add it to [jobs] done_statuses in the config.",
        )

    def _withdrawn(self, was: Job, now: Job | None) -> WatchVerdict:
        if now is None:
            why = "is no longer in the jobs list"
        else:
            kind = self.seen[now.id].kinds[-1]
            why = {
                "stuck": f"went back to {now.status}",
                "failed": f"is {now.status} now",
                "unknown": f"now shows {('status ' + repr(now.status)) if now.status.strip() else 'no status'}",
            }.get(kind, f"is {now.status} now")
        return WatchVerdict(
            "withdrawn", now or was, f'Job {was.id} {why}: the earlier "left Creating" no longer holds. Watching …'
        )


def recoverable(views: list[JobView], statuses: StatusSets | None = None) -> list[JobView]:
    """Jobs worth deleting and recreating: stuck or stale, or still starting from before the
    restart (those never get the relay key, however young they are)."""
    sets = statuses or StatusSets()
    return [v for v in views if v.stuck or (v.before_restart and sets.classify(v.job.status) == "stuck")]
