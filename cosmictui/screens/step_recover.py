"""Step 6: delete jobs that can never reach the relay and recreate them the same way."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import HorizontalScroll
from textual.widgets import Static
from textual.widgets.selection_list import Selection

from cosmictui.ops.jobs import Job, JobsFormatError, JobView, parse_jobs, view_jobs
from cosmictui.ops.runner import RunnerError
from cosmictui.ops.wizard_steps import JobWatch, command_failure_hint, format_age, job_command, recoverable
from cosmictui.screens.confirm import ConfirmScreen
from cosmictui.screens.step import Step, runner_problem
from cosmictui.widgets.job_picker import JobPicker


class RecoverStep(Step):
    STEP_ID = "recover"
    TITLE = "Recover jobs"
    STEP_BINDINGS = (
        Binding("r", "step('refresh')", "Refresh"),
        Binding("d", "step('recreate')", "Recreate"),
    )

    def __init__(self, ctx) -> None:  # type: ignore[no-untyped-def]
        super().__init__(ctx)
        self.views: dict[str, JobView] = {}
        self.recreated: list[str] = []

    def compose_step(self) -> ComposeResult:
        yield Static("6. Recover stuck jobs", classes="step-title")
        yield Static(
            "Jobs created before the restart never get the relay key. Select stuck jobs with "
            "space, then d deletes each and creates it again with the same fields.",
            classes="step-intro",
        )
        yield JobPicker(id="recover-jobs")
        yield Static("", id="recover-fields", markup=False)
        with HorizontalScroll(id="recover-command"):  # a command is one line, never wrapped
            yield Static("", id="recover-command-text", markup=False)

    def on_enter(self) -> None:
        if not self.busy:
            self.load()

    def action_refresh(self) -> None:
        if not self.busy:
            self.load()

    async def _list(self) -> list[Job] | None:
        """The jobs, or None after telling the operator why they could not be listed."""
        try:
            result = await self.ctx.run(self.ctx.settings.list_command)
        except RunnerError as e:
            self.status.set(runner_problem(e, "list the jobs"), "error")
            return None
        if result.exit_code != 0:
            hint = command_failure_hint(result.cmd, result.exit_code, result.output)
            self.status.set(f"{result.cmd} exited {result.exit_code}. {hint}", "error")
            return None
        try:
            return parse_jobs(result.output, self.ctx.now_dt())
        except JobsFormatError as e:
            self.status.set(f"Cannot read the jobs list ({e.reason}). Raw output:\n{e.raw}", "error")
            return None

    @work(exclusive=True, group="recover", exit_on_error=False)
    async def load(self, keep_status: bool = False) -> None:
        """List the stuck jobs; `keep_status` leaves the last verdict in the status line."""
        jobs = await self._list()
        if jobs is None:
            return
        s = self.ctx.settings
        restart = datetime.fromtimestamp(self.ctx.restarted_at, UTC) if self.ctx.restarted_at else None
        views = view_jobs(jobs, self.ctx.now_dt(), restart, s.stuck_after, s.stale_after)
        stuck = recoverable(views)
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
                    f"{v.job.id}  {v.job.status} {format_age(v.age)}" + ("  old: no key" if v.before_restart else ""),
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
            self.query_one("#recover-fields", Static).update("")
            self.query_one("#recover-command-text", Static).update("")
            if not keep_status:
                self.status.set("No stuck jobs. Press n (Finish) when done.", "ok")

    def on_selection_list_selection_highlighted(self, event: JobPicker.SelectionHighlighted) -> None:
        v = self.views.get(event.selection.value)
        if v is not None:
            self._show_fields(v.job)

    def _show_fields(self, job: Job) -> None:
        v = self.views.get(job.id)
        why = f"Stuck: {v.stuck}\n" if v is not None and v.stuck else ""
        fields = "\n".join(f"  {k}: {val}" for k, val in job.fields.items() if k not in ("id", "status", "age"))
        try:
            cmd = job_command(self.ctx.settings.create_command, job)
        except KeyError as e:
            cmd = f"(cannot build: {e.args[0]})"
        self.query_one("#recover-fields", Static).update(f"{why}Job {job.id} ({job.status}):\n{fields}\nRecreate with:")
        self.query_one("#recover-command-text", Static).update(cmd)

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
        plan: list[tuple[Job, str, str]] = []
        s = self.ctx.settings
        for jid in ids:
            job = self.views[jid].job
            try:
                plan.append((job, job_command(s.delete_command, job), job_command(s.create_command, job)))
            except KeyError as e:
                self.status.set(str(e.args[0]) + ": fix [commands] create in the config.", "error")
                return
        body = "These commands will run on the deployment host, in order:"
        commands = [cmd for _, d, c in plan for cmd in (d, c)]

        def confirmed(ok: bool | None) -> None:
            if ok:
                self.recreate(plan)
            else:
                self.status.set("Nothing deleted.", "info")

        self.app.push_screen(
            ConfirmScreen(
                f"Delete and recreate {len(plan)} job(s)?",
                body,
                commands=commands,
                yes="Delete & recreate",
                danger=True,
            ),
            confirmed,
        )

    @work(exclusive=True, group="recover", exit_on_error=False)
    async def recreate(self, plan: list[tuple[Job, str, str]]) -> None:
        self.busy = True
        try:
            before = await self._list()
            if before is None:
                return
            since = self.ctx.now_dt()
            for job, delete, create in plan:
                for cmd, doing in ((delete, f"delete job {job.id}"), (create, f"recreate job {job.id}")):
                    self.status.set(f"Running {cmd} …", "busy")
                    try:
                        result = await self.ctx.run(cmd)
                    except RunnerError as e:
                        self.status.set(runner_problem(e, doing) + " Stopped here.", "error")
                        return
                    if result.exit_code != 0:
                        hint = command_failure_hint(cmd, result.exit_code, result.output)
                        self.status.set(f"{cmd} exited {result.exit_code}; stopped here. {hint}", "error")
                        return
                self.recreated.append(job.id)
            watch = JobWatch(since, exclude={j.id for j in before})
            while True:
                jobs = await self._list()
                if jobs is None:
                    return
                verdict = watch.observe(jobs)
                self.status.set(f"Watching the recreated job(s): {verdict.message}", "busy")
                if verdict.state in ("confirmed", "failed"):
                    break
                await asyncio.sleep(self.ctx.settings.poll_interval)
        finally:
            self.busy = False
        ok = verdict.state == "confirmed"
        self.status.set(verdict.message, "ok" if ok else "error")
        if ok:
            self.mark_done()
        self.load(keep_status=True)  # the list changed; the verdict is what the operator must see

    def validate_step(self) -> str | None:
        return None
