"""The wizard's one screen: step list, the active step, Back/Next, the command log.

Navigation rules live here so every step gets them the same way: Next validates the step
first; Back turns into Cancel while the step works; the furthest step reached is saved so a
rerun resumes there.
"""

from __future__ import annotations

from typing import ClassVar

from textual import events, on, work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.screen import Screen
from textual.widgets import Button, ContentSwitcher, Footer, Header, Input, Static

from cosmictui.ops import relayproc
from cosmictui.ops.progress import CommandJournal
from cosmictui.ops.runner import RunnerError
from cosmictui.ops.session import WizardContext
from cosmictui.ops.setup.install import DEFAULT_PREFIX, InstallPlan, UnitError, install_plan
from cosmictui.ops.setup.leaving import left_running
from cosmictui.screens.confirm import ConfirmScreen
from cosmictui.screens.step import Step
from cosmictui.screens.step_apply import ApplyStep
from cosmictui.screens.step_env import EnvStep
from cosmictui.screens.step_prereqs import PrereqsStep
from cosmictui.screens.step_recover import RecoverStep
from cosmictui.screens.step_relay import RelayStep
from cosmictui.screens.step_verify import VerifyStep
from cosmictui.widgets.banner import Banner, LostJob
from cosmictui.widgets.command_log import CommandLog, fold_command
from cosmictui.widgets.step_list import StepList, StepState

STEP_CLASSES: list[type[Step]] = [PrereqsStep, RelayStep, EnvStep, ApplyStep, VerifyStep, RecoverStep]
RELAY_STEP = STEP_CLASSES.index(RelayStep)
VERIFY_STEP = STEP_CLASSES.index(VerifyStep)  # from here on, jobs need the relay running


def _step_bindings() -> list[BindingType]:
    seen: list[BindingType] = []
    for cls in STEP_CLASSES:
        seen.extend(cls.STEP_BINDINGS)
    return seen


#: Below this width the footer leaves out "b Back" so the step's keys, Monitor, Quit and Log fit.
NARROW = 70


class WizardScreen(Screen[None]):
    """Prerequisites → relay → .env → apply & restart → verify → recover."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("n", "next", "Next"),
        Binding("b", "back", "Back"),
        Binding("b", "back_narrow", "Back", show=False),  # below NARROW the ◀ Back button says it
        # esc first leaves a field (said in the footer while one has the focus), else cancels.
        Binding("escape", "leave_field", "Leave field"),
        Binding("escape", "cancel", "Cancel"),
        *_step_bindings(),
        # What must fit at 80 columns comes first; the log keys are also on the log's border.
        Binding("m", "monitor", "Monitor"),
        Binding("q", "quit", "Quit"),
        Binding("l", "toggle_log", "Log"),
        Binding("x", "dismiss_banner", "Dismiss"),
        Binding("y", "copy_log", "Copy log", show=False),
        Binding("pagedown", "scroll_step('down')", "Scroll", show=False),
        Binding("pageup", "scroll_step('up')", "Scroll", show=False),
        Binding("end", "scroll_step('end')", "Scroll", show=False),
        Binding("home", "scroll_step('home')", "Scroll", show=False),
    ]

    #: Next has the focus at the start (Enter goes on, never back), so the first Tab wraps to the
    #: step's first field.
    AUTO_FOCUS = "#next"
    VERTICAL_BREAKPOINTS = [(0, "-short"), (40, "-tall")]  # noqa: RUF012 (typed by Textual)
    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (120, "-wide")]  # noqa: RUF012 (typed by Textual)

    def __init__(self, ctx: WizardContext) -> None:
        super().__init__()
        self.ctx = ctx
        self.steps: list[Step] = [cls(ctx) for cls in STEP_CLASSES]
        self.index = 0
        self.reached = 0
        self._journal: CommandJournal | None = None
        self.relay_down: str | None = None
        self.narrow = False
        """Below NARROW columns: the footer leaves out keys the nav bar's buttons already show."""
        """Why the relay of step 2 no longer serves jobs (checked on resume and past step 2)."""

    # -- layout ---------------------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        yield Header(icon="⛭")
        with Horizontal(id="body"):
            yield StepList([s.TITLE for s in self.steps], id="step-list")
            with Vertical(id="main"):
                yield Banner(id="banner")
                with ContentSwitcher(id="content", initial=self.steps[0].id):
                    yield from self.steps
                with Horizontal(id="nav"):
                    yield Static("", id="nav-hint", markup=False)
                    yield Button("◀ Back", id="back", compact=True)
                    yield Button("Next ▶", id="next", variant="primary", compact=True)
        yield CommandLog(id="command-log")
        yield Footer(show_command_palette=False)  # ctrl+p still opens it; the room goes to keys

    async def on_mount(self) -> None:
        self.title = "cosmictui · relay setup"
        self.sub_title = self.ctx.describe_deployment()
        self.query_one(Footer).compact = self.app.size.width < 80
        self.narrow = self.app.size.width < NARROW
        self.query_one(StepList).set_short(self.narrow)
        log = self.query_one(CommandLog)
        log.journal = self._journal = self.ctx.journal()
        self.ctx.attach_log(log, self._on_command, lambda text: self.notify(text, title="Deployment host"))
        if log.journal is not None:
            log.note(f"this log is also written to {log.journal.path}")
        banner = self.query_one(Banner)
        for text in self.ctx.lost_jobs():  # a lost job stays on screen until dismissed, across runs
            banner.add(text)
        resume = min(self.ctx.progress_step(), len(self.steps) - 1)
        self.reached = resume
        if resume > RELAY_STEP:
            self.run_worker(self._read_env(), group="env-evidence", exit_on_error=False)
        await self._show(resume)
        if resume:
            self.notify(f"Resumed at step {resume + 1}: {self.steps[resume].TITLE}", title="Progress restored")
        if self.relay_down:
            self.notify(self.relay_down, title="Step 2 needs attention", severity="error", timeout=15)

    def on_resize(self, event: events.Resize) -> None:
        # Below 80 columns the footer drops its padding, so no key falls off the right edge;
        # below NARROW it leaves out "b Back" where it does not fit (the nav bar's ◀ Back button shows
        # it; b still works).
        footer = self.query_one(Footer)
        if footer.compact != (event.size.width < 80):
            footer.compact = event.size.width < 80
        if self.narrow != (event.size.width < NARROW):
            self.narrow = event.size.width < NARROW
            self.refresh_bindings()
        self.query_one(StepList).set_short(self.narrow)

    async def _read_env(self) -> None:
        """The .env is part of the evidence for ticks 3-6: read it once on resume (steps 3 and 2 refresh it)."""
        await self.ctx.read_env_relays()
        self._refresh_nav()

    def on_descendant_focus(self, _event: events.DescendantFocus) -> None:
        self.refresh_bindings()  # a field took the focus: the footer says how to leave it
        self._light_field_rows()

    def on_descendant_blur(self, _event: events.DescendantBlur) -> None:
        self.refresh_bindings()
        self._light_field_rows()

    def _light_field_rows(self) -> None:
        """Light the label of the field with the focus. A class, not `:focus-within` in the CSS:
        Textual restyles the focused widget and its ancestors, not the label beside it, so the
        label stayed grey."""
        for row in self.query(".field-row"):
            row.set_class(row.has_focus_within, "-focused")

    def on_key(self, event: events.Key) -> None:
        """A path typed while no field has the focus starts in the storage field, not as key actions."""
        if event.character in ("/", "~") and not isinstance(self.focused, Input):
            start_typing = getattr(self.step, "start_typing_path", None)
            if start_typing is not None and start_typing(event.character):
                event.stop()
                event.prevent_default()

    def on_unmount(self) -> None:
        if self._journal is not None:
            self._journal.close()

    # -- navigation -----------------------------------------------------------------------------

    @property
    def step(self) -> Step:
        return self.steps[self.index]

    async def _show(self, index: int) -> None:
        if 0 <= self.index < len(self.steps) and self.steps[self.index].built and index != self.index:
            self.steps[self.index].on_leave()
        self.index = index
        self.reached = max(self.reached, index)
        if index > RELAY_STEP:
            self._check_relay()
        await self.step.build()
        self.query_one("#content", ContentSwitcher).current = self.step.id
        self.step.on_enter()
        self._refresh_nav()

    def _check_relay(self) -> str | None:
        """Past step 2, the relay must still run: a dead one sends step 2 back to "not done"."""
        self.relay_down = self.ctx.relay_problem()
        return self.relay_down

    def _refresh_nav(self) -> None:
        # Every tick is derived again from the evidence (ops.session.derive_ticks): the step list,
        # each step's Next check and the progress file cannot disagree.
        ticks, unproven = self.ctx.ticks(), self.ctx.unproven()
        states: list[StepState] = []
        for i, s in enumerate(self.steps):
            s.done = s.STEP_ID in ticks
            if i == self.index:
                states.append("busy" if s.busy else "current")
            elif i == RELAY_STEP and self.relay_down:
                states.append("failed")
            elif s.done:
                states.append("warn" if s.STEP_ID in unproven else "done")
            else:
                states.append("pending")
        self.query_one(StepList).set_states(states)
        back = self.query_one("#back", Button)
        nxt = self.query_one("#next", Button)
        busy = self.step.busy
        # Only touch what changed: every change restyles the widget.
        label, disabled, variant = ("✕ Cancel", False, "warning") if busy else ("◀ Back", self.index == 0, "default")
        if str(back.label) != label:
            back.label = label
        back.disabled = disabled
        back.variant = variant  # type: ignore[assignment]
        nxt.disabled = busy
        last = "Finish ✔" if self.index == len(self.steps) - 1 else "Next ▶"
        if str(nxt.label) != last:
            nxt.label = last
        self.refresh_bindings()

    @on(Step.Changed)
    def _step_changed(self, event: Step.Changed) -> None:
        if self.relay_down and event.step is self.steps[RELAY_STEP] and event.step.done:
            self.relay_down = self.ctx.relay_problem()  # started again in step 2
        self._refresh_nav()

    @on(Step.LaterInvalid)
    def _later_invalid(self, event: Step.LaterInvalid) -> None:
        """Ticks of the steps after `event.step` are taken back (screen and progress file)."""
        at = self.steps.index(event.step)
        later = self.steps[at + 1 :]
        if any(s.done or self.ctx.progress.is_done(s.STEP_ID) for s in later):
            self.ctx.uncomplete(*(s.STEP_ID for s in later))
            self.notify(f"{event.why}: steps {at + 2}–{len(self.steps)} need doing again.", title="Progress reset")
        self._refresh_nav()

    @on(Button.Pressed, "#next")
    async def _next_pressed(self) -> None:
        await self.action_next()

    @on(Button.Pressed, "#back")
    async def _back_pressed(self) -> None:
        if self.step.busy:
            self.action_cancel()
        else:
            await self.action_back()

    @on(StepList.Selected)
    async def _jump(self, event: StepList.Selected) -> None:
        if self.step.busy or event.index > self.reached or event.index == self.index:
            return
        if event.index > self.index:
            # Forward jumps pass through validation of each step in between.
            for i in range(self.index, event.index):
                problem = self.steps[i].validate_step()
                if problem:
                    await self._show(i)
                    self._refuse(problem)
                    return
        await self._show(event.index)

    def _refuse(self, problem: str) -> None:
        self.step.status.set(problem, "error")
        self.notify(problem, title=f"Step {self.index + 1} is not done yet", severity="error")

    async def action_next(self) -> None:
        if self.step.busy:
            return
        problem = self.step.validate_step()
        if not problem and self.index + 1 >= VERIFY_STEP:
            problem = self._check_relay()
            self._refresh_nav()
        if problem:
            self._refuse(problem)
            return
        self.step.mark_done()
        self.ctx.save_progress(self.index + 1)
        if self.index == len(self.steps) - 1:
            # (no toast: the Finish dialog says it, and a toast covered its buttons)
            self._finish()
            return
        await self._show(self.index + 1)

    #: where Finish installs the relay for systemd (a test points it elsewhere)
    install_prefix = DEFAULT_PREFIX

    def _finish(self) -> None:
        """The relay the wizard started does not survive a reboot: offer to install it for systemd."""
        ctx = self.ctx
        if ctx.relay_external:
            self._finished("Done. The relay runs elsewhere (attached by key): keep it running there.")
            return
        rt = relayproc.attach(ctx.relay_storage) if ctx.relay_storage else None
        port = rt.port if rt is not None else ctx.settings.relay_port
        try:
            plan = install_plan(
                ctx.settings, ctx.relay_storage, port, prefix=self.install_prefix, relay_pid=rt.pid if rt else None
            )
        except UnitError as e:
            self._finished(f"Done. To keep the relay running after a reboot, systemd needs a unit, but: {e}.")
            return
        why = (
            "The wizard started the relay detached: it runs until this host reboots. systemd keeps it running, "
            "but its hardened unit hides /home, /root and /tmp from the service, so the relay must be installed "
            f"where the unit can run it: a virtual environment in {plan.prefix}."
        )
        if ctx.demo is not None:
            self._finished(
                f"Done. {why} On a real relay host Finish offers to run these, as root, then shows the unit:",
                plan.install + plan.enable,
            )
            return
        self.app.push_screen(
            ConfirmScreen(
                "Finished: keep the relay running after a reboot",
                f"{why} Install it there now? These run on this machine (as root):",
                commands=plan.install,
                yes="Install",
                no="Not now",
            ),
            lambda ok: self._install_or_not(plan, bool(ok)),
        )

    def _install_or_not(self, plan: InstallPlan, ok: bool) -> None:
        if ok:
            self._install(plan)
        else:
            self._finished("Done. Nothing was installed; these commands do it later, as root:", plan.install)

    def _finished(self, body: str, commands: list[str] | None = None) -> None:
        self.app.push_screen(
            ConfirmScreen("Finished: the relay is set up", body, commands=commands or [], yes="Quit", no="Stay"),
            lambda ok: self.app.exit() if ok else None,
        )

    @work(exclusive=True, group="install", exit_on_error=False)
    async def _install(self, plan: InstallPlan) -> None:
        """Run the install commands (logged), then show the unit for the installed relay."""
        self.notify(f"Installing the relay into {plan.prefix} …", title="Finish")
        for cmd in plan.install:
            try:
                result = await self.ctx.run(cmd, runner=self.ctx.local, timeout=900)
            except RunnerError as e:
                self._finished(f"Installing stopped: {cmd} could not run ({e}). Nothing else was run.", plan.install)
                return
            if result.exit_code != 0:
                tail = "\n".join(result.output.strip().splitlines()[-5:])
                self._finished(
                    f"Installing stopped: {cmd} exited {result.exit_code}. Nothing else was run. Its last lines:\n"
                    f"{tail}\nFix what it says, then press n (Finish) again.",
                    plan.install,
                )
                return
        saved = self.ctx.save_unit(plan.unit)
        self.ctx.note(f"the unit for {plan.exe}" + (f" is saved in {saved}" if saved else "") + ":\n" + plan.unit)
        moved = (
            f" The unit's storage is {plan.storage}: the first command copies the key there from {plan.moved_from} "
            "(the unit cannot see it), so it is the same key."
            if plan.moved_from
            else " Same storage, so the same key."
        )
        notes = "".join(f"\nNote: {n}" for n in plan.notes)
        self.app.push_screen(
            ConfirmScreen(
                f"The unit for {plan.exe}",
                f"{plan.unit.rstrip()}\n{notes}\n"
                f"Installed in {plan.prefix}. The unit above"
                + (f" is saved in {saved}" if saved else "")
                + f". Put it in place as root (this stops the wizard's relay; systemd starts it again).{moved}",
                commands=plan.enable,
                yes="Quit",
                no="Stay",
            ),
            lambda ok: self.app.exit() if ok else None,
        )

    async def action_back_narrow(self) -> None:
        await self.action_back()

    async def action_back(self) -> None:
        if self.step.busy or self.index == 0:
            return
        await self._show(self.index - 1)

    def action_cancel(self) -> None:
        if self.step.busy:
            self.step.status.set("Cancelled; nothing further was run.", "warn")
            self.step.cancel_work()
            self._refresh_nav()

    def running_command(self) -> str | None:
        """The command in flight on the deployment host, None when none is (quitting is safe then:
        a probe or a wait for the relay stops harmlessly, the detached relay keeps running)."""
        running = [e.cmd for e in self.query_one(CommandLog).entries if e.running]
        return running[-1] if running else None

    def action_quit(self) -> None:
        """Quitting while a command runs would kill it halfway (a restart, a delete): ask first."""
        running = self.running_command()
        if running is None:
            self._quit_leaving_relay()
            return
        question = ConfirmScreen(
            "Quit while a command runs?",
            "This is still running on the deployment host. Quitting now stops it halfway; its step stays "
            "not done and runs again next time.",
            commands=[running],
            yes="Quit anyway",
            no="Keep running",
            danger=True,
        )

        def follow() -> None:
            # The question must not outlive its reason: once the command ended, say so.
            if self.app.screen is not question:
                timer.stop()
            elif self.running_command() is None:
                timer.stop()
                question.restate(
                    "The command has finished",
                    "Nothing runs on the deployment host any more: quitting now stops nothing.",
                    yes="Quit",
                    no="Stay",
                )

        timer = self.set_interval(0.25, follow)
        self.app.push_screen(question, lambda ok: self.app.exit() if ok else None)

    def _quit_leaving_relay(self) -> None:
        """Nothing in flight: quit, but first say what keeps running here (a real deployment's relay)."""
        ctx = self.ctx
        at = min(ctx.progress_step(), len(self.steps) - 1)
        left = left_running(
            ctx.settings,
            ctx.relay_storage,
            external=ctx.relay_external,
            demo=ctx.demo is not None,
            resume_at=f"step {at + 1} ({self.steps[at].TITLE})",
        )
        if left is None:
            self.app.exit()
            return
        question = ConfirmScreen(left.title, left.body, commands=left.stop, yes="Quit, keep it running", no="Stay")
        self.app.push_screen(question, lambda ok: self.app.exit() if ok else None)

    @on(LostJob)
    def _lost_job(self, event: LostJob) -> None:
        self.query_one(Banner).add(event.text)
        self.refresh_bindings()

    def action_dismiss_banner(self) -> None:
        if self.query_one(Banner).clear_all():
            self.ctx.dismiss_lost()
        self.refresh_bindings()

    def action_toggle_log(self) -> None:
        log = self.query_one(CommandLog)
        log.toggle_class("-shown")
        log.set_class(log.has_class("-shown"), "-user")

    def action_copy_log(self) -> None:
        text = self.query_one(CommandLog).transcript()
        self.app.copy_to_clipboard(text)
        n = len(self.query_one(CommandLog).entries)
        self.notify(f"Copied the command log ({n} commands) to the clipboard.")

    def action_monitor(self) -> None:
        self.app.open_monitor()  # type: ignore[attr-defined]

    def action_scroll_step(self, direction: str) -> None:
        """PgUp/PgDn/Home/End scroll the step's body wherever the focus is (a long step at 80×24)."""
        body = self.step.body
        {
            "down": body.scroll_page_down,
            "up": body.scroll_page_up,
            "home": body.scroll_home,
            "end": body.scroll_end,
        }[direction](animate=False)

    def action_leave_field(self) -> None:
        """esc in a field: the focus goes to Next, so the step's keys work again."""
        self.query_one("#next", Button).focus()

    def action_step(self, name: str) -> None:
        self.step.run_step_action(name)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "step":
            return self.step.has_action(str(parameters[0]))
        if action in ("back", "back_narrow"):
            shown = not self.narrow or self._back_fits()
            return not self.step.busy and self.index > 0 and shown == (action == "back")
        field = isinstance(self.focused, Input)
        if action == "leave_field":
            return field
        if field and action not in ("scroll_step",):
            # Letters typed now go into the field; the footer shows only how to leave it.
            return False
        if action == "cancel":
            return self.step.busy
        if action == "next":
            return not self.step.busy
        if action == "dismiss_banner":
            return bool(self.query_one(Banner).messages)
        return True

    _measuring = False

    def _back_fits(self) -> bool:
        """Below NARROW the footer (compact: "key desc" items one space apart) still says "b Back"
        when it fits beside the step's keys (step 4's one key leaves room; step 2's four do not,
        and there the nav bar's ◀ Back button says it)."""
        if self._measuring:
            return False
        self._measuring = True
        try:
            shown = [
                ab.binding
                for ab in self.active_bindings.values()
                if ab.enabled and ab.binding.show and ab.binding.action not in ("back", "back_narrow")
            ]
        finally:
            self._measuring = False
        width = sum(len(self.app.get_key_display(b)) + 2 + len(b.description) for b in shown) + len("b Back")
        return width <= self.app.size.width

    def _on_command(self, cmd: str) -> None:
        """Show the last command in the nav bar, so it is visible even with the log hidden."""
        self.query_one("#nav-hint", Static).update(f"$ {fold_command(cmd)}")
