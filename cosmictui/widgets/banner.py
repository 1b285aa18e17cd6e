"""A banner that stays until the operator dismisses it: for what must not scroll away.

A job deleted and not recreated is the one thing the wizard must never let slip by in a
toast or a log line that the next poll scrolls off.
"""

from __future__ import annotations

from textual.message import Message
from textual.widgets import Static


class LostJob(Message):
    """A job was deleted and not recreated; `text` says which, the command and the file."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text


class Banner(Static):
    """Messages shown one per line above the steps, until dismissed (x)."""

    DEFAULT_CLASSES = "banner"

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__("", id=id, markup=False)
        self.messages: list[str] = []

    def add(self, text: str) -> None:
        if text not in self.messages:
            self.messages.append(text)
        self._draw()

    def clear_all(self) -> list[str]:
        gone, self.messages = self.messages, []
        self._draw()
        return gone

    def _draw(self) -> None:
        self.update("\n".join(f"⚠ {m}" for m in self.messages) + ("\n(x dismisses)" if self.messages else ""))
        self.set_class(bool(self.messages), "-shown")
