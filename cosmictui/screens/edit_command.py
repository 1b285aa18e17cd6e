"""Review and edit a command before it runs (the create command for a job, when not configured)."""

from __future__ import annotations

from typing import ClassVar

from rich.cells import cell_len
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.geometry import Region
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Static

from cosmictui.ops.jobs.recover import unfilled


class EditCommandScreen(ModalScreen[str | None]):
    """An editable command line; accepted only when no `{field}` placeholder is left."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, title: str, body: str, command: str) -> None:
        super().__init__()
        self.title_text = title
        self.body = body
        self.command = command

    def compose(self) -> ComposeResult:
        with Vertical(id="confirm-box") as box:
            box.border_title = self.title_text
            yield Static(self.body, id="confirm-body", markup=False)
            # Opened to be amended, not retyped: nothing selected, the cursor after the last character
            # (selected, the first key replaced the whole command).
            yield Input(self.command, id="edit-command", select_on_focus=False)
            yield Static("", id="edit-problem", markup=False)
            with Horizontal(id="confirm-buttons"):
                yield Button("Cancel", id="confirm-no", compact=True)
                yield Button("Use this command", id="confirm-yes", variant="primary", compact=True)

    def on_mount(self) -> None:
        field = self.query_one(Input)
        field.focus()
        field.action_end()
        self.call_after_refresh(self._show_cursor)  # once the field has a width: else it shows the start

    def _show_cursor(self) -> None:
        field = self.query_one(Input)
        x = cell_len(field.value[: field.cursor_position]) + 1  # the cursor's cell, after the last character
        field.scroll_to_region(Region(x, 0, 1, 1), force=True, animate=False)

    def _accept(self) -> None:
        cmd = self.query_one(Input).value.strip()
        left = unfilled(cmd)
        if not cmd:
            self.query_one("#edit-problem", Static).update("✘ The command is empty.")
            return
        if left:
            self.query_one("#edit-problem", Static).update(
                "✘ Fill in " + ", ".join("{" + f + "}" for f in left) + " first (the jobs list does not show them)."
            )
            return
        self.dismiss(cmd)

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self._accept()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        if event.button.id == "confirm-yes":
            self._accept()
        else:
            self.dismiss(None)

    def action_cancel(self) -> None:
        self.dismiss(None)
