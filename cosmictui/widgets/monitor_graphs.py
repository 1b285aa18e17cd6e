"""Time-series plots with real axes for the monitor (textual-plotext).

Chosen over Textual's Sparkline after looking at both at 80×24: a sparkline shows a shape but
no scale, and "is memory near the 200 MB budget?" needs a y axis with numbers and the budget
drawn on it. Colours come from the Textual theme's own accents so both light and dark read
well, and every line has a legend word, so nothing depends on colour alone.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from textual.app import RenderResult
from textual.color import Color
from textual_plotext import PlotextPlot

ColorName = str  # a role below, or a Textual theme variable

# Line colours by role, picked for contrast on each theme's background (checked in tmux and in
# the snapshot SVGs); every line also has a legend word, so none of this is the only signal.
PALETTE = {
    True: {"in": "#4FC3F7", "out": "#FFB74D", "relayed": "#81C784", "cpu": "#CE93D8", "rss": "#4FC3F7"},
    False: {"in": "#0D47A1", "out": "#BF360C", "relayed": "#1B5E20", "cpu": "#6A1B9A", "rss": "#0D47A1"},
}


# Line markers by role, so the legend tells in from out without colour (plotext draws the marker
# as the legend's glyph): fine braille for in, dots for out, half blocks for relayed.
MARKERS = {"out": "dot", "relayed": "hd"}


@dataclass(frozen=True)
class Series:
    label: str
    points: Sequence[tuple[float, float]]
    """(unix time, value)"""
    color: ColorName = "in"


RATE_UNITS = ((1e9, "GB/s"), (1e6, "MB/s"), (1e3, "KB/s"), (1.0, "B/s"))
COUNT_UNITS = ((1e6, "M/s"), (1e3, "k/s"), (1.0, "/s"))


def pick_unit(peak: float, units: Iterable[tuple[float, str]]) -> tuple[float, str]:
    """The largest unit the peak reaches, so tick labels stay short."""
    units = list(units)
    for scale, name in units:
        if peak >= scale:
            return scale, name
    return units[-1]


class TimePlot(PlotextPlot):
    """Last `window` seconds of one or more series; x is seconds before now, y is `unit`."""

    DEFAULT_CSS = """
    TimePlot { height: 1fr; width: 1fr; min-height: 6; }
    """

    def __init__(
        self,
        title: str,
        *,
        unit: str = "",
        units: Sequence[tuple[float, str]] | None = None,
        window: float = 120.0,
        floor: float = 1.0,
        limit: float | None = None,
        limit_label: str = "",
        id: str | None = None,
        classes: str | None = None,
    ) -> None:
        super().__init__(id=id, classes=classes)
        self.title = title
        self.unit = unit
        self.units = units
        self.window = window
        self.floor = floor
        self.limit = limit
        self.limit_label = limit_label
        self.series: list[Series] = []
        self.now: float | None = None
        self._version = 0
        self._cached: tuple[object, RenderResult] | None = None

    def show(self, series: list[Series], now: float | None = None) -> None:
        self.series = series
        self.now = now
        self.replot()

    def _rgb(self, name: ColorName) -> tuple[int, int, int]:
        value = PALETTE[self.app.current_theme.dark].get(name) or self.app.theme_variables.get(name) or "#0178D4"
        return Color.parse(value).rgb

    def replot(self) -> None:
        plt = self.plt
        plt.clear_data()
        plt.clear_figure()
        now = self.now if self.now is not None else time.time()
        window = self.window
        visible = [[(t - now, v) for t, v in s.points if now - t <= window] for s in self.series]
        peak = max((v for pts in visible for _, v in pts), default=0.0)
        scale, unit = pick_unit(max(peak, self.floor), self.units) if self.units else (1.0, self.unit)
        top = max(peak / scale, self.floor / scale)
        if self.limit is not None and top <= self.limit / scale:
            # under the budget: the axis ends just above it, so the line sits where it belongs
            limit = self.limit / scale
            step = nice_step(limit / 2)
            ticks_y = [step * i for i in range(math.floor(limit / step) + 1)]
            top = limit * 1.12
        else:
            step = nice_step(top / 3)
            ticks_y = [step * i for i in range(math.ceil(top * 1.05 / step) + 1)]
            top = ticks_y[-1]
        plt.title(f"{self.title} ({unit})" if unit else self.title)
        for s, pts in zip(self.series, visible, strict=True):
            if not pts:
                continue
            xs = [x for x, _ in pts]
            ys = [v / scale for _, v in pts]
            label = s.label if len(self.series) > 1 else None  # one line: the title names it
            plt.plot(xs, ys, label=label, color=self._rgb(s.color), marker=MARKERS.get(s.color, "braille"))
        if not any(visible):  # no data yet: the axes still show the scale
            plt.hline(0, color=self._rgb("foreground"))
            plt.text("no data yet", x=-window / 2, y=top / 2, alignment="center", color=self._rgb("foreground"))
        if self.limit is not None:
            plt.hline(self.limit / scale, color=self._rgb("error"))
            plt.text(
                self.limit_label, x=-window * 0.98, y=self.limit / scale, color=self._rgb("error"), alignment="left"
            )
        plt.xlim(-window, 0)
        plt.ylim(0, top)
        ticks = [-window, -window * 2 / 3, -window / 3, 0]
        plt.xticks(ticks, [_ago(t) for t in ticks])
        plt.yticks(ticks_y, [_num(v) for v in ticks_y])
        self._version += 1
        self.refresh()

    def render(self) -> RenderResult:
        """plotext's build is the monitor's most expensive step: do it once per new data, size
        or theme, not on every repaint (a layout pass elsewhere repaints every widget)."""
        key = (self._version, self.size, self.app.theme)
        if self._cached is None or self._cached[0] != key:
            self._cached = (key, super().render())
        return self._cached[1]


def nice_step(raw: float) -> float:
    """1, 2 or 5 times a power of ten, at least `raw`: tick labels a person reads at a glance."""
    if raw <= 0:
        return 1.0
    exp = math.floor(math.log10(raw))
    base = 10.0**exp
    for m in (1, 2, 5, 10):
        if m * base >= raw:
            return m * base
    return 10 * base


def _num(v: float) -> str:
    return f"{v:g}" if v < 1000 else f"{v:.0f}"


def _ago(seconds: float) -> str:
    s = round(-seconds)
    if s == 0:
        return "now"
    if s % 60 == 0 and s >= 120:
        return f"-{s // 60}m"
    return f"-{s}s"
