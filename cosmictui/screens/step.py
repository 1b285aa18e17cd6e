"""What every wizard step has in common.

A step is a pane in the wizard's content area, not a Screen: the step list, the command log
and Back/Next stay put while the operator moves through. Steps are thin; the work is in
`cosmictui.ops`, run in workers so nothing blocks the UI thread.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.message import Message
from textual.reactive import reactive
from textual.widgets import Static
from textual.worker import Worker, WorkerState

from cosmictui.ops.jobs.listing import runner_problem as _runner_problem

if TYPE_CHECKING:
    from cosmictui.ops.session import WizardContext


class StepStatus(Static):
    """One line under a step's title: what happened last, in words (not colour alone)."""

    DEFAULT_CLASSES = "step-status"

    kind = ""

    def __init__(self) -> None:
        # Plain text: statuses carry remote output and config names like [commands], which
        # markup would swallow.
        super().__init__("", markup=False)

    def set(self, text: str, kind: str = "info") -> None:
        if kind != self.kind:
            if self.kind:
                self.remove_class(f"-{self.kind}")
            self.add_class(f"-{kind}")
            self.kind = kind
        prefix = {"ok": "✔ ", "warn": "! ", "error": "✘ ", "busy": "… "}.get(kind, "")
        self.update(prefix + text if text else "")


class StepBody(VerticalScroll):
    """A step's scrolling body. It takes the focus (so arrows scroll it) only in a step with no
    field, table or log of its own: there the first Tab lands on one of those, never on a pane
    that shows no sign of having the focus (PgUp/PgDn/Home/End scroll the body wherever it is)."""

    def on_mount(self) -> None:
        self.call_after_refresh(self.settle_focus)

    def settle_focus(self) -> None:
        self.can_focus = not any(w.can_focus for w in self.query("*"))


class Step(Vertical):
    """Base for the six wizard steps: a scrolling body above a status line that stays in view.

    The status is a sibling of the body, not docked inside it: a docked status covered the
    end of the body, so the last lines (e.g. the last checks at 80×24) could not be scrolled to.
    """

    STEP_ID: ClassVar[str] = ""
    TITLE: ClassVar[str] = ""
    #: Bindings of this step; the wizard screen shows them in the Footer while the step is active.
    STEP_BINDINGS: ClassVar[tuple[Binding, ...]] = ()

    busy: reactive[bool] = reactive(False)
    """True while the step runs something; Back turns into Cancel."""

    class Changed(Message):
        """Busy/done changed: the wizard refreshes Back/Next and the step list."""

        def __init__(self, step: Step) -> None:
            super().__init__()
            self.step = step

    class LaterInvalid(Message):
        """What later steps did no longer holds (the .env changed, apply failed): untick them."""

        def __init__(self, step: Step, why: str) -> None:
            super().__init__()
            self.step = step
            self.why = why

    def __init__(self, ctx: WizardContext) -> None:
        super().__init__(id=f"step-{self.STEP_ID}", classes="step")
        self.ctx = ctx
        self.done = False

    built = False

    def compose(self) -> ComposeResult:
        # A step's widgets are made when it is first shown: starting the wizard stays quick.
        if self.built:
            with StepBody(classes="step-body"):
                yield from self.compose_step()
            yield StepStatus()

    def compose_step(self) -> ComposeResult:
        """The step's widgets, shown in a scrolling body above the step's status line."""
        yield from ()

    @property
    def body(self) -> StepBody:
        return self.query_one(".step-body", StepBody)

    async def build(self) -> None:
        if not self.built:
            self.built = True
            await self.recompose()

    @property
    def status(self) -> StepStatus:
        return self.query_one(StepStatus)

    def watch_busy(self, _busy: bool) -> None:
        self.post_message(self.Changed(self))

    def mark_done(self, done: bool = True) -> None:
        """The operator did (or undid) this step; the wizard derives its tick from the evidence."""
        self.done = done
        self.ctx.set_done(self.STEP_ID, done)
        self.post_message(self.Changed(self))

    def invalidate_later(self, why: str) -> None:
        self.post_message(self.LaterInvalid(self, why))

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        """A bug in a worker must not take the wizard down: say what broke, keep the UI."""
        if event.state == WorkerState.ERROR and event.worker.node is self:
            self.busy = False
            err = event.worker.error
            self.status.set(f"Unexpected error ({type(err).__name__}: {err}). Nothing further was run.", "error")
            self.log.error(f"worker {event.worker.name} failed", err)

    # -- hooks the wizard calls ---------------------------------------------------------------

    def on_enter(self) -> None:
        """The step became the active one (also when coming back to it)."""

    def on_leave(self) -> None:
        """The operator moved to another step."""

    def validate_step(self) -> str | None:
        """None when Next may proceed, else what is still missing (shown to the operator)."""
        return None

    def cancel_work(self) -> None:
        """Back pressed as Cancel: stop what runs; the step must leave things as they were."""
        self.workers.cancel_node(self)
        self.busy = False

    def has_action(self, name: str) -> bool:
        """Whether the step offers `name` right now (hides Footer bindings that do not apply)."""
        return any(b.action == f"step('{name}')" for b in self.STEP_BINDINGS)

    def run_step_action(self, name: str) -> None:
        handler = getattr(self, f"action_{name}", None)
        if handler is not None:
            handler()


def runner_problem(e: Exception, doing: str) -> str:
    """A RunnerError (or any I/O error) as one sentence an operator can act on (`ops.jobs.listing`)."""
    return _runner_problem(e, doing)
