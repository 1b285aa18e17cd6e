"""Step 4: apply the config and restart the worker (`ops.setup.apply`), output streamed.

The sequence is the use case's; this step asks first when the .env no longer lists the relay
(both keys named), then draws each event: a row per command, its output below.
"""

from __future__ import annotations

import asyncio

from textual import events, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal
from textual.widgets import Static

from cosmictui.ops.setup.apply import ApplyDone, CommandBegan, CommandEnded, CommandOutput, env_mismatch
from cosmictui.screens.confirm import ConfirmScreen
from cosmictui.screens.step import Step
from cosmictui.widgets.output_log import OutputLog

_MARK = {
    "pending": "·",
    "running": "… running",
    "ok": "✔ done",
    "failed": "✘ FAILED",
    "skipped": "– not run",
}


class CommandRow(Horizontal):
    """One command of the step: its state in a symbol and a word, then the command. Where the
    command's longest word does not fit beside the mark (60 columns), the command goes under it,
    so `task apply-wrk-server-k8s-nvidia-common-config` never breaks mid-word."""

    def __init__(self, number: int, cmd: str) -> None:
        super().__init__(classes="command-row")
        self.number = number
        self.cmd = cmd
        self.state = "pending"

    def compose(self) -> ComposeResult:
        yield Static(_MARK[self.state], classes="command-mark", markup=False)
        yield Static(self.cmd, classes="command-text", markup=False)

    def on_mount(self) -> None:
        self.set_state(self.state)

    def on_resize(self, event: events.Resize) -> None:
        longest = max((len(w) for w in self.cmd.split()), default=0)
        self.set_class(event.size.width - 10 < longest, "-stacked")

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
        if not self.busy:
            self.check_env()

    @work(exclusive=True, group="apply-env", exit_on_error=False)
    async def check_env(self) -> None:
        """What the worker would get is what the .env lists now: read again on every visit, so a
        .env changed outside the wizard unticks step 3 and is said here, naming both keys."""
        keys = await self.ctx.read_env_relays()
        self.post_message(self.Changed(self))
        if self.busy:
            return
        if env_mismatch(keys, self.ctx.relay_key) and self.ctx.relay_key is not None:
            listed = ", ".join(k[:12] + "…" for k in keys or ()) or "no relay"
            self.status.set(  # short, each key by its start: r's question names them whole
                f"The .env lists {listed}, not step 2's relay {self.ctx.relay_key[:12]}…: step 3 (b) puts it "
                "back; r asks before applying the .env as it is.",
                "warn",
            )

    def action_run(self) -> None:
        if not self.busy:
            self.run_commands()

    @work(exclusive=True, group="apply", exit_on_error=False)
    async def run_commands(self) -> None:
        self.busy = True
        self.status.set("Reading the .env (what the worker will get) …", "busy")
        try:
            keys = await self.ctx.read_env_relays()
        finally:
            self.busy = False
        self.post_message(self.Changed(self))  # the .env just read may untick step 3
        if warning := env_mismatch(keys, self.ctx.relay_key):
            ok = await self.app.push_screen_wait(
                ConfirmScreen(
                    "The .env does not list this relay",
                    f"{warning} Go back to step 3 (b) to put its key in, or apply the .env as it is.",
                    yes="Apply anyway",
                    no="Go back",
                    danger=True,
                )
            )
            if not ok:
                self.status.set("Nothing applied: step 3 (b) puts this relay's key into the .env.", "warn")
                return
        rows = list(self.query(CommandRow))
        out = self.query_one("#apply-output", OutputLog)
        out.clear()
        for row in rows:
            row.set_state("pending")
        self.mark_done(False)
        self.busy = True
        try:
            async for ev in self.ctx.apply_and_restart(keys):
                if isinstance(ev, CommandBegan):
                    rows[ev.index].set_state("running")
                    self.status.set(f"Running {ev.cmd} …", "busy")
                    out.write_line(f"$ {ev.cmd}")
                elif isinstance(ev, CommandOutput):
                    out.write_lines(ev.text.splitlines())
                elif isinstance(ev, CommandEnded) and ev.exit_code == 0:
                    rows[ev.index].set_state("ok")
                elif isinstance(ev, ApplyDone):
                    self.show_done(ev, rows)
        except asyncio.CancelledError:
            for row in rows:
                if row.state == "running":
                    row.set_state("failed", "cancelled")
            raise
        finally:
            self.busy = False

    def show_done(self, ev: ApplyDone, rows: list[CommandRow]) -> None:
        if not ev.ok:
            assert ev.failed is not None
            rows[ev.failed].set_state("failed", ev.detail)
            for r in rows[ev.failed + 1 :]:
                r.set_state("skipped")
            self.invalidate_later("Apply & restart failed")
            self.status.set(ev.message.replace("apply and restart again", "press r to run both again"), "error")
            return
        self.applied_writes = self.ctx.env_writes
        self.mark_done()
        self.status.set("Applied and restarted. Press n to verify with a new job.", "ok")

    def cancel_work(self) -> None:
        """A cancelled apply may have stopped halfway: the worker's config is not known, so this
        step and the ones that stand on it (verify, recover) are not done any more."""
        was_running = self.busy
        super().cancel_work()
        if was_running:
            self.mark_done(False)
            self.invalidate_later("Apply & restart was cancelled")

    def validate_step(self) -> str | None:
        if "apply" in self.ctx.ticks():
            return None
        if not self.done:
            return "Both commands must succeed first: press r to run them."
        if self.applied_writes != self.ctx.env_writes:
            return "The .env changed since the last apply: press r to apply and restart again."
        return None
