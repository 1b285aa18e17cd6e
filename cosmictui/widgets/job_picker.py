"""A list of jobs to select, with the selection in a glyph ("[x]" / "[ ]"), not in colour alone."""

from __future__ import annotations

from rich.segment import Segment
from textual.strip import Strip
from textual.widgets import SelectionList
from textual.widgets.option_list import OptionDoesNotExist


class JobPicker(SelectionList[str]):
    """SelectionList whose toggle reads `[x]` when selected and `[ ]` when not.

    The stock toggle draws the same `▐X▌` both ways and tells them apart by colour only, which
    a monochrome terminal, a screen reader's text or a colour-blind operator cannot see.

    Space toggles at once: the stock list toggles through a message queued behind the keys
    already typed, so a `d` typed right after it read the selection from before the space.
    """

    def action_select(self) -> None:
        self._toggle_highlighted_selection()

    def render_line(self, y: int) -> Strip:
        line = super().render_line(y)
        segments = list(line)
        try:
            selection = self.get_option_at_index(self.scroll_offset.y + y)
        except OptionDoesNotExist:
            return line
        if len(segments) < 3:
            return line
        left, inner, right = segments[:3]
        mark = "x" if selection.value in self.selected else " "
        return Strip(
            [Segment("[", left.style), Segment(mark, inner.style), Segment("]", right.style), *segments[3:]],
            line.cell_length,
        )
