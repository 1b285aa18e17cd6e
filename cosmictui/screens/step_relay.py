"""Step 2: start the relay detached (it outlives the TUI), attach to one already running, or
attach by key to a relay that runs elsewhere (e.g. npm blind-relay-service): the probe then
proves it carries a connection.

The key derives from the storage directory; anything that would change the key the
deployment already uses gets a loud warning first.
"""

from __future__ import annotations

import time

from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.widgets import Input, Static

from cosmictui.ops import relayproc
from cosmictui.ops.relayproc import RelayRuntime
from cosmictui.ops.setup.envfile import normalize_key
from cosmictui.ops.setup.relayup import (
    RelayEvent,
    RelayOutcome,
    RelayRunning,
    Stage,
    blocking,
    other_flags,
)
from cosmictui.ops.vocabulary import CheckResult
from cosmictui.ops.wording import sentences
from cosmictui.screens.confirm import ConfirmScreen
from cosmictui.screens.step import Step
from cosmictui.widgets.check_row import CheckRow
from cosmictui.widgets.path_input import PathInput


class RelayStep(Step):
    STEP_ID = "relay"
    TITLE = "Relay"
    STEP_BINDINGS = (
        Binding("s", "step('start')", "Start"),
        Binding("a", "step('attach')", "Attach"),
        Binding("k", "step('attach_key')", "By key", show=False),  # the field says "press k"
        Binding("c", "step('copy_key')", "Copy key"),
    )

    def __init__(self, ctx) -> None:  # type: ignore[no-untyped-def]
        super().__init__(ctx)
        self.runtime: RelayRuntime | None = None
        self.reach: list[CheckResult] = []
        # attached by key (runs elsewhere), proven by the probe; kept in the progress file
        self.key_attached: str | None = ctx.relay_key if ctx.relay_external else None

    def compose_step(self) -> ComposeResult:
        yield Static("2. Start the relay", classes="step-title")
        # The verdict and its proof first, where the eye lands: the relay, its key, its checks.
        yield Static("", id="relay-state", markup=False)
        yield Static("", id="relay-key", markup=False)
        yield Vertical(id="relay-checks")
        # Tab into a field puts the cursor at the end; nothing is selected, so a stray key never
        # replaces the path.
        with Horizontal(classes="field-row"):
            yield Static("Storage dir", classes="field-label")
            yield PathInput(self.ctx.relay_storage, id="relay-storage", compact=True, select_on_focus=False)
        with Horizontal(classes="field-row"):
            yield Static("UDP port", classes="field-label")
            yield Input(
                str(self.ctx.settings.relay_port), id="relay-port", type="integer", compact=True, select_on_focus=False
            )
        with Horizontal(classes="field-row"):
            yield Static("Or its key", classes="field-label")
            yield Input(
                self.key_attached or "",
                id="relay-by-key",
                placeholder="paste a key, Enter",
                compact=True,
                select_on_focus=False,
            )
        lifetime = (
            "In this demo it is stopped, with the sandbox, when the wizard exits."
            if self.ctx.demo is not None
            else "It keeps running after the wizard exits."
        )
        yield Static(
            f"Runs on this machine as its own process. {lifetime} Its key comes from the storage "
            "directory: always use the same one.",
            id="relay-intro",
            classes="step-intro",
        )

    # -- inputs -----------------------------------------------------------------------------------

    def _storage(self) -> str:
        return self.query_one("#relay-storage", Input).value.strip()

    def _port(self) -> int | None:
        try:
            port = int(self.query_one("#relay-port", Input).value)
        except ValueError:
            return None
        return port if 0 < port < 65536 else None

    def start_typing_path(self, char: str) -> bool:
        """A `/` or `~` typed with no field focused starts a path in the storage field (never `s`)."""
        if self.busy:
            return False
        field = self.query_one("#relay-storage", Input)
        field.value = char
        field.cursor_position = len(char)
        field.focus()
        return True

    def on_input_submitted(self, event: Input.Submitted) -> None:
        # Enter leaves the field, so the step's keys (s, a, c, n) work again.
        self.screen.query_one("#next").focus()
        if event.input.id == "relay-by-key" and event.value.strip():
            self.action_attach_key()  # Enter on a pasted key attaches by it (k does too)

    def on_input_changed(self, event: Input.Changed) -> None:
        if event.input.id == "relay-by-key" and self.key_attached not in (None, event.value.strip()):
            self.key_attached = None
            self.mark_done(False)
            self._show()
        # Another storage would be another relay with another key; the one running stays shown
        # (and keeps running) until s or a acts on the new path.
        if event.input.id == "relay-storage" and self.runtime is not None:
            self._show()

    def _abs(self) -> str:
        return str(relayproc.runtime_path(self._storage()).parent) if self._storage() else ""

    # -- display ----------------------------------------------------------------------------------

    def on_enter(self) -> None:
        if self.runtime is None and self.key_attached is not None and not self.busy:
            self._show()  # resumed after attaching by key: there is no local runtime file to look at
            self.status.set(
                f"Attached by key {self.key_attached[:12]}… earlier (it runs elsewhere). Press k to probe it again.",
                "info",
            )
        elif self.runtime is None and not self.busy:
            self.look()

    @work(exclusive=True, group="relay", exit_on_error=False)
    async def look(self) -> None:
        """Show whether a relay already runs with this storage (attaching needs a keypress)."""
        storage = self._storage()
        if not storage:
            return
        status = relayproc.relay_status(storage)
        if status.running and status.runtime is not None:
            rt = status.runtime
            other = self._other_flags(rt)
            if other is not None:
                self.status.set(
                    f"A relay already runs with this storage (pid {rt.pid}) with other flags: {other}. Press s to "
                    "restart it with the wizard's settings (same storage, so the same key), or a to use it as it is.",
                    "warn",
                )
            elif rt.key == self.ctx.relay_key and self.ctx.relay_unproven:
                self.runtime = rt  # the relay set up earlier (a rerun): its tick stands, still unproven
                self.status.set(
                    f"The relay set up earlier runs (pid {rt.pid}, same key), but its last probe "
                    f"{self.ctx.relay_unproven}. Press a to probe it again, n to go on.",
                    "warn",
                )
            elif rt.key == self.ctx.relay_key:
                self.runtime = rt  # the relay set up earlier (a rerun): shown, and its tick stands
                self.status.set(
                    f"The relay set up earlier runs (pid {rt.pid}, same key). Press a to check it again, n to go on.",
                    "ok",
                )
            else:
                self.status.set(f"A relay already runs with this storage (pid {rt.pid}): press a to attach.", "info")
        elif status.stale_runtime:
            self.status.set(
                "A previous relay of this storage is gone (stale runtime file). Press s to start it.", "warn"
            )
        else:
            self.status.set("No relay running with this storage. Press s to start it.", "info")
        self._show()

    def _other_flags(self, rt: RelayRuntime) -> str | None:
        """The running relay's flags when they differ from the wizard's settings (None: the same)."""
        return other_flags(self.ctx.settings, rt, self._port() or self.ctx.settings.relay_port)

    def _show(self) -> None:
        rt = self.runtime
        state = self.query_one("#relay-state", Static)
        key = self.query_one("#relay-key", Static)
        if rt is None and self.key_attached is not None:
            state.update("Relay:   attached by key (it runs elsewhere; the probe proved it relays)")
            key.update(f"Relay key (c copies it):\n{self.key_attached}")
            key.add_class("-shown")
            return
        if rt is None:
            state.update("Relay:   not started or attached yet")
            key.update("")
            key.remove_class("-shown")
            return
        since = time.strftime("%H:%M:%S", time.localtime(rt.started_at))
        text = (
            f"Relay:   running, pid {rt.pid}, since {since}\n"
            f"UDP:     {rt.host}:{rt.port}\n"
            f"Log:     {relayproc.log_path(rt.storage).name} in the storage dir"
        )
        if self._storage() and self._abs() != rt.storage:
            text += (
                f"\nIt keeps running with storage {rt.storage}. The field names another directory: "
                "s would start a second relay there, with a NEW key the .env does not list."
            )
        state.update(text)
        key.update(f"Relay key (c copies it):\n{rt.key}")
        key.add_class("-shown")

    # -- actions ----------------------------------------------------------------------------------

    def _inputs(self) -> tuple[str, int] | None:
        storage, port = self._storage(), self._port()
        if not storage:
            self.status.set("Enter a storage directory first.", "error")
            return None
        if port is None:
            self.status.set("The UDP port must be a number from 1 to 65535.", "error")
            return None
        return storage, port

    def action_start(self) -> None:
        if not self.busy and (inputs := self._inputs()):
            self.go("start", *inputs)

    def action_attach(self) -> None:
        if not self.busy and (inputs := self._inputs()):
            self.go("attach", *inputs)

    @work(exclusive=True, group="relay", exit_on_error=False)
    async def go(self, want: str, storage: str, port: int) -> None:
        """Step 2's use case (`ops.setup.relayup`): its plan, the operator's yes where it needs one,
        then its events drawn as they come."""
        self.status.set("Checking that this keeps the relay key …", "busy")
        plan = await self.ctx.plan_relay(storage, port, want)
        if plan.error is not None:
            self.status.set(sentences(plan.error, f"Fix: {plan.fix}" if plan.fix else None), "error")
            return
        if plan.action == "restart" and plan.running is not None:
            ok = await self.app.push_screen_wait(
                ConfirmScreen(
                    "Restart the relay with the wizard's settings?",
                    f"A relay already runs with this storage (pid {plan.running.pid}) with: {plan.other_flags}. It "
                    "is stopped and started again with the wizard's settings. Same storage, so the same key: the "
                    ".env and the worker keep working with it; jobs reconnect after a few seconds.",
                    commands=list(plan.commands),
                    yes="Restart",
                )
            )
            if not ok:
                self.status.set(
                    f"Nothing changed: the relay (pid {plan.running.pid}) keeps running with its own flags.", "info"
                )
                return
        if plan.key_warning:
            verb = "Attach anyway" if plan.action == "attach" else "Start anyway"
            ok = await self.app.push_screen_wait(
                ConfirmScreen("This changes the relay key", plan.key_warning, yes=verb, danger=True)
            )
            if not ok:
                self.status.set("Nothing started or attached: the relay key is unchanged.", "info")
                return
        before = self.ctx.relay_key
        self.busy = True
        try:
            async for ev in self.ctx.bring_up_relay(plan):
                await self.show(ev, before)
        finally:
            self.busy = False

    async def show(self, ev: RelayEvent, key_before: str | None = None) -> None:
        """Draw one event of step 2's use case (nothing is decided here)."""
        if isinstance(ev, Stage):
            self.status.set(ev.text, "busy")
        elif isinstance(ev, RelayRunning):
            if key_before is not None and ev.runtime.key != key_before:
                # another key: the .env and what the worker hands to jobs no longer match it
                self.invalidate_later("The relay key changed")
            self.runtime = ev.runtime
            self.key_attached = None
            self._show()
        elif isinstance(ev, RelayOutcome):
            await self._outcome(ev)

    async def _outcome(self, ev: RelayOutcome) -> None:
        if ev.error is not None:
            msg = sentences(ev.error, f"Fix: {ev.fix}" if ev.fix else None)
            if ev.log_tail:
                msg += f"\nLast log lines:\n{ev.log_tail}"
            self.status.set(msg, "error")
            self.post_message(self.Changed(self))
            return
        self.reach = ev.checks
        box = self.query_one("#relay-checks", Vertical)
        await box.remove_children()
        await box.mount_all([CheckRow(r) for r in ev.checks])
        box.scroll_visible(animate=False)  # at 80×24 the checks land below the key: bring them up
        self.done = "relay" in self.ctx.progress.completed
        self.post_message(self.Changed(self))
        verb = ev.verb
        if ev.runtime is None and ev.key is not None:  # attached by key
            if ev.unproven:
                self.status.set(f"Relay {ev.key[:12]}… {ev.unproven}. Fix it, then press k to probe again.", "error")
                return
            self.runtime = None
            self.key_attached = ev.key
            self._show()
            self.status.set("Attached by key: two peers met through it. Press c to copy the key, n for the .env.", "ok")
        elif ev.blocking:
            self.status.set(f"{verb} the relay, but: {ev.blocking} Fix it, then press a to re-check.", "error")
        elif ev.unproven:
            self.status.set(f"{verb} the relay, but the probe {ev.unproven}. Press a to probe again.", "warn")
        else:
            self.status.set(f"{verb} the relay. Press c to copy the key, n to put it in the .env.", "ok")

    def action_attach_key(self) -> None:
        if self.busy:
            return
        text = self.query_one("#relay-by-key", Input).value.strip()
        if not text:
            self.status.set("Paste the relay's key in 'Or its key' first (z32 or hex), then Enter.", "error")
            return
        try:
            key = normalize_key(text)
        except ValueError as e:
            self.status.set(f"That is not a relay key: {e}", "error")
            return
        self.attach_by_key(key)

    @work(exclusive=True, group="relay", exit_on_error=False)
    async def attach_by_key(self, key: str) -> None:
        """A relay this machine does not run (no runtime file, maybe no /stats): the probe is the proof."""
        self.busy = True
        try:
            async for ev in self.ctx.attach_relay_by_key(key):
                await self.show(ev)
        finally:
            self.busy = False

    def _blocking(self) -> str | None:
        """Jobs can only use the relay if the deployment host reaches it: that failing blocks Next."""
        return blocking(self.reach)

    def cancel_work(self) -> None:
        starting = any(w.name == "go" and w.is_running for w in self.workers if w.node is self)
        super().cancel_work()
        if starting:
            # The relay is its own detached process: cancelling stops the waiting, not the relay.
            self.status.set(
                "Stopped waiting. The relay may still be starting on its own: press a to attach, or read its log.",
                "warn",
            )

    def action_copy_key(self) -> None:
        key = self.runtime.key if self.runtime is not None else self.key_attached
        if key is None:
            self.status.set("No key yet: start (s) or attach (a) the relay first.", "error")
            return
        self.app.copy_to_clipboard(key)
        self.notify(key, title="Relay key copied to the clipboard")

    def validate_step(self) -> str | None:
        if self.runtime is None and self.key_attached is not None and self.key_attached == self.ctx.relay_key:
            return None  # attached by key: the probe through it passed
        if self.runtime is None and self.done and self.ctx.relay_key:
            # resumed: the tick says the relay set up earlier still runs with its key (ctx.relay_problem)
            rt = relayproc.attach(self.ctx.relay_storage)
            if rt is not None and rt.key == self.ctx.relay_key:
                self.runtime = rt
            return None
        if self.runtime is None:
            return "No relay yet: press s to start it or a to attach to a running one."
        if not relayproc.pid_alive(self.runtime.pid):
            return f"The relay (pid {self.runtime.pid}) is no longer running: press s to start it again."
        if not self.reach and not self.done:
            return "The relay has not been checked from the deployment host yet: press a."
        return self._blocking()
