"""Step 4: apply the config and restart the worker, output streamed, stop at the first failure."""

from __future__ import annotations

import asyncio

from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal
from textual.widgets import Static

from cosmictui.ops.jobs.evidence import counters
from cosmictui.ops.metrics.client import MetricsError, scrape
from cosmictui.ops.runner import RunnerError
from cosmictui.ops.setup.steps import command_failure_hint
from cosmictui.screens.step import Step, runner_problem
from cosmictui.widgets.output_log import OutputLog

_MARK = {
    "pending": "·",
    "running": "… running",
    "ok": "✔ done",
    "failed": "✘ FAILED",
    "skipped": "– not run",
}


class CommandRow(Horizontal):
    """One command of the step: its state in a symbol and a word, then the command."""

    def __init__(self, number: int, cmd: str) -> None:
        super().__init__(classes="command-row")
        self.number = number
        self.cmd = cmd
        self.state = "pending"

    def compose(self) -> ComposeResult:
        yield Static("", classes="command-mark", markup=False)
        yield Static(self.cmd, classes="command-text", markup=False)

    def on_mount(self) -> None:
        self.set_state(self.state)

    def set_state(self, state: str, detail: str = "") -> None:
        self.remove_class(f"-{self.state}")
        self.add_class(f"-{state}")
        self.state = state
        if self.is_mounted:
            self.query_one(".command-text", Static).update(self.cmd + (f"  ({detail})" if detail else ""))
            self.query_one(".command-mark", Static).update(_MARK[state])

    def render_text(self) -> str:
        return f"{_MARK[self.state]} {self.query_one('.command-text', Static).render()}"


class ApplyStep(Step):
    applied_writes = 0
    STEP_ID = "apply"
    TITLE = "Apply & restart"
    STEP_BINDINGS = (Binding("r", "step('run')", "Run"),)

    def compose_step(self) -> ComposeResult:
        yield Static("4. Apply the config and restart the worker", classes="step-title")
        yield Static("", id="apply-intro", classes="step-intro")
        s = self.ctx.settings
        yield CommandRow(1, s.apply_command)
        yield CommandRow(2, s.restart_command)
        yield OutputLog(id="apply-output", max_lines=2000)

    def on_enter(self) -> None:
        self.query_one("#apply-intro", Static).update(
            "Runs both in the deployment directory, output below. The worker passes the relay key "
            "only to jobs it creates after this restart."
        )
        if not self.done and not self.busy:
            self.status.set("Press r to run both commands.", "info")

    def action_run(self) -> None:
        if not self.busy:
            self.run_commands()

    @work(exclusive=True, group="apply", exit_on_error=False)
    async def run_commands(self) -> None:
        rows = list(self.query(CommandRow))
        out = self.query_one("#apply-output", OutputLog)
        out.clear()
        for row in rows:
            row.set_state("pending")
        self.mark_done(False)
        self.ctx.uncomplete(self.STEP_ID)  # until both commands succeed again, apply is not done
        self.busy = True

        def show(text: str) -> None:
            out.write_lines(text.splitlines())

        try:
            for i, row in enumerate(rows):
                row.set_state("running")
                self.status.set(f"Running {row.cmd} …", "busy")
                out.write_line(f"$ {row.cmd}")
                try:
                    result = await self.ctx.run(row.cmd, on_output=show)
                except RunnerError as e:
                    row.set_state("failed", e.kind)
                    self._skip(rows[i + 1 :])
                    self.invalidate_later("Apply & restart failed")
                    self.status.set(runner_problem(e, f"run {row.cmd}"), "error")
                    return
                if result.exit_code != 0:
                    row.set_state("failed", f"exit {result.exit_code}")
                    self._skip(rows[i + 1 :])
                    self.invalidate_later("Apply & restart failed")
                    hint = command_failure_hint(
                        row.cmd, result.exit_code, result.output, "then press r to run both again"
                    )
                    self.status.set(
                        f"{row.cmd} exited {result.exit_code}; stopped here. {hint}",
                        "error",
                    )
                    return
                row.set_state("ok")
                if i == len(rows) - 1:
                    self.ctx.restarted_at = self.ctx.now()
        except asyncio.CancelledError:
            for row in rows:
                if row.state == "running":
                    row.set_state("failed", "cancelled")
            raise
        finally:
            self.busy = False
        self.applied_writes = self.ctx.env_writes
        await self._reading_at_restart()
        self.mark_done()
        self.ctx.save_progress(3)
        self.status.set("Applied and restarted. Press n to verify with a new job.", "ok")

    async def _reading_at_restart(self) -> None:
        """The relay's counters at the restart: step 5 shows what it saw since (evidence)."""
        url = self.ctx.relay_metrics_url()
        reading: dict[str, float] | None = None
        if url:
            try:
                reading = counters(await scrape(url))
            except MetricsError:
                reading = None
        if reading:
            self.ctx.progress.data["relay_at_restart"] = reading
        else:
            self.ctx.progress.data.pop("relay_at_restart", None)

    def cancel_work(self) -> None:
        """A cancelled apply may have stopped halfway: the worker's config is not known, so this
        step and the ones that stand on it (verify, recover) are not done any more."""
        was_running = self.busy
        super().cancel_work()
        if was_running:
            self.mark_done(False)
            self.invalidate_later("Apply & restart was cancelled")

    def _skip(self, rows: list[CommandRow]) -> None:
        for r in rows:
            r.set_state("skipped")

    def validate_step(self) -> str | None:
        if not self.done:
            return "Both commands must succeed first: press r to run them."
        if self.applied_writes != self.ctx.env_writes:
            return "The .env changed since the last apply: press r to apply and restart again."
        return None
