"""Step 1: prerequisites, each a live check with what was seen and how to fix it."""

from __future__ import annotations

import asyncio
import shlex

from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.widgets import Static

from cosmictui.ops import relayproc
from cosmictui.ops.session import relay_args, unjoined_relay, wanted_args
from cosmictui.ops.setup.checks import CheckResult
from cosmictui.ops.setup.steps import gather_checks
from cosmictui.screens.step import Step
from cosmictui.widgets.check_row import CheckRow


class PrereqsStep(Step):
    STEP_ID = "prereqs"
    TITLE = "Prerequisites"
    STEP_BINDINGS = (Binding("r", "step('rerun')", "Re-check"),)

    def __init__(self, ctx) -> None:  # type: ignore[no-untyped-def]
        super().__init__(ctx)
        self.results: list[CheckResult] = []
        #: the relay the checks saw (pid, port, key), None when none ran: a change makes them stale
        self.relay_seen: tuple[int, int, str] | None = None

    def compose_step(self) -> ComposeResult:
        yield Static("1. Prerequisites", classes="step-title")
        yield Static(
            "This machine (the relay host) and the deployment host, checked live. "
            "Failures must be fixed; warnings may be passed. r checks again.",
            classes="step-intro",
        )
        yield Vertical(id="check-rows")

    def on_enter(self) -> None:
        # Back here after the relay started (or stopped), the rows would speak of a relay that is
        # gone or say "not running" of one that runs: check again.
        if not self.busy and (not self.results or self._relay_now() != self.relay_seen):
            self.run_checks()

    def _relay_now(self) -> tuple[int, int, str] | None:
        rt = relayproc.attach(self.ctx.relay_storage) if self.ctx.relay_storage else None
        return (rt.pid, rt.port, rt.key) if rt is not None else None

    def action_rerun(self) -> None:
        if not self.busy:
            self.run_checks()

    @work(exclusive=True, group="checks", exit_on_error=False)
    async def run_checks(self) -> None:
        self.busy = True
        self.status.set("Checking …", "busy")
        try:
            self.relay_seen = self._relay_now()
            results = await gather_checks(self.ctx.settings, self.ctx.logged_deployment, self.ctx.relay_storage)
            rt = relayproc.attach(self.ctx.relay_storage) if self.ctx.relay_storage else None
            other = await asyncio.to_thread(self._other_flags, rt)
            results = unjoined_relay(results, rt, other)
        finally:
            self.busy = False
        self.results = results
        rows = self.query_one("#check-rows", Vertical)
        await rows.remove_children()
        row_widgets = [CheckRow(r) for r in results]
        await rows.mount_all(row_widgets)
        first_bad = next((w for w in row_widgets if w.result.status == "fail"), None)
        if first_bad is not None:
            first_bad.scroll_visible(animate=False)  # a failure must be seen, even at 80×24
        fails = [r for r in results if r.status == "fail"]
        warns = [r for r in results if r.status == "warn"]
        if fails:
            self.mark_done(False)
            self.status.set(f"{len(fails)} check(s) failed: fix them, then press r.", "error")
        else:
            self.mark_done()
            extra = f" ({len(warns)} warning(s))" if warns else ""
            self.status.set(f"All prerequisites met{extra}. Press n to continue.", "warn" if warns else "ok")

    def _other_flags(self, rt: relayproc.RelayRuntime | None) -> str | None:
        """The flags a relay of this storage runs with, when they are not the wizard's."""
        if rt is None:
            return None
        have = relay_args(rt.pid)
        if have is None or have == wanted_args(self.ctx.settings, rt.storage, rt.port):
            return None
        return shlex.join(have)

    def validate_step(self) -> str | None:
        if self.busy:
            return "The checks are still running."
        if not self.results and self.done:
            return None  # passed on an earlier run (resumed); a visit runs them again
        if not self.results:
            return "The checks have not run yet: press r."
        fails = [r.name for r in self.results if r.status == "fail"]
        if fails:
            return "Fix the failed checks first: " + ", ".join(fails) + "."
        return None
