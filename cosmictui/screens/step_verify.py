"""Step 5: watch the jobs list until a job created after the restart leaves Creating."""

from __future__ import annotations

from datetime import UTC, datetime

from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.timer import Timer
from textual.widgets import DataTable, Static
from textual.worker import Worker

from cosmictui.ops.jobs import Job, JobsFormatError, JobView, parse_jobs, view_jobs
from cosmictui.ops.runner import RunnerError
from cosmictui.ops.wizard_steps import JobWatch, command_failure_hint, format_age, job_command
from cosmictui.screens.confirm import ConfirmScreen
from cosmictui.screens.step import Step, runner_problem


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
            if v.job.id in new_ids:
                note = "NEW (after restart)"
            elif v.before_restart:
                note = "old: no relay key"
            else:
                note = ""
            if v.stuck:
                note = (note + " · " if note else "") + ("stale" if "no status update" in v.stuck else "stuck")
            self.add_row(v.job.id, v.job.status, format_age(v.age), note, key=v.job.id)
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
        Binding("j", "step('create_job')", "Create job"),
    )

    def __init__(self, ctx) -> None:  # type: ignore[no-untyped-def]
        super().__init__(ctx)
        self.timer: Timer | None = None
        self.job_watch: JobWatch | None = None
        self.polls = 0
        self._poll_worker: Worker[None] | None = None
        self.active = False

    def compose_step(self) -> ComposeResult:
        yield Static("5. Verify with a new job", classes="step-title")
        yield Static("", id="verify-intro", classes="step-intro")
        yield JobsTable(id="verify-jobs")
        yield Static("", id="verify-raw", markup=False)

    def _restart_dt(self) -> datetime | None:
        r = self.ctx.restarted_at
        return datetime.fromtimestamp(r, UTC) if r else None

    def on_enter(self) -> None:
        r = self._restart_dt()
        when = r.astimezone().strftime("%H:%M:%S") if r else "(not recorded: run step 4)"
        self.query_one("#verify-intro", Static).update(
            f"Worker restarted at [b]{when}[/b]; older jobs never get the key. [b]Create a new job now[/b] "
            f"(as usual, or j runs the create command). Refreshes every {self.ctx.settings.poll_interval:g} s."
        )
        if self.job_watch is None or self.job_watch.since != r:
            self.job_watch = JobWatch(r)  # first visit, or the worker was restarted again since
            if self.done:
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
        try:
            result = await self.ctx.run(self.ctx.settings.list_command)
        except RunnerError as e:
            self._stop_polling()
            self.status.set(runner_problem(e, "list the jobs") + " Press r to retry.", "error")
            return
        if result.exit_code != 0:
            self._stop_polling()
            hint = command_failure_hint(result.cmd, result.exit_code, result.output)
            self.status.set(f"{result.cmd} exited {result.exit_code}. {hint} Press r to retry.", "error")
            return
        now = self.ctx.now_dt()
        try:
            jobs = parse_jobs(result.output, now)
        except JobsFormatError as e:
            self._stop_polling()
            raw.update("Raw output:\n" + e.raw)
            raw.add_class("-shown")
            self.status.set(
                f"Cannot read the jobs list ({e.reason}). If your CLI has a JSON option, set "
                "[commands] list in the config to use it. Press r to retry.",
                "error",
            )
            return
        raw.remove_class("-shown")
        self.polls += 1
        assert self.job_watch is not None
        verdict = self.job_watch.observe(jobs)
        s = self.ctx.settings
        views = view_jobs(jobs, now, self._restart_dt(), s.stuck_after, s.stale_after)
        new_ids = {j.id for j in jobs if self.job_watch.is_new(j)}
        self.query_one(JobsTable).show(views, new_ids)
        kind = {"confirmed": "ok", "failed": "error", "left": "busy", "creating": "busy", "waiting": "info"}
        self.status.set(verdict.message, kind[verdict.state])
        if verdict.state == "confirmed" and not self.done:
            self.mark_done()
            self.ctx.save_progress(4)
            self.notify(verdict.message, title="The relay works")
        if self.timer is None and self.active:
            # A successful retry (r) after an error resumes the polling.
            self.timer = self.set_interval(self.ctx.settings.poll_interval, self.poll)

    def _stop_polling(self) -> None:
        if self.timer is not None:
            self.timer.stop()
            self.timer = None

    def action_create_job(self) -> None:
        template = self.ctx.settings.create_command
        job = self.query_one(JobsTable).highlighted_job()
        try:
            cmd = job_command(template, job) if job is not None else template.replace("{fields}", "").strip()
        except KeyError as e:
            self.status.set(str(e.args[0]), "error")
            return
        body = "Run on the deployment host" + (f" (fields copied from job {job.id}):" if job is not None else ":")

        def confirmed(ok: bool | None) -> None:
            if ok:
                self.create_job(cmd)

        self.app.push_screen(ConfirmScreen("Create a job", body, commands=[cmd], yes="Create"), confirmed)

    @work(exclusive=True, group="verify-create", exit_on_error=False)
    async def create_job(self, cmd: str) -> None:
        try:
            result = await self.ctx.run(cmd)
        except RunnerError as e:
            self.status.set(runner_problem(e, "create a job"), "error")
            return
        if result.exit_code != 0:
            hint = command_failure_hint(cmd, result.exit_code, result.output)
            self.status.set(f"{cmd} exited {result.exit_code}. {hint}", "error")
            return
        self.status.set("Job created; watching for it to leave Creating …", "busy")
        self.poll()

    def validate_step(self) -> str | None:
        if not self.done:
            return "No new job has left Creating yet: create a job (j) and wait for it to leave Creating."
        return None
