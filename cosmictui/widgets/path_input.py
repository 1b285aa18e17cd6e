"""An input for a filesystem path that, while it is not being edited, keeps the path's end in view.

A one-line input cuts a long path at the field's width, so at 60 columns the storage directory
lost its last part, the one that tells relays apart. Without the focus the middle gives way to
`…` (the start and the last directory stay); with the focus it is the usual input that edits the
full value, opened at the cursor. One line either way: step 2's proof rows above the field keep
their room at 60×20.
"""

from __future__ import annotations

from rich.cells import cell_len
from rich.text import Text
from textual.events import Blur, Focus
from textual.geometry import Region
from textual.strip import Strip
from textual.widgets import Input


def elide_path(path: str, width: int) -> str:
    """`path` in at most `width` characters: its start, `…`, and its end from a `/`: the most
    directories that fit in half the width, else the last directory whole when four characters
    of the start still fit, else as much of its end as leaves those four."""
    if len(path) <= width:
        return path
    if width < 8:
        return "…" + path[len(path) - width + 1 :] if width > 1 else "…"
    room = width - 1
    fits = [len(path) - i for i, c in enumerate(path) if c == "/" and len(path) - i <= room - 4]
    half = [n for n in fits if n <= room // 2]
    keep = max(half) if half else min(fits) if fits else room - 4
    return path[: room - keep] + "…" + path[len(path) - keep :]


class PathInput(Input):
    """A compact `Input` whose value, unfocused and too long, shows its start and end around `…`."""

    def _elided(self) -> str | None:
        """The line shown without the focus; None when the plain input shows the path whole."""
        width = self.scrollable_content_region.width
        if self.has_focus or not self.value or self.password or width <= 0 or cell_len(self.value) <= width:
            return None
        return elide_path(self.value, width)

    def render_line(self, y: int) -> Strip:
        line = self._elided()
        if line is None or y != 0:
            return super().render_line(y)
        width = self.scrollable_content_region.width
        text = Text(line, no_wrap=True, overflow="ignore", end="")
        segments = list(self.app.console.render(text, self.app.console_options.update_width(width)))
        return Strip(segments).extend_cell_length(width + 1).apply_style(self.rich_style)

    def _on_focus(self, event: Focus) -> None:
        super()._on_focus(event)
        self.refresh()
        self.call_after_refresh(self._show_cursor)  # the whole value, opened where the cursor is

    def _show_cursor(self) -> None:
        x = cell_len(self.value[: self.cursor_position])
        self.scroll_to_region(Region(x, 0, 1, 1), force=True, animate=False)

    def _on_blur(self, event: Blur) -> None:
        super()._on_blur(event)
        self.refresh()
