"""A yes/no question in a modal, loud when the action is dangerous."""

from __future__ import annotations

from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Footer, Static


class ConfirmScreen(ModalScreen[bool]):
    """Ask before doing something; `danger` makes the box and the yes-button stand out."""

    BINDINGS: ClassVar[list[BindingType]] = [
        # Shown in the dialog's own footer, which covers the wizard's: its "n Next" read as a key of
        # the dialog, where n answers No.
        Binding("y", "answer(True)", "Yes"),
        Binding("escape", "answer(False)", "Cancel"),
        Binding("n", "answer(False)", "No", show=False),
        # The question and its commands scroll as one, from the keyboard, whatever has the focus.
        Binding("up", "scroll('up')", "Scroll", show=False),
        Binding("down", "scroll('down')", "Scroll", show=False),
        Binding("pageup", "scroll('pageup')", "Scroll", show=False),
        Binding("pagedown", "scroll('pagedown')", "Scroll", show=False),
        Binding("home", "scroll('home')", "Scroll", show=False),
        Binding("end", "scroll('end')", "Scroll", show=False),
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
        #: Shell commands, each whole: a long one wraps under its own `$` (a hanging indent, so a
        #: wrapped command never reads as two) and the dialog scrolls when they do not fit.
        self.commands = list(commands)
        self.yes = yes
        self.no = no
        self.danger = danger
        self._name_keys()

    def _name_keys(self) -> None:
        """The footer names what y and esc do here with the buttons' words ("y Create", "esc Stay")."""
        self._bindings.key_to_bindings["y"] = [Binding("y", "answer(True)", self.yes)]
        self._bindings.key_to_bindings["escape"] = [Binding("escape", "answer(False)", self.no)]

    def compose(self) -> ComposeResult:
        with Vertical(id="confirm-box") as box:
            box.border_title = ("⚠ " if self.danger else "") + self.title_text
            with VerticalScroll(id="confirm-scroll"):
                yield Static(self.body, id="confirm-body", markup=False)
                if self.commands:
                    with Vertical(id="confirm-commands"):
                        for cmd in self.commands:
                            with Horizontal(classes="confirm-command"):
                                yield Static("$", classes="confirm-prompt", markup=False)
                                yield Static(cmd, classes="confirm-command-text", markup=False)
            with Horizontal(id="confirm-buttons"):
                yield Button(self.no, id="confirm-no", variant="default", compact=True)
                yield Button(self.yes, id="confirm-yes", variant="error" if self.danger else "primary", compact=True)
        yield Footer(show_command_palette=False, compact=True)

    def on_mount(self) -> None:
        # Default focus on the safe choice: a stray Enter must not change anything.
        self.query_one("#confirm-no", Button).focus()
        self._fit()

    def on_resize(self) -> None:
        self._fit()

    def _fit(self) -> None:
        """The box is at most 90% of the screen above the footer: what does not fit scrolls, the
        buttons stay in view (counted from the whole screen, a long question pushed them under the box's
        edge at 60x20)."""
        # the footer's line, then the box's two border lines and the buttons' line
        room = (self.size.height - 1) * 9 // 10 - 3
        self.query_one("#confirm-scroll").styles.max_height = max(3, room)

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        self.dismiss(event.button.id == "confirm-yes")

    def action_answer(self, value: bool) -> None:
        self.dismiss(value)

    def action_scroll(self, how: str) -> None:
        box = self.query_one("#confirm-scroll", VerticalScroll)
        {
            "up": box.scroll_up,
            "down": box.scroll_down,
            "pageup": box.scroll_page_up,
            "pagedown": box.scroll_page_down,
            "home": box.scroll_home,
            "end": box.scroll_end,
        }[how](animate=False)

    def restate(self, title: str, body: str, *, yes: str, no: str) -> None:
        """The situation changed while the question was open (the command it named has ended)."""
        self.title_text, self.body, self.yes, self.no, self.danger = title, body, yes, no, False
        self.remove_class("-danger")
        box = self.query_one("#confirm-box")
        box.border_title = title
        self.query_one("#confirm-body", Static).update(body)
        self.query_one("#confirm-commands").display = False
        self.query_one("#confirm-yes", Button).label = yes
        self.query_one("#confirm-yes", Button).variant = "primary"
        self.query_one("#confirm-no", Button).label = no
        self._name_keys()
        self.refresh_bindings()

    def shown_commands(self) -> list[str]:
        """The commands as the dialog shows them (one string each, however they wrap)."""
        return [str(s.render()) for s in self.query(".confirm-command-text").results(Static)]
