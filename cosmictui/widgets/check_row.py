"""A prerequisite check as one row: status word (not colour alone), what was seen, the fix."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.widgets import Static

from cosmictui.ops.vocabulary import CheckResult

_MARK = {"ok": "✔ ok", "warn": "! warn", "fail": "✘ FAIL"}


class CheckRow(Horizontal):
    """One check result: a fixed status column, then the name, what was seen and the fix."""

    def __init__(self, result: CheckResult) -> None:
        super().__init__(classes=f"check-row -{result.status}")
        self.result = result

    def compose(self) -> ComposeResult:
        r = self.result
        yield Static(_MARK[r.status], classes="check-mark", markup=False)
        text = f"{r.name}: {r.detail}"
        if r.fix and r.status != "ok":
            text += f"\n→ fix: {r.fix}"
        yield Static(text, classes="check-text", markup=False)

    @property
    def text(self) -> str:
        r = self.result
        return f"{_MARK[r.status]} {r.name}: {r.detail}" + (f" fix: {r.fix}" if r.fix else "")
