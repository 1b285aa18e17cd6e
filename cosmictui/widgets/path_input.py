"""An input for a filesystem path that shows the whole path while it is not being edited.

A one-line input cuts a long path at the field's width (at 60 columns the storage directory lost
its last part, the one that tells relays apart). Without the focus the path wraps over as many
lines as it needs, broken after a `/` where it can; with the focus it is the usual one-line
input that edits the full value.
"""

from __future__ import annotations

from rich.cells import cell_len
from rich.text import Text
from textual.events import Blur, Focus
from textual.geometry import Region, Size
from textual.strip import Strip
from textual.widgets import Input


def wrap_path(path: str, width: int) -> list[str]:
    """`path` in lines of at most `width` characters, each broken after a `/` when one is in its
    last two thirds (so directory names stay whole), else at the width."""
    if width <= 0 or len(path) <= width:
        return [path]
    lines: list[str] = []
    rest = path
    while len(rest) > width:
        cut = rest.rfind("/", 0, width)
        cut = cut + 1 if cut >= width // 3 else width
        lines.append(rest[:cut])
        rest = rest[cut:]
    if rest:
        lines.append(rest)
    return lines


class PathInput(Input):
    """A compact `Input` whose value, unfocused, wraps instead of being cut at the field's edge."""

    def _lines(self) -> list[str] | None:
        """The wrapped lines shown without the focus; None when the one-line input shows it all."""
        width = self.scrollable_content_region.width
        if self.has_focus or not self.value or self.password or width <= 0:
            return None
        lines = wrap_path(self.value, width)
        return lines if len(lines) > 1 else None

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        if self.has_focus or not self.value or self.password:
            return 1
        return len(wrap_path(self.value, width))

    def render_line(self, y: int) -> Strip:
        lines = self._lines()
        if lines is None:
            return super().render_line(y)
        width = self.scrollable_content_region.width
        if y >= len(lines):
            return Strip.blank(width, self.rich_style)
        text = Text(lines[y], no_wrap=True, overflow="ignore", end="")
        segments = list(self.app.console.render(text, self.app.console_options.update_width(width)))
        return Strip(segments).extend_cell_length(width).apply_style(self.rich_style)

    def _watch_value(self, value: str) -> None:
        super()._watch_value(value)
        if not self.has_focus:
            self.refresh(layout=True)  # a path set from outside may need more or fewer lines

    def _on_focus(self, event: Focus) -> None:
        super()._on_focus(event)
        self.refresh(layout=True)  # back to one editable line, scrolled to the cursor once laid out
        self.call_after_refresh(self._show_cursor)

    def _show_cursor(self) -> None:
        x = cell_len(self.value[: self.cursor_position])
        self.scroll_to_region(Region(x, 0, 1, 1), force=True, animate=False)

    def _on_blur(self, event: Blur) -> None:
        super()._on_blur(event)
        self.scroll_to(0, animate=False)
        self.refresh(layout=True)  # the whole path again
