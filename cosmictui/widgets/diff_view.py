"""A unified diff, coloured but keeping the +/- markers so it reads without colour."""

from __future__ import annotations

import os
from collections.abc import Iterable

from rich.text import Text
from textual.widgets import Static


def render_diff(lines: Iterable[str]) -> Text:
    """Style a unified diff line by line."""
    text = Text(no_wrap=False, overflow="fold")
    for line in lines:
        line = line.rstrip("\n")
        if line.startswith(("+++ ", "--- ")):
            # The full path is shown above the diff; here the file name says enough.
            marker, _, rest = line.partition(" ")
            path, sep, tail = rest.partition(" (")
            line = f"{marker} {os.path.basename(path)}{sep}{tail}"
            style = "bold"
        elif line.startswith("@@"):
            style = "cyan"
        elif line.startswith("+"):
            style = "bold green"
        elif line.startswith("-"):
            style = "red"
        else:
            style = "dim"
        text.append(line + "\n", style=style)
    return text


class DiffView(Static):
    """Shows a planned change to a file before it is written."""

    DEFAULT_CLASSES = "diff-view"

    def clear(self) -> None:
        self.remove_class("-shown")
        self.update("")

    def show_diff(self, diff: str | Iterable[str]) -> None:
        self.add_class("-shown")
        lines = diff.splitlines() if isinstance(diff, str) else list(diff)
        if not lines:
            self.update(Text("No change: the file already has this value.", style="italic"))
        else:
            self.update(render_diff(lines))
