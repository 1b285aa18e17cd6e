"""Step 5: create a test job (or watch for one) and show the verdict of `ops.jobs.verify`.

The screen holds no sequence: the use case lists, judges and decides; this step starts its loop
when entered, stops it when left, and draws each event (the jobs table, the status line, the
job's pairing under it).
"""

from __future__ import annotations

import asyncio
from datetime import datetime

from rich.cells import cell_len
from rich.markup import escape
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.widgets import DataTable, Static
from textual.worker import Worker

from cosmictui.ops.jobs.model import Job, JobView, shown_status
from cosmictui.ops.jobs.verify import (
    JobsListed,
    Judged,
    TestJobCreated,
    TestJobFailed,
    VerifyEvent,
    VerifySession,
    VerifyVerdict,
)
from cosmictui.ops.setup.steps import format_age
from cosmictui.screens.confirm import ConfirmScreen
from cosmictui.screens.step import Step


class JobsTable(DataTable[str]):
    """Jobs with status, age and a note (before the restart, new, stuck) in words."""

    COLUMNS = (("id", "Job"), ("status", "Status"), ("age", "Age"), ("note", "Note"))

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id, cursor_type="row", zebra_stripes=True)
        self.views: list[JobView] = []

    def on_mount(self) -> None:
        self._columns([])

    def _columns(self, rows: list[tuple[str, str, str, str]]) -> None:
        """Columns as wide as their widest cell, fixed when the rows are known: widths the table
        measured later, when idle, could leave the header drawn at its old widths."""
        self.clear(columns=True)
        for i, (key, label) in enumerate(self.COLUMNS):
            self.add_column(label, key=key, width=max([cell_len(label), *(cell_len(r[i]) for r in rows)]))

    def show(self, views: list[JobView], new_ids: set[str]) -> None:
        keep = self.cursor_row
        self.views = views
        rows: list[tuple[str, str, str, str]] = []
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
            rows.append((v.job.id, shown_status(v.job.status), format_age(v.age), note))
        self._columns(rows)
        for v, (job, shown, age, note) in zip(views, rows, strict=True):
            self.add_row(escape(job), escape(shown), age, note, key=v.job.id)
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
        self.session: VerifySession | None = None
        self._session_for: tuple[str | None, float | None] | None = None
        self.polls = 0
        self._loop: Worker[None] | None = None
        self.wake = asyncio.Event()
        self.verdict: VerifyVerdict | None = None

    def compose_step(self) -> ComposeResult:
        yield Static("5. Verify with a new job", classes="step-title")
        yield Static("", id="verify-intro", classes="step-intro")
        yield JobsTable(id="verify-jobs")
        yield Static("", id="verify-evidence", markup=False)
        yield Static("", id="verify-raw", markup=False)

    def has_action(self, name: str) -> bool:
        if name == "create_job":
            return bool(self.ctx.settings.test_job_command.strip())
        return super().has_action(name)

    def on_enter(self) -> None:
        r = self.ctx.restarted_at
        when = datetime.fromtimestamp(r).strftime("%H:%M:%S") if r else "(not recorded: run step 4)"
        if r and not self.ctx.facts().restart_finished:
            when += " (it did not finish: run step 4 again)"
        how = (
            "j creates the small test job from [commands] test_job"
            if self.ctx.settings.test_job_command.strip()
            else "as you always do: web UI or CLI; the wizard watches for it"
        )
        self.query_one("#verify-intro", Static).update(
            f"Worker restarted at [b]{when}[/b]; older jobs never get the key. [b]Create a new job now[/b] "
            f"({escape(how)}). Refreshes every {self.ctx.settings.poll_interval:g} s."
        )
        problem = self.ctx.relay_problem()
        if problem:
            # Watching would wait forever: no job leaves Creating without the relay.
            self._stop()
            self.status.set(problem, "error")
            return
        for_now = (self.ctx.relay_key, self.ctx.restarted_at)
        if self.session is None or self._session_for != for_now:
            # first visit, another relay, or the worker restarted since: a new watch (saved state of
            # the same relay and restart comes back from the progress file)
            self._stop()
            self.session = self.ctx.verify_session()
            self._session_for = for_now
            self.verdict = None
        proved = self.ctx.verified_summary() if "verify" in self.ctx.ticks() else None
        if self.verdict is None and proved is not None:
            message, lines = proved  # a resume: what was proven, until the watch judges again
            self.status.set(f"Proven earlier: {message}", "ok")
            self.query_one("#verify-evidence", Static).update("\n".join(lines))
        if self._loop is None or not self._loop.is_running:
            self._loop = self.watch_jobs()
        else:
            self.wake.set()

    def on_leave(self) -> None:
        self._stop()

    def _stop(self) -> None:
        if self._loop is not None:
            self._loop.cancel()
            self._loop = None

    def action_refresh(self) -> None:
        if self._loop is None or not self._loop.is_running:
            if self.session is not None and not self.ctx.relay_problem():
                self._loop = self.watch_jobs()
            return
        self.wake.set()

    @work(group="verify-poll", exit_on_error=False)
    async def watch_jobs(self) -> None:
        """The use case's loop: list, judge, wait; every event drawn as it comes."""
        assert self.session is not None
        async for ev in self.session.run(wake=self.wake):
            self.show(ev)

    def show(self, ev: VerifyEvent) -> None:
        """Draw one event of the use case (nothing is decided here)."""
        raw = self.query_one("#verify-raw", Static)
        if isinstance(ev, JobsListed):
            raw.remove_class("-shown")
            self.polls += 1
            self.query_one(JobsTable).show(ev.listing.views, set(ev.new_ids))
        elif isinstance(ev, TestJobCreated):
            self.status.set("Test job created; watching for it to leave Creating …", "busy")
        elif isinstance(ev, TestJobFailed):
            self.status.set(ev.message, "error")
        elif isinstance(ev, Judged):
            v = ev.verdict
            self.verdict = v
            if v.kind == "list-failed":
                listing = self.session.listing if self.session is not None else None
                if listing is not None and listing.raw is not None and listing.exit_code == 0:
                    raw.update("Raw output:\n" + listing.raw)
                    raw.add_class("-shown")
                if listing is not None and listing.runner_error is not None:
                    self.ctx.drop_connection(listing.runner_error)
            text = v.message + (" Press r to retry." if v.kind == "list-failed" else "")
            if v.check and v.kind != "list-failed":
                text += " What to check: below."  # short, so the NEW row stays in view at 60×20
            self.status.set(text, v.level)
            said = [*v.lines, *([v.check] if v.check else [])]
            self.query_one("#verify-evidence", Static).update("\n".join(said))
            was = "verify" in self.ctx.ticks()
            self.ctx.note_verdict(v, self.session.state.as_json() if self.session is not None else None)
            self.done = "verify" in self.ctx.ticks()  # as the step list will show it (Changed, below)
            if was and not self.done:
                # No toast for a proof (it would cover the status line); a withdrawal is news.
                self.notify(v.message, title="Verdict withdrawn", severity="warning")
            self.post_message(self.Changed(self))

    def action_create_job(self) -> None:
        cmd = self.ctx.settings.test_job_command.strip()
        self.app.push_screen(
            ConfirmScreen(
                "Create a test job", "Run on the deployment host ([commands] test_job):", commands=[cmd], yes="Create"
            ),
            self._create_confirmed,
        )

    def _create_confirmed(self, ok: bool | None) -> None:
        if ok:
            self.create_job()
        else:  # Enter on the focused Cancel, esc or n: say so, or j seemed to do nothing
            self.status.set("No test job created. Press j again (y in the dialog creates it).", "info")

    @work(exclusive=True, group="verify-create", exit_on_error=False)
    async def create_job(self) -> None:
        if self.session is None:
            return
        self.status.set("Creating the test job …", "busy")
        async for ev in self.session.create_test_job():
            self.show(ev)
        self.wake.set()

    def mark_done(self, done: bool = True) -> None:
        """Done only with the relay's proof (ops.session: the verified record); Next past "cannot
        tell" goes on without a tick."""
        if done and "verify" not in self.ctx.ticks():
            return
        super().mark_done(done)

    def validate_step(self) -> str | None:
        if "verify" in self.ctx.ticks():
            return None
        v = self.verdict
        if v is not None and v.kind == "cannot-tell" and v.job is not None:
            return None  # a job left Creating; whether the relay carried it cannot be told (said in the status)
        if v is not None and v.kind in ("not-relayed", "probe-only", "older-only", "env-dropped"):
            return f"{v.message} Check: {v.check.removeprefix('What to check: ')}" if v.check else v.message
        if v is not None and v.kind == "stale":
            return v.message
        how = (
            "press j for a test job, or create one yourself"
            if self.has_action("create_job")
            else ("create one (web UI or CLI)")
        )
        return f"No new job has left Creating through this relay yet: {how} and wait for the verdict."
