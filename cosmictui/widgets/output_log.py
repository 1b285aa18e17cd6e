"""Command output that wraps at the widget's width, never cut at the edge.

Textual's `Log` cuts long lines at the right edge, so a kubectl "Forbidden: … cannot patch
resource" reason past column 80 was never seen. This is a `RichLog` that wraps plain text (no
markup: output is data) and keeps the lines as text for copying and tests.
"""

from __future__ import annotations

from collections.abc import Iterable

from rich.text import Text
from textual.widgets import RichLog


class OutputLog(RichLog):
    """Wrapped, plain-text output lines; `plain_lines` is what was written, line by line."""

    def __init__(self, *, max_lines: int | None = 5000, id: str | None = None) -> None:
        super().__init__(max_lines=max_lines, wrap=True, markup=False, highlight=False, min_width=1, id=id)
        self.plain_lines: list[str] = []
        self._max = max_lines

    def write_line(self, line: str) -> None:
        self.plain_lines.append(line)
        if self._max is not None and len(self.plain_lines) > self._max:
            del self.plain_lines[: len(self.plain_lines) - self._max]
        self.write(Text(line, no_wrap=False, overflow="fold"))

    def write_lines(self, lines: Iterable[str]) -> None:
        for line in lines:
            self.write_line(line)

    def clear(self) -> OutputLog:
        self.plain_lines = []
        super().clear()
        return self
