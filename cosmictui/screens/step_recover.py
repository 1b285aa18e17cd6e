"""Step 6: delete jobs that can never reach the relay, and recreate them only when that is safe.

The decisions are in `cosmictui.ops.jobs.recover`: the record is saved before any delete, delete &
recreate only with a known create command, otherwise delete only. This step draws and asks.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import HorizontalScroll
from textual.widgets import Static
from textual.widgets.selection_list import Selection

from cosmictui.ops.jobs.listing import list_jobs
from cosmictui.ops.jobs.model import Job, JobView, shown_status
from cosmictui.ops.jobs.recover import (
    RecordSaved,
    RecoveryPlan,
    RecoveryStopped,
    RecreatedWatch,
    draft_create,
    plan_recovery,
    recover_jobs,
    recovery_dir,
)
from cosmictui.ops.setup.steps import format_age, recoverable
from cosmictui.screens.confirm import ConfirmScreen
from cosmictui.screens.edit_command import EditCommandScreen
from cosmictui.screens.step import Step
from cosmictui.widgets.banner import LostJob
from cosmictui.widgets.job_picker import JobPicker


class RecoverStep(Step):
    STEP_ID = "recover"
    TITLE = "Recover jobs"
    STEP_BINDINGS = (
        Binding("r", "step('refresh')", "Refresh"),
        Binding("d", "step('recreate')", "Recover"),
        Binding("e", "step('edit_create')", "Edit"),
    )

    def __init__(self, ctx) -> None:  # type: ignore[no-untyped-def]
        super().__init__(ctx)
        self.views: dict[str, JobView] = {}
        self.recreated: list[str] = []
        #: (old job id, the new job that replaces it or None when not told apart), in recovery order
        self.replaced: list[tuple[str, str | None]] = []
        #: Create commands the operator reviewed and edited, per job id: these count as known.
        self.reviewed: dict[str, str] = {}
        self.shown: Job | None = None

    def compose_step(self) -> ComposeResult:
        yield Static("6. Recover stuck jobs", classes="step-title")
        yield Static(
            "Jobs created before the restart never get the relay key. Select stuck jobs with space; d saves "
            "each job's fields to a file, deletes it and (with a known create command) creates it again.",
            classes="step-intro",
        )
        yield Static("", id="recover-replaced", markup=False)
        yield JobPicker(id="recover-jobs")
        yield Static("", id="recover-fields", markup=False)
        # The command wraps at the edge (wizard.tcss), so this box never scrolls: it takes no focus
        # (a Tab stop that showed nothing and did nothing).
        with HorizontalScroll(id="recover-command", can_focus=False):
            yield Static("", id="recover-command-text", markup=False)

    def on_enter(self) -> None:
        if not self.busy:
            self.load()

    def action_refresh(self) -> None:
        if not self.busy:
            self.load()

    async def _list(self) -> list[Job] | None:
        """The jobs, or None after telling the operator why they could not be listed."""
        listing = await list_jobs(self.ctx.run, self.ctx.settings, self.ctx.now_dt())
        if not listing.ok:
            raw = f" Raw output:\n{listing.raw}" if listing.raw and listing.exit_code == 0 else ""
            self.status.set(f"{listing.error}{raw}", "error")
            return None
        return listing.jobs

    @work(exclusive=True, group="recover", exit_on_error=False)
    async def load(self, keep_status: bool = False) -> None:
        """List the stuck jobs; `keep_status` leaves the last verdict in the status line."""
        s = self.ctx.settings
        restart = datetime.fromtimestamp(self.ctx.restarted_at, UTC) if self.ctx.restarted_at else None
        listing = await list_jobs(self.ctx.run, s, self.ctx.now_dt(), restart)
        if not listing.ok:
            raw = f" Raw output:\n{listing.raw}" if listing.raw and listing.exit_code == 0 else ""
            self.status.set(f"{listing.error}{raw}", "error")
            return
        stuck = recoverable(listing.views, s.statuses)
        if problem := self.ctx.relay_problem():
            keep_status = True
            self.status.set(problem, "error")
        self.views = {v.job.id: v for v in stuck}
        sel = self.query_one(JobPicker)
        chosen = set(sel.selected)
        sel.clear_options()
        sel.add_options(
            [
                Selection(
                    f"{v.job.id}  {shown_status(v.job.status)} {format_age(v.age)}"
                    + ("  old: no key" if v.before_restart else ""),
                    v.job.id,
                    v.job.id in chosen,
                )
                for v in stuck
            ]
        )
        if stuck:
            if sel.highlighted is None:
                sel.highlighted = 0
            sel.focus()
            self._show_fields(stuck[0].job)
            if not keep_status:
                self.status.set(f"{len(stuck)} stuck job(s). Select with space, then press d.", "info")
        else:
            self.shown = None
            self.query_one("#recover-fields", Static).update("")
            self.query_one("#recover-command-text", Static).update("")
            if not keep_status:
                self.status.set("No stuck jobs. Press n (Finish) when done.", "ok")

    def on_selection_list_selection_highlighted(self, event: JobPicker.SelectionHighlighted) -> None:
        v = self.views.get(event.selection.value)
        if v is not None:
            self._show_fields(v.job)

    def _plan(self, job: Job) -> RecoveryPlan:
        return plan_recovery(job, self.ctx.settings, self.reviewed.get(job.id))

    def _show_fields(self, job: Job) -> None:
        self.shown = job
        v = self.views.get(job.id)
        why = f"Stuck: {v.stuck}\n" if v is not None and v.stuck else ""
        fields = "\n".join(f"  {k}: {val}" for k, val in job.fields.items() if k not in ("id", "status", "age"))
        plan = self._plan(job)
        if plan.create is not None:
            how = "Recreate with" + (" (your reviewed command):" if plan.create_source == "operator" else ":")
            cmd = plan.create
        else:
            draft = draft_create(job, self.ctx.settings)
            gaps = f" ({', '.join(draft.missing)} not in the list)" if draft.missing else ""
            how = (
                f"No known create command{gaps}: d deletes only and you recreate the job yourself (web UI or "
                "CLI) from the saved file; e edits a create command to review. Draft:"
            )
            cmd = draft.command
        self.query_one("#recover-fields", Static).update(
            f"{why}Job {job.id} ({shown_status(job.status)}):\n{fields}\n{how}"
        )
        self.query_one("#recover-command-text", Static).update(cmd)

    def action_edit_create(self) -> None:
        job = self.shown
        if self.busy or job is None:
            return
        current = self.reviewed.get(job.id) or draft_create(job, self.ctx.settings).command
        self.app.push_screen(
            EditCommandScreen(
                f"Create command for job {job.id}",
                "The create flags are not documented where the wizard can see them: check them against "
                "`cosmicac jobs create --help` and fill in every {field}. This exact command will run after "
                "the delete.",
                current,
            ),
            lambda cmd: self._reviewed(job, cmd),
        )

    def _reviewed(self, job: Job, cmd: str | None) -> None:
        if cmd is None:
            return
        self.reviewed[job.id] = cmd
        self._show_fields(job)
        self.status.set(f"Create command for {job.id} reviewed. Select it (space) and press d.", "info")

    def action_recreate(self) -> None:
        if self.busy:
            return
        if problem := self.ctx.relay_problem():
            self.status.set(problem + " Nothing deleted.", "error")
            return
        ids = list(self.query_one(JobPicker).selected)
        if not ids:
            self.status.set("Select at least one job first (space).", "error")
            return
        plans = [self._plan(self.views[jid].job) for jid in ids if jid in self.views]
        commands: list[str] = []
        for p in plans:
            commands.append(p.delete)
            commands.append(p.create if p.create else f"# {p.job.id}: delete only — you recreate it yourself")
        only = [p.job.id for p in plans if p.create is None]
        where = recovery_dir(self.ctx.settings.deployment)  # the file's own name is shown once saved
        body = (
            "First each job's every field and its recreate command are saved to a new file in\n"
            f"{where}/\n(its name is shown and logged). Then these commands run on the deployment host, in order:"
        )
        if only:
            body += (
                f" Job(s) {', '.join(only)} have no known create command: they are deleted only, and you "
                "recreate them (web UI or CLI) from the saved file (or press e first to review a create command)."
            )
        title = (
            f"Delete {len(only)} and recreate {len(plans) - len(only)} job(s)?"
            if only
            else (f"Delete and recreate {len(plans)} job(s)?")
        )
        self.app.push_screen(
            ConfirmScreen(
                title,
                body,
                commands=commands,
                yes="Delete only" if len(only) == len(plans) else "Delete & recreate",
                danger=True,
            ),
            lambda ok: self._recover_confirmed(plans, ok),
        )

    def _recover_confirmed(self, plans: list[RecoveryPlan], ok: bool | None) -> None:
        if ok:
            self.recreate(plans)
        else:
            self.status.set("Nothing deleted.", "info")

    @work(exclusive=True, group="recover", exit_on_error=False)
    async def recreate(self, plans: list[RecoveryPlan]) -> None:
        self.busy = True
        verdict = None
        recreated: list[str] = []
        try:
            before = await self._list()
            if before is None:
                return
            since = self.ctx.now_dt()
            s = self.ctx.settings
            listed = [j.id for j in before]  # so the job each create made is told apart
            async for event in recover_jobs(self.ctx.run, plans, s, listed):  # the one recover loop (ops)
                if isinstance(event, RecordSaved):
                    self.ctx.note(f"saved job {event.job_id} (every field, recreate command) to {event.record}")
                    self.status.set(f"Saved {event.job_id} to {event.record}; running {event.delete} …", "busy")
                elif isinstance(event, RecoveryStopped):
                    self.ctx.note(event.message)
                    if event.lost:
                        self.post_message(LostJob(event.message))
                        self.ctx.remember_lost(event.message)
                    fix = "" if event.lost or not event.fix or event.fix in event.message else f" Fix: {event.fix}"
                    self.status.set(f"{event.message} Stopped here.{fix}", "error")
                    return
                else:
                    self.ctx.note(event.result.message)
                    if event.result.outcome == "deleted-only":
                        self.status.set(event.result.message, "warn")
                        continue
                    recreated.append(event.result.job_id)
                    self.recreated.append(event.result.job_id)
                    self.replaced.append((event.result.job_id, event.result.new_job_id))
                    self._show_replaced()
            if not recreated:
                self.load(keep_status=True)
                return
            # every job recreated now is watched and named, not only the first to leave Creating
            mine = self.replaced[len(self.replaced) - len(recreated) :]
            watch = RecreatedWatch(since, {j.id for j in before}, mine, s.statuses)
            while True:
                jobs = await self._list()
                if jobs is None:
                    return
                verdict = watch.observe(jobs)
                self.status.set(f"Watching the recreated job(s): {verdict.message}", "busy")
                if verdict.state in ("confirmed", "failed"):
                    break
                await asyncio.sleep(s.poll_interval)
        finally:
            self.busy = False
        ok = verdict is not None and verdict.state == "confirmed"
        if verdict is not None:
            self.status.set(verdict.message, "ok" if ok else "error")
        if ok:
            self.mark_done()
        self.load(keep_status=True)  # the list changed; the verdict is what the operator must see

    def _show_replaced(self) -> None:
        """Which new job replaces which deleted one, kept on screen above the stuck jobs."""
        lines = [
            f"  {new} replaces {old}" if new is not None else f"  {old} recreated; its new job ID is not known"
            for old, new in self.replaced
        ]
        box = self.query_one("#recover-replaced", Static)
        box.update("Recreated:\n" + "\n".join(lines))
        box.add_class("-shown")

    def validate_step(self) -> str | None:
        return None
