"""The step list on the wizard's side: where the operator stands and what is done.

State is shown by a symbol and a word as well as colour, so it reads in any theme and
without relying on red/green.
"""

from __future__ import annotations

from typing import Literal

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.message import Message
from textual.widgets import Static

StepState = Literal["pending", "current", "done", "warn", "failed", "busy"]

_MARK: dict[StepState, str] = {
    "pending": "·",
    "current": "▶",
    "busy": "…",
    "done": "✔",
    "warn": "!",  # done, but not proven (e.g. the relay runs and the probe through it failed)
    "failed": "✘",
}


class StepItem(Static):
    """One row of the step list; clickable once the step has been reached."""

    def __init__(self, index: int, title: str) -> None:
        super().__init__(id=f"step-item-{index}", classes="step-item")
        self.index = index
        self.title = title
        self.state: StepState = "pending"
        self.short = False

    def set_state(self, state: StepState, force: bool = False) -> None:
        if state == self.state and not force:
            return  # restyling is the costly part of a redraw: only on change
        self.remove_class(f"-{self.state}")
        self.state = state
        self.add_class(f"-{state}")
        self._label()

    def _label(self) -> None:
        self.update(
            f"{_MARK[self.state]} {self.index + 1}"
            if self.short
            else f"{_MARK[self.state]} {self.index + 1}. {self.title}"
        )

    def set_short(self, short: bool) -> None:
        if short != self.short:
            self.short = short
            self._label()

    def on_mount(self) -> None:
        self.set_state(self.state, force=True)

    def on_click(self) -> None:
        self.post_message(StepList.Selected(self.index))


class StepList(Vertical):
    """Vertical list of the wizard's steps."""

    DEFAULT_CLASSES = "step-list"

    class Selected(Message):
        """The operator clicked a step."""

        def __init__(self, index: int) -> None:
            super().__init__()
            self.index = index

    def __init__(self, titles: list[str], *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.titles = titles
        self.border_title = "Steps"

    def compose(self) -> ComposeResult:
        for i, title in enumerate(self.titles):
            yield StepItem(i, title)

    def set_states(self, states: list[StepState]) -> None:
        for item, state in zip(self.query(StepItem), states, strict=True):
            item.set_state(state)

    def set_short(self, short: bool) -> None:
        """Below 70 columns only the marks and numbers: the room goes to the step itself."""
        self.set_class(short, "-short")
        self.border_title = "" if short else "Steps"  # "St…" said nothing
        for item in self.query(StepItem):
            item.set_short(short)

    def state_of(self, index: int) -> StepState:
        return self.query_one(f"#step-item-{index}", StepItem).state
