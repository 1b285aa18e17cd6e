"""Step 5 as a use case: a new job leaves Creating, and the relay carried *its* connection.

One `VerifySession` per watch, driven the same way by the wizard's step 5 and by `cosmictui
verify`: `create_test_job()` runs `[commands] test_job` (or the operator creates a job, or
`--job ID` names one), `poll()` lists the jobs once and judges, `run()` polls until a verdict
settles or the time is up. Each yields events; the screen and the CLI only show them.

The verdict needs both halves: the job left Creating and keeps updating (`JobWatch`, from the
jobs list), and the relay's record holds the job's own pairing (`evidence.attribute`, the rule
written there). The window a pairing must open in starts when the job can first have existed:
the create command's start when this session created it, else the start of the last list that
did not show it (for a job already listed, `--job ID`, the time the list prints, less a minute:
lists print times to the second or the minute), and never before the last worker restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

from cosmictui.ops.config import Settings
from cosmictui.ops.jobs.evidence import Attribution, Window, attribute, clock
from cosmictui.ops.jobs.listing import JobListing, RunCommand, list_jobs, runner_problem
from cosmictui.ops.jobs.model import Job
from cosmictui.ops.metrics.client import MetricsError
from cosmictui.ops.metrics.pairings import PairingRecord, read_pairings
from cosmictui.ops.runner import RunnerError
from cosmictui.ops.setup.steps import JobWatch, WatchVerdict
from cosmictui.ops.wording import command_failure_hint

#: A job the wizard did not create: its window opens this long before the time the list prints.
LISTED_TIME_SLACK = 60.0

Level = Literal["ok", "warn", "error", "busy", "info"]
VerdictKind = Literal[
    "proven",
    "waiting",
    "creating",
    "left",
    "unknown-status",
    "failed",
    "withdrawn",
    "stale",
    "list-failed",
    "cannot-tell",
    "not-relayed",
    "probe-only",
    "older-only",
    "env-dropped",
]
#: Verdicts that more waiting does not change: `run(until_settled=True)` stops at them.
SETTLED = frozenset(
    {
        "proven",
        "failed",
        "stale",
        "list-failed",
        "cannot-tell",
        "not-relayed",
        "probe-only",
        "older-only",
        "env-dropped",
    }
)


@dataclass(frozen=True)
class VerifyVerdict:
    """One judgement after one jobs list: what the status line says, and why."""

    kind: VerdictKind
    message: str
    level: Level
    job: Job | None = None
    attribution: Attribution | None = None
    #: what to check, said under the evidence ("" when nothing is to be checked)
    check: str = ""
    window_opened_at: float | None = None

    @property
    def proven(self) -> bool:
        return self.kind == "proven"

    @property
    def lines(self) -> tuple[str, ...]:
        """The evidence under the verdict (what the status line says already is not said again)."""
        if self.attribution is None:
            return ()
        return tuple(line for line in self.attribution.lines if line not in self.message)

    def as_json(self) -> dict[str, Any]:
        return {
            "verdict": self.kind,
            "proven": self.proven,
            "message": self.message,
            "check": self.check or None,
            "job": None if self.job is None else {"id": self.job.id, "status": self.job.status},
            "window_opened_at": self.window_opened_at,
            "relay": self.attribution.as_json() if self.attribution is not None else None,
        }


@dataclass(frozen=True)
class JobsListed:
    """A jobs list was read: the screen shows it; `new_ids` are jobs that appeared during the watch."""

    listing: JobListing
    new_ids: frozenset[str]


@dataclass(frozen=True)
class TestJobCreated:
    __test__ = False  # a domain name, not a pytest class
    cmd: str
    output: str
    at: float


@dataclass(frozen=True)
class TestJobFailed:
    __test__ = False
    cmd: str
    message: str
    fix: str = ""


@dataclass(frozen=True)
class Judged:
    verdict: VerifyVerdict


VerifyEvent = JobsListed | TestJobCreated | TestJobFailed | Judged


@dataclass
class VerifyInputs:
    """What the verdict is judged from, read again at every poll (a restart or an .env change
    in between is seen at once)."""

    settings: Settings
    run: RunCommand
    relay_key: str | None
    metrics_url: Callable[[], str | None]
    restarted_at: Callable[[], float | None]
    probe_keys: Callable[[], frozenset[str]]
    env_keys: Callable[[], Awaitable[tuple[str, ...] | None]] | None = None
    #: from when jobs carry the relay key (the "no key" note on older jobs); default: the restart
    key_since: Callable[[], float | None] | None = None
    clock: Callable[[], float] = time.time
    read_record: Callable[[str], Awaitable[PairingRecord]] = read_pairings


@dataclass
class VerifyState:
    """What a watch remembers, saved across a quit so a resumed watch judges the same job."""

    #: ids the first list showed (jobs that existed before the watch began)
    baseline: list[str] | None = None
    #: job id -> the earliest it can have been created (see the module docstring)
    since: dict[str, float] = field(default_factory=dict)
    #: when this session's create command started (the test job), None if it ran none
    created_at: float | None = None
    #: the last list's start time (a job first seen in a later list was created after it)
    last_list_at: float | None = None
    #: --job ID: judge this job only
    job_id: str | None = None
    #: every id a list showed so far (a job is dated by the first list that shows it)
    known: list[str] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        return {
            "baseline": list(self.baseline or [])[:1000] if self.baseline is not None else None,
            "since": dict(list(self.since.items())[:100]),
            "created_at": self.created_at,
            "last_list_at": self.last_list_at,
            "job_id": self.job_id,
            "known": list(self.known)[-1000:],
        }

    @classmethod
    def from_json(cls, data: Any) -> VerifyState:
        """A saved state, or a fresh one when it is not one (a hand-edited progress file)."""
        if not isinstance(data, dict):
            return cls()

        def num(v: Any) -> float | None:
            return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None

        base = data.get("baseline")
        since = data.get("since")
        return cls(
            baseline=[str(i) for i in base if isinstance(i, str)] if isinstance(base, list) else None,
            since={str(k): float(v) for k, v in since.items() if num(v) is not None} if isinstance(since, dict) else {},
            created_at=num(data.get("created_at")),
            last_list_at=num(data.get("last_list_at")),
            job_id=data.get("job_id") if isinstance(data.get("job_id"), str) else None,
            known=[str(i) for i in data["known"] if isinstance(i, str)] if isinstance(data.get("known"), list) else [],
        )


class VerifySession:
    """One watch for a new job and its verdict (see the module docstring)."""

    def __init__(self, inputs: VerifyInputs, state: VerifyState | None = None) -> None:
        self.inputs = inputs
        self.state = state or VerifyState()
        self.watch: JobWatch | None = None
        self._watch_restart: float | None = None
        self.verdict: VerifyVerdict | None = None
        self.listing: JobListing | None = None
        self._poll_lock = asyncio.Lock()

    @property
    def polling(self) -> bool:
        """A list (and its verdict) is under way now; between polls the watch only waits."""
        return self._poll_lock.locked()

    # -- the test job -----------------------------------------------------------------------

    async def create_test_job(self) -> AsyncIterator[VerifyEvent]:
        """Run `[commands] test_job` on the deployment; the new job is then told apart by the list."""
        s = self.inputs.settings
        cmd = s.test_job_command.strip()
        if not cmd:
            yield TestJobFailed(
                "",
                "No test job is configured ([commands] test_job): create a small job yourself (web UI or CLI).",
                "set [commands] test_job in the config, or give --job ID of a job you created",
            )
            return
        if self.state.baseline is None:
            async for ev in self.poll():  # which jobs exist before the create: the new one is the one that is not
                yield ev
            if self.state.baseline is None:
                return  # the list failed (said by the poll's verdict): nothing created
        at = self.inputs.clock()
        try:
            result = await self.inputs.run(cmd)
        except RunnerError as e:
            yield TestJobFailed(cmd, runner_problem(e, "create the test job"), e.fix)
            return
        if result.exit_code != 0:
            hint = command_failure_hint(cmd, result.exit_code, result.output)
            yield TestJobFailed(cmd, f"{cmd} exited {result.exit_code}. {hint}", "[commands] test_job in the config")
            return
        self.state.created_at = at
        yield TestJobCreated(cmd, result.output, at)

    # -- one list, one verdict ----------------------------------------------------------------

    def _restart(self) -> float | None:
        return self.inputs.restarted_at()

    def _watch(self) -> JobWatch:
        restart = self._restart()
        if self.watch is None or self._watch_restart != restart:
            since = datetime.fromtimestamp(restart, UTC) if restart is not None else None
            self.watch = JobWatch(since, set(self.state.baseline or ()), self.inputs.settings.statuses)
            self._watch_restart = restart
        return self.watch

    async def poll(self) -> AsyncIterator[VerifyEvent]:
        """List the jobs once and judge; one poll at a time (a slow CLI is never overtaken)."""
        async with self._poll_lock:
            started = self.inputs.clock()
            key_since = self.inputs.key_since() if self.inputs.key_since is not None else self._restart()
            restart_dt = datetime.fromtimestamp(key_since, UTC) if key_since is not None else None
            listing = await list_jobs(
                self.inputs.run, self.inputs.settings, datetime.fromtimestamp(started, UTC), restart_dt
            )
            self.listing = listing
            if not listing.ok:
                v = VerifyVerdict("list-failed", listing.error or "The jobs list failed.", "error", check=listing.fix)
                self.verdict = v
                yield Judged(v)
                return
            if self.state.baseline is None:
                self.state.baseline = [] if self.state.job_id is not None else self._older(listing.jobs)
            known = set(self.state.known)
            for j in listing.jobs:
                if self.state.last_list_at is None:
                    break  # the first list: what it shows was there before (or dated by _older / the list)
                if j.id not in known and j.id not in self.state.since:
                    # first seen now: created after the last list that did not show it began
                    bound = self.state.last_list_at
                    if self.state.created_at is not None:
                        bound = max(bound, self.state.created_at)
                    self.state.since[j.id] = bound
            self.state.known = sorted(known | {j.id for j in listing.jobs})[-1000:]
            self.state.last_list_at = started
            watch = self._watch()
            jobs = listing.jobs if self.state.job_id is None else [j for j in listing.jobs if j.id == self.state.job_id]
            seen = watch.observe(jobs)
            new_ids = frozenset(j.id for j in jobs if watch.is_new(j))
            yield JobsListed(listing, new_ids)
            v = await self._judge(seen, jobs)
            self.verdict = v
            yield Judged(v)

    def _older(self, jobs: list[Job]) -> list[str]:
        """The first list's jobs that are not new: all but those it prints as created after the last
        restart (a job made between step 4 and step 5 is new; its window opens a minute before the
        time the list prints, and never before the restart)."""
        restart = self._restart()
        older = []
        for j in jobs:
            made = j.created.timestamp() if j.created is not None else None
            if restart is not None and made is not None and made > restart:
                self.state.since[j.id] = max(made - LISTED_TIME_SLACK, restart)
            else:
                older.append(j.id)
        return older

    def _job_since(self, job: Job) -> float | None:
        """The earliest `job` can have been created (module docstring), None when not known."""
        if job.id in self.state.since:
            return self.state.since[job.id]
        if job.created is not None:
            return job.created.timestamp() - LISTED_TIME_SLACK
        return None

    async def _judge(self, seen: WatchVerdict, jobs: list[Job]) -> VerifyVerdict:
        job = seen.job
        if self.state.job_id is not None and not jobs:
            return VerifyVerdict(
                "waiting",
                f"Job {self.state.job_id} is not in the jobs list ({self.inputs.settings.list_command}) yet.",
                "info",
            )
        if job is None:
            return VerifyVerdict("waiting", seen.message, "info")
        since = self._job_since(job)
        restart = self._restart()
        made = self.state.since.get(job.id, job.created.timestamp() if job.created is not None else None)
        if made is not None and restart is not None and restart > made:
            return VerifyVerdict(
                "stale",
                f"The worker restarted at {clock(restart)}, after job {job.id} was created: it is an older "
                "job now. Create a new test job.",
                "warn",
                job,
            )
        attribution = await self._attribute(job, since, restart)
        opened = attribution[1]
        a = attribution[0]
        if seen.state == "failed":
            return VerifyVerdict("failed", seen.message, "error", job, a, window_opened_at=opened)
        if seen.state == "withdrawn":
            return VerifyVerdict("withdrawn", seen.message, "warn", job, a, window_opened_at=opened)
        if seen.state in ("waiting", "creating", "left", "unknown"):
            kind: VerdictKind = {"creating": "creating", "left": "left", "unknown": "unknown-status"}.get(
                seen.state, "waiting"
            )  # type: ignore[assignment]
            level: Level = "warn" if seen.state == "unknown" else ("info" if seen.state == "waiting" else "busy")
            return VerifyVerdict(kind, seen.message, level, job, a, window_opened_at=opened)
        # confirmed: the job left Creating and keeps updating; now whose connection did the relay carry?
        if a is None:
            return VerifyVerdict(
                "cannot-tell",
                f"{seen.message} Cannot tell whether the relay carried it: the jobs list prints no creation time "
                f"for job {job.id} and the wizard did not create it.",
                "warn",
                job,
                check="verify with a test job the wizard creates (j in step 5, or `cosmictui verify` without --job)",
            )
        if a.proven:
            return VerifyVerdict(
                "proven",
                f"{seen.message} The relay carried its connection: the relay works.",
                "ok",
                job,
                a,
                window_opened_at=opened,
            )
        kind = a.kind  # type: ignore[assignment]
        return VerifyVerdict(
            kind,
            f"Job {job.id} left Creating, {a.short}." if a.short else f"{seen.message} {a.reason}",
            "warn",
            job,
            a,
            a.check,
            opened,
        )

    async def _attribute(
        self, job: Job, since: float | None, restart: float | None
    ) -> tuple[Attribution | None, float | None]:
        if since is None:
            return None, None
        opened = max(since, restart) if restart is not None else since
        # keys first seen before the restart are older jobs' (the job was made after it, or it is stale)
        window = Window(opened, opened, self.inputs.relay_key, self.inputs.probe_keys())
        url = self.inputs.metrics_url()
        record: PairingRecord | MetricsError | None = None
        if url:
            try:
                record = await self.inputs.read_record(url)
            except MetricsError as e:
                record = e
        env = await self.inputs.env_keys() if self.inputs.env_keys is not None else None
        return attribute(record, window, env), opened

    # -- the loop --------------------------------------------------------------------------------

    async def run(
        self,
        *,
        interval: float | None = None,
        timeout: float | None = None,
        until_settled: bool = False,
        wake: asyncio.Event | None = None,
    ) -> AsyncIterator[VerifyEvent]:
        """Poll every `interval` (the config's) until the verdict settles (`until_settled`), the
        time is up (`timeout`) or the caller stops iterating; `wake` set polls at once."""
        every = interval if interval is not None else self.inputs.settings.poll_interval
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            async for ev in self.poll():
                yield ev
            v = self.verdict
            if until_settled and v is not None and v.kind in SETTLED:
                return
            pause = every
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                pause = min(pause, left)
            if wake is None:
                await asyncio.sleep(pause)
            else:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(wake.wait(), pause)
                wake.clear()


async def one_list_verdict(inputs: VerifyInputs, jobs: list[Job]) -> tuple[str, str, Attribution | None]:
    """What one jobs list can say (`cosmictui jobs`): of the jobs listed as made after the last
    restart, the newest one that left Creating, and whether the relay's record holds its own
    pairing (its window: a minute before its printed time, never before the restart). One list
    cannot tell whether its status keeps updating: `verify --job ID` watches it."""
    restart = inputs.restarted_at()
    if restart is None:
        return (
            "unknown",
            "No worker restart is recorded (the wizard's step 4 or `cosmictui apply` records it): which jobs "
            "are new is not known.",
            None,
        )
    new = [j for j in jobs if j.created is not None and j.created.timestamp() > restart]
    if not new:
        return "waiting", "No job created after the restart yet: create one (or `cosmictui verify`).", None
    left = [j for j in new if inputs.settings.statuses.classify(j.status) == "done"]
    if not left:
        newest = max(new, key=lambda j: j.created or datetime.min.replace(tzinfo=UTC))
        return "creating", f"Job {newest.id} ({newest.status.strip() or 'no status'}) has not left Creating yet.", None
    job = max(left, key=lambda j: j.created or datetime.min.replace(tzinfo=UTC))
    session = VerifySession(inputs, VerifyState(job_id=job.id))
    assert job.created is not None
    a, _opened = await session._attribute(job, job.created.timestamp() - LISTED_TIME_SLACK, restart)
    assert a is not None
    watch = f"`cosmictui verify --job {job.id}` watches that its status keeps updating."
    if a.proven:
        return "proven", f"Job {job.id} is {job.status}, and the relay carried its own connection. {watch}", a
    if a.kind == "cannot-tell":
        return a.kind, f"Job {job.id} is {job.status}. {a.reason}", a
    return a.kind, f"Job {job.id} is {job.status}, {a.short}. {watch}", a
