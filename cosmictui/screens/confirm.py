"""A yes/no question in a modal, loud when the action is dangerous."""

from __future__ import annotations

from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, HorizontalScroll, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Static


class ConfirmScreen(ModalScreen[bool]):
    """Ask before doing something; `danger` makes the box and the yes-button stand out."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "answer(False)", "Cancel"),
        Binding("n", "answer(False)", "No", show=False),
        Binding("y", "answer(True)", "Yes", show=False),
    ]

    def __init__(
        self,
        title: str,
        body: str,
        *,
        commands: list[str] | tuple[str, ...] = (),
        yes: str = "Yes",
        no: str = "Cancel",
        danger: bool = False,
    ) -> None:
        super().__init__(classes="-danger" if danger else "")
        self.title_text = title
        self.body = body
        #: Shell commands, one a line and never wrapped (a wrapped command reads as two); a wider
        #: one scrolls sideways.
        self.commands = list(commands)
        self.yes = yes
        self.no = no
        self.danger = danger

    def compose(self) -> ComposeResult:
        with Vertical(id="confirm-box") as box:
            box.border_title = ("⚠ " if self.danger else "") + self.title_text
            yield Static(self.body, id="confirm-body", markup=False)
            if self.commands:
                with HorizontalScroll(id="confirm-commands"):
                    yield Static("\n".join(self.commands), id="confirm-commands-text", markup=False)
            with Horizontal(id="confirm-buttons"):
                yield Button(self.no, id="confirm-no", variant="default", compact=True)
                yield Button(self.yes, id="confirm-yes", variant="error" if self.danger else "primary", compact=True)

    def on_mount(self) -> None:
        # Default focus on the safe choice: a stray Enter must not change anything.
        self.query_one("#confirm-no", Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        self.dismiss(event.button.id == "confirm-yes")

    def action_answer(self, value: bool) -> None:
        self.dismiss(value)
