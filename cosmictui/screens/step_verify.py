"""Step 5: watch the jobs list until a job created after the restart leaves Creating."""

from __future__ import annotations

from datetime import UTC, datetime

from rich.markup import escape
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.timer import Timer
from textual.widgets import DataTable, Static
from textual.worker import Worker

from cosmictui.ops.jobs.evidence import RelayEvidence, name_case, relay_evidence
from cosmictui.ops.jobs.listing import list_jobs
from cosmictui.ops.jobs.model import Job, JobView, shown_status
from cosmictui.ops.runner import RunnerError
from cosmictui.ops.setup.steps import JobWatch, WatchVerdict, command_failure_hint, format_age
from cosmictui.screens.confirm import ConfirmScreen
from cosmictui.screens.step import Step, runner_problem

#: What to check when a new job left Creating but the relay saw no pairing (under the jobs table).
DIRECT_CHECK = (
    "What to check: the relays variable the worker runs with (did step 4 apply this .env?) and that "
    "the job got the key; or the job connected directly, as the relay saw no pairing since the restart."
)


class JobsTable(DataTable[str]):
    """Jobs with status, age and a note (before the restart, new, stuck) in words."""

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id, cursor_type="row", zebra_stripes=True)
        self.views: list[JobView] = []

    def on_mount(self) -> None:
        self.add_column("Job", key="id")
        self.add_column("Status", key="status")
        self.add_column("Age", key="age")
        self.add_column("Note", key="note")

    def show(self, views: list[JobView], new_ids: set[str]) -> None:
        keep = self.cursor_row
        self.views = views
        self.clear()
        for v in views:
            # Short words, so the Note column fits beside Job, Status and Age at 60 columns (the
            # table scrolls sideways only while it has the focus); the intro says what they mean.
            if v.job.id in new_ids:
                note = "NEW"
            elif v.before_restart:
                note = "no key"  # made before the restart (the intro says older jobs never get it)
            else:
                note = ""
            if v.stuck:
                note = (note + " · " if note else "") + ("stale" if "no status update" in v.stuck else "stuck")
            self.add_row(escape(v.job.id), escape(shown_status(v.job.status)), format_age(v.age), note, key=v.job.id)
        if views:
            self.move_cursor(row=min(keep, len(views) - 1))

    def highlighted_job(self) -> Job | None:
        if not self.views or self.cursor_row < 0 or self.cursor_row >= len(self.views):
            return None
        return self.views[self.cursor_row].job


class VerifyStep(Step):
    STEP_ID = "verify"
    TITLE = "Verify"
    STEP_BINDINGS = (
        Binding("r", "step('refresh')", "Refresh"),
        Binding("j", "step('create_job')", "Test job"),
    )

    def __init__(self, ctx) -> None:  # type: ignore[no-untyped-def]
        super().__init__(ctx)
        self.timer: Timer | None = None
        self.job_watch: JobWatch | None = None
        self.polls = 0
        self._poll_worker: Worker[None] | None = None
        self.active = False
        self.verdict: WatchVerdict | None = None
        self.evidence: RelayEvidence | None = None
        self.case = ""  # which case of the evidence (ops.jobs.evidence.name_case) the last list was

    def compose_step(self) -> ComposeResult:
        yield Static("5. Verify with a new job", classes="step-title")
        yield Static("", id="verify-intro", classes="step-intro")
        yield JobsTable(id="verify-jobs")
        yield Static("", id="verify-evidence", markup=False)
        yield Static("", id="verify-raw", markup=False)

    def _restart_dt(self) -> datetime | None:
        r = self.ctx.restarted_at
        return datetime.fromtimestamp(r, UTC) if r else None

    def has_action(self, name: str) -> bool:
        if name == "create_job":
            return bool(self.ctx.settings.test_job_command.strip())
        return super().has_action(name)

    def on_enter(self) -> None:
        r = self._restart_dt()
        when = r.astimezone().strftime("%H:%M:%S") if r else "(not recorded: run step 4)"
        how = (
            "j creates the small test job from [commands] test_job"
            if self.ctx.settings.test_job_command.strip()
            else "as you always do: web UI or CLI; the wizard watches for it"
        )
        self.query_one("#verify-intro", Static).update(
            f"Worker restarted at [b]{when}[/b]; older jobs never get the key. [b]Create a new job now[/b] "
            f"({escape(how)}). Refreshes every {self.ctx.settings.poll_interval:g} s."
        )
        if self.job_watch is None or self.job_watch.since != r:
            # first visit, or the worker was restarted again since; a tick from an earlier run
            # stands until the new watch says otherwise (it needs two lists to confirm again)
            restarted_again = self.job_watch is not None
            self.job_watch = JobWatch(r, statuses=self.ctx.settings.statuses)
            if self.done and restarted_again:
                self.mark_done(False)
        problem = self.ctx.relay_problem()
        if problem:
            # Watching would wait forever: no job leaves Creating without the relay.
            self.mark_done(False)
            self.status.set(problem, "error")
            return
        self.active = True
        if self.timer is None:
            self.timer = self.set_interval(self.ctx.settings.poll_interval, self.poll)
        self.poll()

    def on_leave(self) -> None:
        self.active = False
        if self.timer is not None:
            self.timer.stop()
            self.timer = None

    def action_refresh(self) -> None:
        self.poll()

    def poll(self) -> None:
        """Run `jobs list` once, unless a run is still going (a slow CLI must not be cancelled
        by the next tick over and over, or the list would never update)."""
        if self._poll_worker is not None and self._poll_worker.is_running:
            return
        self._poll_worker = self._poll_once()

    @work(group="verify-poll", exit_on_error=False)
    async def _poll_once(self) -> None:
        raw = self.query_one("#verify-raw", Static)
        now = self.ctx.now_dt()
        listing = await list_jobs(self.ctx.run, self.ctx.settings, now, self._restart_dt())
        if not listing.ok:
            self._stop_polling()
            if listing.raw is not None and listing.exit_code == 0:
                raw.update("Raw output:\n" + listing.raw)
                raw.add_class("-shown")
            if listing.runner_error is not None:
                self.ctx.drop_connection(listing.runner_error)
            self._withdraw_if_done()
            self.status.set(f"{listing.error} Press r to retry.", "error")
            return
        raw.remove_class("-shown")
        self.polls += 1
        assert self.job_watch is not None
        verdict = self.job_watch.observe(listing.jobs)
        self.verdict = verdict
        new_ids = {j.id for j in listing.jobs if self.job_watch.is_new(j)}
        self.query_one(JobsTable).show(listing.views, new_ids)
        self.evidence = await relay_evidence(
            self.ctx.relay_metrics_url(), self.ctx.progress.data.get("relay_at_restart"), self._restart_dt()
        )
        left = verdict.state == "confirmed"
        which, case = name_case(left, self.evidence, new_job=bool(new_ids))
        self.case = which
        # The status line carries the verdict; the evidence box adds only what it does not say.
        said_in_status = left or (which == "waiting" and not new_ids)
        if left and which == "direct":
            # the status line only names the verdict (short, so the NEW row stays in view at 60×20)
            shown = f"{self.evidence.line()}\n{DIRECT_CHECK}"
        elif said_in_status:
            shown = self.evidence.line()
        elif which == "unknown":
            shown = case  # "Cannot tell …: <why no numbers>" already says what "Relay: no numbers (…)" would
        else:
            shown = f"{self.evidence.line()}\n{case}"
        self.query_one("#verify-evidence", Static).update(shown)
        kind = {
            "confirmed": "ok",
            "failed": "error",
            "left": "busy",
            "creating": "busy",
            "waiting": "info",
            "unknown": "warn",
            "withdrawn": "warn",
        }
        # One verdict, one truth: the tick and "the relay works" need the job AND the relay's numbers.
        works = left and which == "relayed"
        if works:
            self.status.set(f"{verdict.message} The relay carried its connections: the relay works.", "ok")
            # No toast: it would cover this status line (the verdict) for seconds; the tick says it too.
        elif left and which == "direct":
            job = f"Job {verdict.job.id}" if verdict.job is not None else "A new job"
            self.status.set(
                f"{job} left Creating, not through this relay (no pairing). What to check: below.",
                "warn",
            )
        elif left:  # the relay's numbers cannot be read
            self.status.set(f"{verdict.message} Whether the relay carried it is not known: {case}", "warn")
        else:
            self.status.set(verdict.message, kind[verdict.state])
        if works and not self.done:
            self.mark_done()
            self.ctx.save_progress(4)
        elif not works and verdict.state != "left":
            self._withdraw_if_done(verdict.message)
        if self.timer is None and self.active:
            # A successful retry (r) after an error resumes the polling.
            self.timer = self.set_interval(self.ctx.settings.poll_interval, self.poll)

    def mark_done(self, done: bool = True) -> None:
        """Done only with the relay's proof: Next past "cannot tell" (metrics unreadable) is no tick."""
        if done and self.case != "relayed":
            return
        super().mark_done(done)

    def _withdraw_if_done(self, why: str = "") -> None:
        """A verdict is only as good as the last list: take the tick back when it no longer holds."""
        if not self.done:
            return
        self.mark_done(False)
        self.ctx.uncomplete("verify")
        if why:
            self.notify(why, title="Verdict withdrawn", severity="warning")

    def _stop_polling(self) -> None:
        if self.timer is not None:
            self.timer.stop()
            self.timer = None

    def action_create_job(self) -> None:
        cmd = self.ctx.settings.test_job_command.strip()
        if not cmd:
            self.status.set(
                "No test job is configured ([commands] test_job): create a small job yourself; the wizard "
                "watches for it.",
                "info",
            )
            return
        self.app.push_screen(
            ConfirmScreen(
                "Create a test job", "Run on the deployment host ([commands] test_job):", commands=[cmd], yes="Create"
            ),
            lambda ok: self._create_confirmed(cmd, ok),
        )

    def _create_confirmed(self, cmd: str, ok: bool | None) -> None:
        if ok:
            self.create_job(cmd)
        else:  # Enter on the focused Cancel, esc or n: say so, or j seemed to do nothing
            self.status.set("No test job created. Press j again (y in the dialog creates it).", "info")

    @work(exclusive=True, group="verify-create", exit_on_error=False)
    async def create_job(self, cmd: str) -> None:
        try:
            result = await self.ctx.run(cmd)
        except RunnerError as e:
            self.ctx.drop_connection(e)
            self.status.set(runner_problem(e, "create a job"), "error")
            return
        if result.exit_code != 0:
            hint = command_failure_hint(cmd, result.exit_code, result.output)
            self.status.set(f"{cmd} exited {result.exit_code}. {hint}", "error")
            return
        self.status.set("Test job created; watching for it to leave Creating …", "busy")
        self.poll()

    def validate_step(self) -> str | None:
        if not self.done and self.case == "unknown" and self.verdict is not None and self.verdict.state == "confirmed":
            return None  # a job left Creating; the relay's numbers cannot be read (said in the status)
        if not self.done and self.case == "direct":
            return (
                "A new job left Creating, but the relay saw no pairing: it did not go through this relay. "
                "Check the relays variable the worker runs with, then watch a new job."
            )
        if not self.done:
            how = (
                "press j for a test job, or create one yourself"
                if self.has_action("create_job")
                else ("create one (web UI or CLI)")
            )
            return f"No new job has left Creating yet: {how} and wait for it to leave Creating."
        return None
